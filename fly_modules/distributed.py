"""Router statistics across ``torch.distributed`` processes.

The router's statistics are sums, so data-parallel training combines them exactly:

* :func:`all_reduce_statistics` sums whole routers that each accumulated a *disjoint* part of the
  data (a shard each), once; afterwards every process holds the union.
* :func:`all_gather_update` keeps the routers of all processes identical during training: each step
  gathers the processes' feature batches and every process adds the whole global batch (what
  ``router.update`` does when ``router.process_group`` is set).
* :func:`gather_rows` concatenates every process's rows, sizes may differ.

See ``docs/router.md`` ("Distributed training") for costs and the gloo shutdown note. The router calls
:func:`all_gather_update` itself when its ``process_group`` is set; this module does not import it (the
functions take any :class:`~fly_modules.AnalyticRouter`).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from . import _collectives
from ._collectives import gather_rows

__all__ = ["all_reduce_statistics", "all_gather_update", "gather_rows"]


@torch.no_grad()
def all_reduce_statistics(router: nn.Module, group: Optional[Any] = None) -> nn.Module:
    """Sum ``G``, ``Q`` and the counts of an :class:`~fly_modules.AnalyticRouter` over all processes, in
    place (its pending rows folded first); returns ``router``.

    Processes may hold different numbers of experts; every router first grows to the largest.
    """
    _collectives.require_initialized("all_reduce_statistics")
    router.flush()
    router._grow_to(_collectives.all_reduce_max(router.num_experts, router.device, group))
    _collectives.all_reduce_sum_((router.gram, router.cross, router.counts), group)
    router._mark_stale()
    return router


@torch.no_grad()
def all_gather_update(
    router: nn.Module, features: Tensor, expert_ids: Union[int, Tensor], group: Optional[Any] = None
) -> None:
    """``router.update`` of an :class:`~fly_modules.AnalyticRouter` with the concatenation (in rank order)
    of every process's batch.

    Batches may differ in size between processes (the last batch of a shard, or an empty share).
    Setting ``router.process_group`` makes every ``router.update`` do this.
    """
    _collectives.require_initialized("all_gather_update")
    # Every process validates its own share and they agree before gathering: a bad batch on one
    # process raises on all of them (instead of leaving the others blocked in the gather).
    error: Optional[Exception] = None
    try:
        features, ids = router._check_batch(features, expert_ids, caller="all_gather_update", allow_empty=True)
    except (TypeError, ValueError) as caught:
        error = caught
    # One verdict for both questions: did every process accept its batch, and is any batch float64
    # (then all gather float64; otherwise float32, which holds float16/bfloat16 exactly).
    single = error is None and features.dtype != torch.float64
    accepted, all_single = _collectives.all_reduce_min([int(error is None), int(single)], router.device, group)
    if error is not None:
        raise error
    if not accepted:
        raise RuntimeError("all_gather_update: another process rejected its batch (see its error); nothing was added")
    features = features.to(torch.float32 if all_single else torch.float64)
    router._accumulate(_collectives.gather_rows(features, group), _collectives.gather_rows(ids, group))
