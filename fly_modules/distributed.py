"""Router statistics across ``torch.distributed`` processes.

The router's statistics are sums, so data-parallel training can combine them exactly. Two ways:

* :func:`all_reduce_statistics` sums whole routers that each accumulated a *disjoint* part of the
  data (e.g. a shard each); afterwards every process holds the union. Call it once for those data:
  calling it again would count them again.
* :func:`all_gather_update` keeps the routers of all processes identical during training: each step
  gathers the processes' feature batches (``B x d`` numbers, not ``M x M``) and every process adds
  the whole global batch. At M = 10,000 this moves about 4,000 times less data per step than
  all-reducing ``G`` before a solve, and there is never anything to double count.

.. note::
    On torch releases before the fix in pytorch/pytorch#154976 ("Release GIL in PG destructor",
    June 2025), ``dist.destroy_process_group()`` on a gloo group can deadlock when a gloo worker thread
    still holds the last reference to a tensor of a finished collective. Seen here with torch 2.5.1
    after :func:`all_gather_update`: 11 hangs in 21 two-process runs, none in 16 with a
    ``dist.barrier()`` just before ``destroy_process_group()``. Newer torch does not need the barrier.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from ._validation import check_expert_ids, check_features
from .router import AnalyticRouter

__all__ = ["all_reduce_statistics", "all_gather_update", "gather_rows"]


def _require_initialized(owner: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{owner}: torch.distributed is not initialised (call dist.init_process_group first)")


@torch.no_grad()
def all_reduce_statistics(router: AnalyticRouter, group: Optional[dist.ProcessGroup] = None) -> AnalyticRouter:
    """Sum ``G``, ``Q`` and the counts over all processes, in place; returns ``router``.

    Processes may hold different numbers of experts; every router first grows to the largest.
    """
    _require_initialized("all_reduce_statistics")
    experts = torch.tensor([router.num_experts], device=router.gram.device)
    dist.all_reduce(experts, op=dist.ReduceOp.MAX, group=group)
    router._grow_to(int(experts))
    for tensor in (router.gram, router.cross, router.counts):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    router._mark_stale()
    return router


def gather_rows(tensor: Tensor, group: Optional[dist.ProcessGroup] = None) -> Tensor:
    """Concatenate (in rank order) every process's ``tensor`` along dim 0; sizes may differ, even be 0."""
    _require_initialized("gather_rows")
    world = dist.get_world_size(group)
    size = torch.tensor([tensor.shape[0]], device=tensor.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    counts = [int(s) for s in sizes]
    padded = tensor.new_zeros(max(counts), *tensor.shape[1:])
    padded[: tensor.shape[0]] = tensor
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    return torch.cat([g[:n] for g, n in zip(gathered, counts)])


@torch.no_grad()
def all_gather_update(
    router: AnalyticRouter,
    features: Tensor,
    expert_ids: Union[int, Tensor],
    group: Optional[dist.ProcessGroup] = None,
) -> None:
    """``router.update`` with the concatenation (in rank order) of every process's batch.

    Batches may differ in size between processes (the last batch of a shard, or an empty share).
    Setting ``router.process_group`` makes every ``router.update`` do this.
    """
    _require_initialized("all_gather_update")
    # Every process validates its own batch and they agree before gathering: a bad batch on one
    # process raises on all of them (instead of leaving the others blocked in the gather).
    error: Optional[Exception] = None
    try:
        features = _check_share(router, features)
        ids = check_expert_ids(
            expert_ids, features.shape[0], router.num_experts, owner="all_gather_update", device=router.gram.device
        )
    except (TypeError, ValueError) as caught:
        error = caught
    verdict = torch.tensor([0 if error is not None else 1], device=router.gram.device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN, group=group)
    if error is not None:
        raise error
    if not int(verdict):
        raise RuntimeError("all_gather_update: another process rejected its batch (see its error); nothing was added")
    router._update_local(gather_rows(features, group), gather_rows(ids, group))


def _check_share(router: AnalyticRouter, features: Tensor) -> Tensor:
    """This process's share of a step, cast to the statistics dtype (so every process gathers the same
    dtype); unlike ``update``, an empty share is allowed."""
    if isinstance(features, Tensor) and features.ndim == 2 and features.shape[0] == 0:
        if features.shape[1] != router.in_features:
            raise ValueError(
                f"all_gather_update: features have {features.shape[1]} columns, expected {router.in_features}"
            )
    else:
        check_features(features, router.in_features, owner="all_gather_update", device=router.gram.device)
    return features.to(device=router.gram.device, dtype=router.stats_dtype)
