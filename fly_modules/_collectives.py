"""The few ``torch.distributed`` collectives the core needs (private).

Nothing here knows about routers or ensembles; the router imports this module, never the reverse.
Every function requires an initialised process group and is called by every process of ``group``.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "require_initialized", "gather_rows", "gather_header", "gather_padded", "all_reduce_max",
    "all_reduce_sum_", "communication_device",
]


def require_initialized(caller: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{caller}: torch.distributed is not initialised (call dist.init_process_group first)")


def gather_rows(tensor: Tensor, group: Optional[Any] = None) -> Tensor:
    """Concatenate (in rank order) every process's ``tensor`` along dim 0; sizes may differ, even be 0."""
    require_initialized("gather_rows")
    counts = gather_header([tensor.shape[0]], tensor.device, group)[:, 0].tolist()
    return gather_padded(tensor, counts, group)


def gather_header(values: List[int], device: torch.device, group: Optional[Any] = None) -> Tensor:
    """``(world, len(values))``: every process's ``values`` (a few ints), in rank order (one collective)."""
    mine = torch.tensor(values, dtype=torch.long, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    return torch.stack(everyone).cpu()


def gather_padded(tensor: Tensor, counts: List[int], group: Optional[Any] = None) -> Tensor:
    """Concatenate (in rank order) every process's ``tensor``, process ``r`` holding ``counts[r]`` rows (known
    from a header already exchanged): one all-gather of the rows padded to the largest count."""
    padded = tensor.new_zeros(max(counts), *tensor.shape[1:])
    padded[: tensor.shape[0]] = tensor
    gathered = [torch.empty_like(padded) for _ in range(len(counts))]
    dist.all_gather(gathered, padded, group=group)
    return torch.cat([g[:n] for g, n in zip(gathered, counts)])


def communication_device(group: Optional[Any] = None) -> torch.device:
    """Where a small tensor must live to be sent through ``group``: NCCL sends CUDA tensors only."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")


def all_reduce_max(value: int, device: torch.device, group: Optional[Any] = None) -> int:
    """The largest of the processes' ``value``."""
    largest = torch.tensor([value], device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
    return int(largest)


def all_reduce_sum_(tensors: Iterable[Tensor], group: Optional[Any] = None) -> None:
    """Sum each tensor over the processes, in place (collectives do not bump autograd's version counters)."""
    for tensor in tensors:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
