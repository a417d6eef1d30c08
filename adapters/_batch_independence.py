"""Batch independence: at inference each sample's output must not depend on the other samples of its
batch. The router decides per sample; an assembly that mixes samples hands a sample its neighbours'
prompts, which no forced-expert comparison of a whole batch can see.

:func:`batch_independence` is the one check, shared by ``verify()`` and ``python -m benchmarks.upstream``:
it compares a batch's outputs with those of each sample run alone, (1) with the samples routed to mixed
experts ``[0, 1, ..., E-1, 0, 1, ...]``, (2) with one expert for the whole batch, or, without a router,
(3) with the model's own selection.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Mapping, Optional

import torch
from torch import Tensor

__all__ = ["HINT", "BatchCheck", "batch_independence", "batch_size", "take_rows", "tolerance"]

#: ``evaluate(rows, experts)``: inference outputs ``(n, C)`` of the samples ``rows`` ``(n,)`` of the batch,
#: run together as one batch, each routed to ``experts`` ``(n,)`` (``None``: the model's own selection).
Evaluate = Callable[[Tensor, Optional[Tensor]], Tensor]

HINT = "; for the JH-LEE prefix E-prompt lineage retrofit with correct_assembly=True (docs/adapters.md)"
MIXED = "batch independence, mixed experts"
ONE_EXPERT = "batch independence, one expert"
OWN = "batch independence"


@dataclasses.dataclass(frozen=True)
class BatchCheck:
    name: str
    ok: Optional[bool]
    detail: str


def tolerance(reference: Tensor) -> float:
    """Float rounding scaled to the outputs: ``2**10`` units of the dtype's epsilon times the largest finite
    magnitude (at least 1). Kernels differ between a batch and a single sample by a few units; a mixed
    prompt moves the logits by whole units."""
    finite = reference[torch.isfinite(reference)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    eps = torch.finfo(reference.dtype).eps if reference.is_floating_point() else 0.0
    return 2.0 ** 10 * eps * scale


def _gap(together: Tensor, alone: Tensor) -> Optional[float]:
    """Largest difference of the finite entries; ``None`` when shapes or the non-finite pattern differ."""
    if together.shape != alone.shape or not torch.equal(torch.isfinite(together), torch.isfinite(alone)):
        return None
    finite = torch.isfinite(together)
    if not bool(finite.any()):
        return 0.0
    return float((together[finite].double() - alone[finite].double()).abs().max())


def _compare(name: str, evaluate: Evaluate, rows: Tensor, experts: Optional[Tensor], what: str,
             hint: str) -> BatchCheck:
    together = evaluate(rows, experts).detach()
    alone = torch.cat([
        evaluate(rows[i:i + 1], None if experts is None else experts[i:i + 1]).detach().reshape(1, *together.shape[1:])
        for i in range(rows.numel())
    ])
    gap, tol = _gap(together, alone), tolerance(together)
    if gap is not None and gap <= tol:
        return BatchCheck(name, True, f"{what}: each of the {rows.numel()} samples gets the output it gets alone "
                                      f"(max |difference| {gap:.2g}, tolerance {tol:.2g})")
    found = "their shapes or infinite entries differ" if gap is None else f"max |difference| {gap:.3g} > {tol:.2g}"
    return BatchCheck(name, False, (
        f"{what}: the samples' outputs in the batch differ from those of each sample alone ({found}): a sample's "
        f"prompt depends on the other samples of its batch{hint}"
    ))


def batch_independence(evaluate: Evaluate, size: int, num_experts: Optional[int], hint: str = HINT) -> List[BatchCheck]:
    """The checks of a batch of ``size`` samples (``num_experts`` ``None``: no router); ``hint`` ends a failure."""
    if size < 2:
        why = "the batch holds one sample; pass at least two"
        return [BatchCheck(MIXED if num_experts else OWN, None, why)]
    rows = torch.arange(size)
    if num_experts is None:
        return [_compare(OWN, evaluate, rows, None, "the model's own selection", hint)]
    checks = []
    if num_experts > 1:
        mixed = rows % num_experts
        shown = ", ".join(str(e) for e in mixed[:6].tolist()) + (", ..." if size > 6 else "")
        checks.append(_compare(MIXED, evaluate, rows, mixed, f"experts [{shown}] forced", hint))
    else:
        checks.append(BatchCheck(MIXED, None, "one expert only"))
    checks.append(_compare(ONE_EXPERT, evaluate, rows, torch.zeros_like(rows), "expert 0 forced for the batch", hint))
    return checks


def batch_size(batch: Any) -> Optional[int]:
    """Samples in ``batch``: the first dimension of its first tensor (tensors, sequences, mappings)."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.ndim > 0 else None
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    for value in values:
        size = batch_size(value)
        if size is not None:
            return size
    return None


def take_rows(batch: Any, rows: Tensor, size: int) -> Any:
    """The samples ``rows`` of ``batch``: every tensor whose first dimension is ``size`` is indexed."""
    if isinstance(batch, Tensor):
        return batch[rows.to(batch.device)] if batch.ndim > 0 and batch.shape[0] == size else batch
    if isinstance(batch, Mapping):
        return type(batch)({k: take_rows(v, rows, size) for k, v in batch.items()})
    if isinstance(batch, (tuple, list)):
        return type(batch)(take_rows(v, rows, size) for v in batch)
    return batch
