"""Routed calls per expert group: the samples of a batch grouped by routed expert, one call per group
(never one per sample), the outputs put back in batch order."""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple

import torch
from torch import Tensor

__all__ = ["expert_groups", "merge_groups"]


def expert_groups(experts: Tensor) -> Iterator[Tuple[int, Tensor]]:
    """``(expert, rows)`` for each expert present in ``experts`` ``(B,)``, in increasing order."""
    for expert in torch.unique(experts).tolist():
        yield int(expert), (experts == expert).nonzero().squeeze(1)


def merge_groups(parts: List[Any], rows: List[Tensor]) -> Any:
    """Put per-group outputs (tensors, tuples, lists, dicts of them) back in batch order.

    ``rows[g]`` holds the batch positions of group ``g``. A tensor whose first dimension is not its
    group's size is taken as a squeezed batch dimension of a one-sample group (``x[idx].squeeze()``
    in the upstream code); anything that is not a tensor is taken from the last group.
    """
    first = parts[0]
    if isinstance(first, Tensor):
        shaped = []
        for part, index in zip(parts, rows):
            if part.ndim == 0 or part.shape[0] != index.numel():
                if index.numel() != 1:
                    raise ValueError(
                        f"cannot merge a per-group output of shape {tuple(part.shape)} for a group of {index.numel()} samples"
                    )
                part = part.unsqueeze(0)
            shaped.append(part)
        order = torch.cat(rows).to(first.device)
        return torch.cat(shaped)[torch.argsort(order)]
    if isinstance(first, (tuple, list)):
        merged = [merge_groups([p[i] for p in parts], rows) for i in range(len(first))]
        return type(first)(merged) if isinstance(first, list) else tuple(merged)
    if isinstance(first, dict):
        return {key: merge_groups([p[key] for p in parts], rows) for key in first}
    return parts[-1]
