"""The few ``torch.distributed`` collectives the core needs (private).

Nothing here knows about routers or ensembles; the router imports this module, never the reverse.
Every function requires an initialised process group and is called by every process of ``group``.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["require_initialized", "gather_rows", "all_reduce_min", "all_reduce_max", "all_reduce_sum_"]


def require_initialized(caller: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{caller}: torch.distributed is not initialised (call dist.init_process_group first)")


def gather_rows(tensor: Tensor, group: Optional[Any] = None) -> Tensor:
    """Concatenate (in rank order) every process's ``tensor`` along dim 0; sizes may differ, even be 0."""
    require_initialized("gather_rows")
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


def all_reduce_min(values: List[int], device: torch.device, group: Optional[Any] = None) -> List[int]:
    """The element-wise minimum of the processes' ``values`` (one collective for several verdicts)."""
    smallest = torch.tensor(values, device=device)
    dist.all_reduce(smallest, op=dist.ReduceOp.MIN, group=group)
    return smallest.tolist()


def all_reduce_max(value: int, device: torch.device, group: Optional[Any] = None) -> int:
    """The largest of the processes' ``value``."""
    largest = torch.tensor([value], device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
    return int(largest)


def all_reduce_sum_(tensors: Iterable[Tensor], group: Optional[Any] = None) -> None:
    """Sum each tensor over the processes, in place (collectives do not bump autograd's version counters)."""
    for tensor in tensors:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
