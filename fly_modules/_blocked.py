"""The analytic router's blocked statistics update (private): expanded rows wait in a bounded buffer and
are folded into ``G`` and ``Q`` together, in one rank-k update.

Adding one batch, ``G += phi^T phi`` streams the whole ``M x M`` matrix through memory for ``2 B M^2``
flops: at batch 64 that is ~8 flops per float64 read and written, so on a GPU the update is bound by
memory bandwidth. Folding ``k`` buffered rows at once does the same flops with one pass over ``G``
instead of ``k / B``. The sums are those of the per-batch update, in another order (``docs/router.md``,
"Blocked updates").
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _ridge

__all__ = ["FOLD_ROWS", "MIN_FOLD_ROWS", "default_fold_rows", "PendingRows"]

# Rows folded at once, per device type. A fold of k rows does ~k/8 flops per byte of G moved; these
# make it compute-bound with room to spare (k/8 = 64 on the CPU, 128 on a GPU). On a 2-core AMD EPYC,
# folds of 512 and 1,024 rows cost the same per row (a CPU is compute-bound from far fewer rows).
FOLD_ROWS = {"cpu": 512, "cuda": 1024}
MIN_FOLD_ROWS = 64


def default_fold_rows(width: int, device: torch.device) -> int:
    """Buffer rows for an expansion of width ``M`` on ``device``: ``min(FOLD_ROWS[device], max(64, M // 8))``.

    The buffer then holds at most ``max(64 M, M^2 / 8)`` numbers: an eighth of ``G`` once ``M >= 512``
    (39 MiB beside ``G``'s 763 MiB at ``M = 10,000`` on the CPU, 5 %).
    """
    return min(FOLD_ROWS.get(device.type, FOLD_ROWS["cpu"]), max(MIN_FOLD_ROWS, width // 8))


class PendingRows:
    """Expanded rows and their expert ids not yet added to ``G`` and ``Q``; storage allocated on first use."""

    def __init__(self) -> None:
        self.rows = 0
        self.capacity = 0
        self._phi: Optional[Tensor] = None
        self._ids: Optional[Tensor] = None

    @property
    def nbytes(self) -> int:
        """Bytes of the allocated storage (0 before the first row)."""
        return sum(t.numel() * t.element_size() for t in (self._phi, self._ids) if t is not None)

    def fits(self, count: int) -> bool:
        return self.rows + count <= self.capacity

    def allocate(self, capacity: int, like: Tensor) -> None:
        """Storage for ``capacity`` rows like ``like`` (``(N, M)``); drops the previous one (empty it first)."""
        assert self.rows == 0, "allocate() with rows pending would lose them"
        # Outside inference mode: a buffer created inside it could not be written by a later update outside.
        with torch.inference_mode(False):
            self._phi = torch.empty(capacity, like.shape[1], dtype=like.dtype, device=like.device)
            self._ids = torch.empty(capacity, dtype=torch.long, device=like.device)
        self.capacity = capacity

    def append(self, phi: Tensor, ids: Tensor) -> None:
        start, stop = self.rows, self.rows + phi.shape[0]
        self._phi[start:stop].copy_(phi)
        self._ids[start:stop].copy_(ids)
        self.rows = stop

    def fold_into(self, gram: Tensor, cross: Tensor, panel_rows: Optional[int] = None) -> None:
        """Add the pending rows to ``gram`` (lower triangle) and ``cross``, and empty the buffer."""
        if self.rows:
            add_rows(gram, cross, self._phi[: self.rows], self._ids[: self.rows], panel_rows)
        self.rows = 0

    def discard(self) -> None:
        """Forget the pending rows (the statistics they belonged to were replaced)."""
        self.rows = 0

    def saved(self) -> Tuple[Tensor, Tensor]:
        """Copies of the pending rows and their ids, ``(rows, M)`` and ``(rows,)`` (empty before the first row)."""
        if self._phi is None:
            return torch.zeros(0, 0), torch.zeros(0, dtype=torch.long)
        return self._phi[: self.rows].clone(), self._ids[: self.rows].clone()

    def restore(self, phi: Tensor, ids: Tensor, capacity: int) -> None:
        """Hold ``phi`` and ``ids`` as the pending rows (a checkpoint's), in storage of ``capacity`` rows."""
        self.release()
        if phi.shape[0]:
            self.allocate(max(capacity, phi.shape[0]), phi)
            self.append(phi, ids)

    def release(self) -> None:
        """Free the storage (after a device or dtype change the next row allocates it anew)."""
        self.discard()
        self._phi = self._ids = None
        self.capacity = 0


def add_rows(gram: Tensor, cross: Tensor, phi: Tensor, ids: Tensor, panel_rows: Optional[int] = None) -> None:
    """``G += phi^T phi`` (lower triangle) and ``Q += phi^T onehot(ids)``; the product's precision and default
    panel height by ``_ridge.fold_product_dtype`` (``docs/router.md``, "Fold precision")."""
    product = _ridge.fold_product_dtype(gram, phi)
    _ridge.accumulate_lower_gram(gram, phi, panel_rows or _ridge.fold_panel_rows(product, gram.dtype), product)
    # One-hot GEMM rather than index_add_: half the time on CPU, deterministic on CUDA (no atomics). The
    # one-hot is scattered rather than F.one_hot'ed, which checks the ids' range on the host.
    onehot = phi.new_zeros(phi.shape[0], cross.shape[1]).scatter_(1, ids.unsqueeze(1), 1.0)
    cross.addmm_(phi.t(), onehot)
