"""Data-parallel context of a run: which rows of a global batch this process computes, and the
collectives that make every process end up with what one process computing the whole batch would.

One process (no initialised ``torch.distributed``) is the case every function reduces to: shares are
whole batches and every collective is the identity.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

__all__ = ["BatchShare", "WHOLE_BATCH", "DataParallel"]


@dataclass(frozen=True)
class BatchShare:
    """This process's part of one global batch and the collectives over the processes that share it.

    Attributes:
        group: the ``torch.distributed`` group sharing the batch; ``None`` when this process computes
            the whole batch (one process, or a batch smaller than the number of processes).
        fraction: this process's rows over the global batch's, ``n_local / n_global``. The loss is
            scaled by it before gradients are summed, so a loss term that already is a *global* batch
            mean divides by it.
    """

    group: Optional[Any] = None
    fraction: float = 1.0

    def gather_rows(self, tensor: Tensor) -> Tensor:
        """Every process's rows of ``tensor`` in rank order (``tensor`` itself for a whole batch)."""
        if self.group is None:
            return tensor
        from fly_modules.distributed import gather_rows

        return gather_rows(tensor, self.group)

    def sum(self, tensor: Tensor) -> Tensor:
        """Sum of ``tensor`` (counts or detached sums) over the processes, as a new tensor."""
        if self.group is None:
            return tensor
        import torch.distributed as dist

        total = tensor.clone()
        dist.all_reduce(total, group=self.group)
        return total

    def global_mean(self, values: Tensor) -> Tensor:
        """Mean of ``values`` over the global batch, with the gradient of this process's rows.

        ``values.mean()`` for a whole batch; divide a loss built from such means by ``fraction``.
        """
        if self.group is None:
            return values.mean()
        total = values.sum()
        both = self.sum(torch.stack([total.detach(), total.new_tensor(float(values.numel()))]))
        return (total - total.detach() + both[0]) / both[1]


#: The share of a process that computes whole batches (the default everywhere).
WHOLE_BATCH = BatchShare()


class DataParallel:
    """The processes of a run: ``world`` ranks in ``group`` (``None`` and 1 for a single process).

    Every rank takes every ``world``-th sample of each global batch (the stream is not truncated); a
    global batch smaller than ``world`` is computed whole on every rank, identically.
    """

    def __init__(self, group: Optional[Any] = None, rank: int = 0, world: int = 1) -> None:
        self.group, self.rank, self.world = group, int(rank), int(world)

    @classmethod
    def from_process_group(cls, process_group: Optional[Any] = None) -> "DataParallel":
        """``process_group`` (or the default group) of an initialised ``torch.distributed``; else one process."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        world = dist.get_world_size(process_group)
        if world == 1:
            return cls()
        group = process_group if process_group is not None else dist.group.WORLD
        return cls(group, dist.get_rank(process_group), world)

    def share(self, indices: Tensor) -> Tuple[Tensor, BatchShare]:
        """This rank's rows of the global batch ``indices`` and the share they make."""
        if self.group is None or indices.numel() < self.world:
            return indices, WHOLE_BATCH
        local = indices[self.rank :: self.world]
        return local, BatchShare(self.group, local.numel() / indices.numel())

    def split(self, indices: Tensor) -> Tensor:
        """This rank's part of an evaluation subset (counts are summed with :meth:`sum_counts`)."""
        return indices[self.rank :: self.world]

    def sum_counts(self, counts: Tensor) -> Tensor:
        """Sum of evaluation counts over all ranks."""
        return BatchShare(self.group).sum(counts)

    @staticmethod
    def sum_gradients(parameters: Sequence[nn.Parameter], share: BatchShare) -> None:
        """Sum gradients over the ranks of ``share`` in one flat all-reduce (nothing for a whole batch).

        A parameter that received a gradient on any rank gets one (zeros) on every rank, so optimizers
        skip exactly the same parameters everywhere.
        """
        if share.group is None or not parameters:
            return
        import torch.distributed as dist

        present = torch.tensor([p.grad is not None for p in parameters], dtype=torch.uint8, device=parameters[0].device)
        dist.all_reduce(present, op=dist.ReduceOp.MAX, group=share.group)
        used = [p for p, flag in zip(parameters, present.tolist()) if flag]
        for p in used:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if not used:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in used])
        dist.all_reduce(flat, group=share.group)
        offset = 0
        for p in used:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()


def leave_after(body: Callable[..., None], *args: Any) -> None:
    """End a process spawned by ``torch.multiprocessing.spawn`` after ``body(*args)`` with ``os._exit``: its
    process group is never torn down, since before torch 2.8 gloo's destructor can deadlock on the GIL
    (docs/router.md). ``body`` has written the process's results by then; a failure is printed, then a non-zero
    exit for ``spawn`` to report."""
    try:
        body(*args)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)
