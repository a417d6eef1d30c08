"""``verify``'s checks of the router's query: the features a training forward records for the router are
those it routes on at inference for the same input (a query module run several times per step, recorded
on another call than the routed one, fails), and they tell the samples apart (identical rows for every
sample of a batch of distinct inputs fail). Returned as ``(name, ok, detail)`` for ``_verify`` to report."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["query_checks"]

SAME = "router's training and inference queries match"
VARIES = "router query varies across samples"
#: relative Frobenius gap under which the two queries are the same features (two modes of one computation)
_TOLERANCE = 1e-3

Result = Tuple[str, Optional[bool], str]


def query_checks(handle: Any, run: Callable[..., Tensor], restore: Callable[[], None], batch: Any) -> List[Result]:
    """The two checks; ``run(training)`` calls the model the user's way, ``restore()`` undoes a run."""
    if handle.router is None:
        return [(SAME, None, "router=False"), (VARIES, None, "router=False")]
    record = handle.record
    try:
        record.query = None
        run(True)
        trained = record.query
    finally:
        restore()
    if trained is None:
        missing = "no query was recorded (\"router receives queries\" says why)"
        return [(SAME, None, missing), (VARIES, None, missing)]
    try:
        record.routed_query = None
        with record.forcing(0):
            run(False)
        routed = record.routed_query
    finally:
        restore()
    return [_same(trained, routed, record.query_source), _varies(trained, batch, record.query_source)]


def _same(trained: Tensor, routed: Optional[Tensor], source: str) -> Result:
    if routed is None:
        return SAME, None, "no routed call asked the router at inference: the query it routes on is not observable"
    if routed.shape != trained.shape:
        return SAME, False, (
            f"the router learns {tuple(trained.shape)} queries in training but routes on {tuple(routed.shape)} ones "
            f"at inference: the query comes from another call than the one routed on; name the call with "
            f"query_when=... (generic)"
        )
    trained64, routed64 = trained.double(), routed.to(trained.device).double()
    gap = float((trained64 - routed64).norm() / routed64.norm().clamp_min(torch.finfo(torch.float64).tiny))
    if gap <= _TOLERANCE:
        return SAME, True, (
            f"a training forward and an inference forward of the same batch give the router the same features "
            f"(relative gap {gap:.2g}) from {source}"
        )
    return SAME, False, (
        f"the router learns other features in training than it routes on at inference for the same batch "
        f"(relative gap {gap:.3g}, max |difference| {float((trained64 - routed64).abs().max()):.3g}): {source} runs "
        "several times per step and another call than the routed one is recorded; name the call with "
        "query_when=lambda args, kwargs: ... (generic), or a module that runs once"
    )


def _varies(trained: Tensor, batch: Any, source: str) -> Result:
    rows = trained.reshape(trained.shape[0], -1).double()
    if rows.shape[0] < 2:
        return VARIES, None, "a one-sample batch"
    if _identical_rows(batch):
        return VARIES, None, "the batch's samples are identical"
    spread = float((rows - rows[:1]).abs().max())
    scale = float(rows.abs().max())
    if spread > 1e-6 * max(scale, 1e-30):
        return VARIES, True, f"the {rows.shape[0]} samples give different queries (largest spread {spread:.3g})"
    return VARIES, False, (
        f"every sample of the batch gives the router the same query from {source}: it cannot tell experts "
        "apart (a per-batch vector, a parameter, or a pooled feature); read a per-sample feature, e.g. the "
        "prompt-free class token"
    )


def _identical_rows(batch: Any) -> bool:
    """Whether the batch (its first tensor) holds the same sample in every row (then no query can vary)."""
    if isinstance(batch, (tuple, list)):
        batch = next((item for item in batch if isinstance(item, Tensor)), None)
    if not isinstance(batch, Tensor) or batch.ndim == 0 or batch.shape[0] < 2:
        return False
    return bool(torch.equal(batch, batch[:1].expand_as(batch)))
