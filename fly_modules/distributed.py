"""Router statistics across ``torch.distributed`` processes.

The router's statistics are sums, so data-parallel training combines them exactly:

* :func:`all_reduce_statistics` sums whole routers that each accumulated a *disjoint* part of the
  data (a shard each), once; afterwards every process holds the union.
* :func:`all_gather_update` keeps the routers of all processes identical during training: each step
  gathers the processes' feature batches and every process adds the whole global batch (what
  ``router.update`` does when ``router.process_group`` is set).
* :func:`gather_rows` concatenates every process's rows, sizes may differ.
* :func:`all_reduce_count` sums one int (a global batch size) when no rows are gathered.
* :func:`resolve_process_group` turns a retrofit's ``distributed`` option into a group (or ``None``).

See ``docs/router.md`` ("Distributed training") for costs and the gloo shutdown note. The router calls
:func:`all_gather_update` itself when its ``process_group`` is set; this module does not import it (the
functions take any :class:`~fly_modules.AnalyticRouter`).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from . import _collectives
from ._collectives import gather_rows

__all__ = [
    "all_reduce_statistics", "all_gather_update", "all_reduce_count", "gather_rows", "resolve_process_group",
    "auto_group_appeared", "refuse_parallel_wrapper",
]


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
    router: nn.Module, features: Tensor, expert_ids: Union[int, Tensor], group: Optional[Any] = None, *,
    counted: Optional[int] = None,
) -> int:
    """``router.update`` of an :class:`~fly_modules.AnalyticRouter` with the concatenation (in rank order)
    of every process's batch; returns the sum over the processes of ``counted`` (default: each process's
    rows), the global batch size a sample-budget schedule counts.

    Batches may differ in size between processes (the last batch of a shard, or an empty share).
    Setting ``router.process_group`` makes every ``router.update`` do this. Two collectives: a header of a
    few ints per process (verdict, dtype, rows, ``counted``, the expert id when one id labels the whole
    batch), then the rows; a third gathers the ids when some process labels its rows one by one.
    """
    _collectives.require_initialized("all_gather_update")
    # Every process validates its own share and they agree before gathering: a bad batch on one
    # process raises on all of them (instead of leaving the others blocked in the gather).
    error: Optional[Exception] = None
    try:
        features, ids = router._check_batch(features, expert_ids, caller="all_gather_update", allow_empty=True)
    except (TypeError, ValueError) as caught:
        error = caught
    rows = 0 if error is not None else features.shape[0]
    single = error is None and features.dtype != torch.float64
    one_id = int(expert_ids) if isinstance(expert_ids, int) and error is None else -1
    count = rows if counted is None else int(counted)
    header = _collectives.gather_header([int(error is None), int(single), rows, count, one_id], router.device, group)
    if error is not None:
        raise error
    if not bool(header[:, 0].all()):
        raise RuntimeError("all_gather_update: another process rejected its batch (see its error); nothing was added")
    # float32 holds float16/bfloat16 exactly; any float64 batch makes every process gather float64.
    features = features.to(torch.float32 if bool(header[:, 1].all()) else torch.float64)
    counts = header[:, 2].tolist()
    if bool((header[:, 4] >= 0).all()):  # one id per process: the ids are known without sending them
        ids = torch.repeat_interleave(header[:, 4], header[:, 2]).to(router.device)
    else:
        ids = _collectives.gather_padded(ids, counts, group)
    router._accumulate(_collectives.gather_padded(features, counts, group), ids)
    return int(header[:, 3].sum())


def all_reduce_count(count: int, group: Optional[Any] = None) -> int:
    """The sum of the processes' ``count`` (a global batch size when no rows are gathered)."""
    _collectives.require_initialized("all_reduce_count")
    return int(_collectives.gather_header([int(count)], _collectives.communication_device(group), group).sum())


def resolve_process_group(option: Any, caller: str) -> Optional[Any]:
    """The group a data-parallel retrofit synchronises over: ``"auto"``, the default group when
    ``torch.distributed`` is initialised with more than one process (else ``None``); ``False``, ``None``
    (this process trains alone); a process group, itself (``torch.distributed`` must be initialised)."""
    if option is False:
        return None
    initialised = dist.is_available() and dist.is_initialized()
    if isinstance(option, str) and option == "auto":
        return dist.group.WORLD if initialised and dist.get_world_size() > 1 else None
    if not initialised:
        raise RuntimeError(f"{caller}: distributed= names a process group but torch.distributed is not initialised "
                           "(call dist.init_process_group first, or pass distributed=False)")
    return option


def auto_group_appeared(option: Any, group: Optional[Any]) -> bool:
    """Whether ``"auto"`` found no group when it was resolved but a multi-process one exists now (the model
    was retrofitted before ``dist.init_process_group``)."""
    if group is not None or not (isinstance(option, str) and option == "auto"):
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def refuse_parallel_wrapper(model: nn.Module, caller: str) -> None:
    """A ``DataParallel`` / ``DistributedDataParallel`` wrapper is refused: the seams, hooks and checkpoints
    belong to the model it wraps (and a replica of ``DataParallel`` runs without the hooks' state)."""
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        raise TypeError(
            f"{caller}: got a {type(model).__name__} wrapper; retrofit the model it wraps (pass wrapped.module, or "
            "retrofit before wrapping) and keep training the wrapper"
        )
