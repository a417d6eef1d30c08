"""Routed calls per expert group: the samples of a batch grouped by routed expert, one call per group
(never one per sample), the outputs put back in batch order; and, for a method that mixes a whole pool
softly, the pool's slots each sample's routed expert owns (:func:`expert_slot_mask`)."""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple

import torch
from torch import Tensor

from fly_modules._validation import InvalidParameterError

__all__ = ["expert_groups", "expert_slot_mask", "merge_groups"]


def expert_groups(experts: Tensor) -> Iterator[Tuple[int, Tensor]]:
    """``(expert, rows)`` for each expert present in ``experts`` ``(B,)``, in increasing order."""
    for expert in torch.unique(experts).tolist():
        yield int(expert), (experts == expert).nonzero().squeeze(1)


def expert_slot_mask(experts: Tensor, expert_of_slot: Tensor) -> Tensor:
    """``(B, P)`` bool: ``True`` where slot ``p`` of a pool belongs to sample ``b``'s routed expert.

    Args:
        experts: ``(B,)`` routed expert ids (what a routed call receives).
        expert_of_slot: ``(P,)`` the expert owning each slot of the pool (``torch.arange(P) // slots_per_expert``
            for a pool grown by the same number of slots per task).

    A soft, weighted prompt mixture (CODA-Prompt's components) is restricted to the routed expert by
    ``weights * mask`` (or ``scores.masked_fill(~mask, float("-inf"))`` before a softmax), so that each
    sample mixes only its expert's slots; a sample whose expert owns no slot gets an all-``False`` row.
    """
    if experts.ndim != 1 or expert_of_slot.ndim != 1:
        raise InvalidParameterError(
            f"expert_slot_mask: expected (B,) experts and (P,) expert_of_slot, got shapes {tuple(experts.shape)} and "
            f"{tuple(expert_of_slot.shape)}"
        )
    owners = expert_of_slot.to(device=experts.device, dtype=torch.long)
    return owners.unsqueeze(0) == experts.long().unsqueeze(1)


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
