"""Warm solves of the analytic router's ridge system (private): what the last full solve computed, reused.

Between two evaluations ``G`` grows by the rows of a few batches. The last full solve's float32 Cholesky factor
``L`` of ``G0 + ridge I`` and the rows ``U`` folded since give ``(G + ridge I)^-1 = (L L^T + U^T U)^-1`` to float32
accuracy by the Woodbury identity, for the price of triangular solves with the new rows; iterative refinement
with it from the last solution, on the true float64 residual, then reaches float64 accuracy in a few steps, as
the mixed solver's refinement does after a factorisation (``docs/router.md``, "Warm solves").
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from ._ridge import PRODUCT_PANEL_ROWS, RidgeSolution, diagonal_ratio_squared, refine

__all__ = ["WARM_MIN_WIDTH", "WARM_MAX_ITERATIONS", "WarmFactor", "warm_enabled", "warm_allowed", "solve_from",
           "solve_warm", "widened"]

# Smallest M whose solves start warm, per device type. A warm solve costs triangular solves with the new rows
# (O(k M^2)) and a few passes over G; the factorisation it replaces costs M^3 / 3. From M = 3,072 on a CPU
# (where the mixed path starts) it was faster in the measurements of docs/router.md. GPUs: not measured, off.
WARM_MIN_WIDTH = {"cpu": 3_072}
# A warm solve gives up after this many float64 residual products (it usually needs as many as the mixed solver's
# refinement); the full solve follows. One that needs more than 3/4 of them makes the next solve a full one.
WARM_MAX_ITERATIONS = 12
# Rows kept since the factor, as a fraction of M: beyond it the next solve is a full one. The rows and their
# triangular solves take 2 * M * (M / 8) float32 numbers, an eighth of G's float64 M x M.
WARM_ROWS_PER_WIDTH = 1 / 8


def warm_enabled(device: torch.device, width: int) -> bool:
    """Whether solves of width ``M`` on ``device`` may start warm (and full solves keep their factor)."""
    minimum = WARM_MIN_WIDTH.get(device.type)
    return minimum is not None and width >= minimum


def warm_allowed(solver: str, ridge: Union[float, str], dtype: torch.dtype, device: torch.device, width: int) -> bool:
    """The router's rule: float64 statistics, a fixed ridge, a solver that promises float64 accuracy by
    refinement (``"auto"`` or ``"mixed"``), and a device and ``M`` where warm solves pay (``warm_enabled``)."""
    refined = solver in ("auto", "mixed") and ridge != "auto" and dtype == torch.float64
    return refined and warm_enabled(device, width)


def solve_from(warm: "WarmFactor", previous: Optional[Tensor], gram: Tensor, cross: Tensor, ridge: float,
               samples: int, *, nonnegative: bool = False) -> Optional[RidgeSolution]:
    """The warm solve from the last solution ``previous`` (new experts' columns start at zero) when ``warm``
    is usable for this system; ``None`` when not, or when it does not converge in ``WARM_MAX_ITERATIONS``.
    ``nonnegative``: ``G`` has no negative entry (:func:`fly_modules._ridge.refine`)."""
    if previous is None or previous.shape[0] != gram.shape[0] or not warm.usable(gram, ridge, samples):
        return None
    start = widened(previous, cross.shape[1]).to(gram)
    result = solve_warm(gram, cross, ridge, warm, start, max_iter=WARM_MAX_ITERATIONS, nonnegative=nonnegative)
    if result is not None:
        warm.slow = 4 * result.refinement_steps > 3 * WARM_MAX_ITERATIONS
    return result


def widened(columns: Tensor, width: int) -> Tensor:
    """``columns`` with zero columns appended up to ``width`` (the experts added since)."""
    return torch.cat([columns, columns.new_zeros(columns.shape[0], width - columns.shape[1])], 1)


class WarmFactor:
    """The float32 Cholesky factor of ``G0 + ridge I`` from the last full solve and the rows added since, in
    float32; derived state, never saved: a router without one solves in full."""

    def __init__(self, factor: Tensor, ridge: float, samples: int) -> None:
        self.factor, self.ridge, self.samples = factor, ridge, samples
        self.capacity = max(1, int(factor.shape[0] * WARM_ROWS_PER_WIDTH))
        self.count = 0  #: rows recorded since the factor
        self.solved = 0  #: rows whose triangular solve is in ``basis``
        self.overflow = False  #: more rows came than ``capacity``: the next solve is a full one
        self.slow = False  #: the last warm solve used over 3/4 of its iterations: refactorise next time
        self.rows: Optional[Tensor] = None  # (capacity, M) float32, allocated with the first row
        self.basis: Optional[Tensor] = None  # (capacity, M) float32: U L^-T, row-major for the products with it
        self.capacitance: Optional[Tensor] = None  # (capacity, capacity) float64: I + basis^T basis
        self._capacitance_factor: Optional[Tensor] = None
        self.product: Optional[Tensor] = None  #: ``G @ W`` at the last solve (float64), when it was refined
        self.product_rows = 0  #: rows recorded when ``product`` was computed

    @property
    def nbytes(self) -> int:
        """Memory held: the factor, the rows, their triangular solves and the small capacitance matrix."""
        held = (self.factor, self.rows, self.basis, self.capacitance)
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def record(self, phi: Tensor) -> None:
        """Keep the expanded rows ``phi`` that are added to ``G`` (in float32: they only shape the preconditioner)."""
        if self.overflow or self.count + phi.shape[0] > self.capacity:
            self.overflow, self.rows, self.basis, self.capacitance = True, None, None, None
            return
        if self.rows is None:
            with torch.inference_mode(False):  # written by later updates, inside inference mode or not
                self.rows = self.factor.new_empty(self.capacity, self.factor.shape[0])
        self.rows[self.count:self.count + phi.shape[0]].copy_(phi)
        self.count += phi.shape[0]

    def anchor(self, product: Optional[Tensor]) -> None:
        """Keep the last solve's ``G @ W`` (``None``: it made none): with the rows recorded after it, the next
        warm solve's first residual needs no pass over ``G``."""
        self.product, self.product_rows = product, self.count

    def first_residual(self, cross: Tensor, ridge: float, start: Tensor) -> Optional[Tensor]:
        """An estimate of ``Q - (G + ridge I) start`` from the anchored product: ``G`` has grown by the rows
        recorded since, so ``G start = G0 start + U^T (U start)`` up to the rounding of the folds' products
        (float32 products from ``M = 2,048`` on a CPU; the refinement only corrects from it, and every residual
        it tests is computed in full)."""
        if self.product is None or self.product.shape[0] != start.shape[0]:
            return None
        product = widened(self.product, start.shape[1])
        if self.count > self.product_rows:
            # In float64: U x sums M terms of both signs, whose cancellation float32 would round to ~1e-7 of the
            # terms, and a first correction that much off can cost the solve one more residual product
            # (docs/router.md, "Warm solves"). The rows are exact in float32 when the features are float32.
            rows = self.rows[self.product_rows:self.count].to(start.dtype)
            product = product + rows.t() @ (rows @ start)
        return cross - product - ridge * start

    def usable(self, gram: Tensor, ridge: float, samples: int) -> bool:
        """Whether ``(gram + ridge I)``, with ``samples`` accumulated, is this factor's system plus the rows
        recorded (a merge, a reset or a load changes the samples without rows: a full solve)."""
        same_system = (self.ridge == ridge and self.factor.shape == gram.shape and self.factor.device == gram.device)
        return same_system and not self.slow and not self.overflow and samples - self.samples == self.count

    def prepare(self) -> None:
        """Triangular solves of the rows recorded since the last call, and the capacitance factor."""
        new = slice(self.solved, self.count)
        if new.start < new.stop:
            if self.basis is None:
                with torch.inference_mode(False):  # written by later solves, inside inference mode or not
                    self.basis = self.factor.new_empty(self.capacity, self.factor.shape[0])
                    self.capacitance = torch.eye(self.capacity, dtype=torch.float64, device=self.factor.device)
            # X L^T = U: the new rows' triangular solve, O(k M^2), the warm solve's main cost
            solved = torch.linalg.solve_triangular(self.factor.mT, self.rows[new], upper=True, left=False)
            self.basis[new] = solved
            products = (self.basis[:self.count] @ solved.t()).double()
            self.capacitance[:self.count, new] += products
            self.capacitance[new, :new.start] = products[:new.start].t()
            self.solved = self.count
        if self.count:
            self._capacitance_factor = torch.linalg.cholesky(self.capacitance[:self.count, :self.count])

    def apply(self, vectors: Tensor) -> Tensor:
        """``(L L^T + U^T U)^-1 vectors`` to float32 accuracy (Woodbury), in float64; ``prepare`` first."""
        lower = torch.linalg.solve_triangular(self.factor, vectors.to(self.factor.dtype), upper=False)
        if self.count:
            basis = self.basis[:self.count]
            weights = torch.cholesky_solve((basis @ lower).double(), self._capacitance_factor).to(basis.dtype)
            lower = lower - (weights.t() @ basis).t()  # as x^T B: a transposed left operand is slow (_ridge)
        return torch.linalg.solve_triangular(self.factor.mT, lower, upper=True).double()


def solve_warm(gram: Tensor, cross: Tensor, ridge: float, warm: WarmFactor, start: Tensor, *,
               max_iter: int, panel_rows: int = PRODUCT_PANEL_ROWS, nonnegative: bool = False) -> Optional[RidgeSolution]:
    """Iterative refinement of ``(G + ridge I) X = Q`` from ``start`` (in place) with ``warm``'s inverse, stopped
    on the true float64 residual by the mixed solver's test (:func:`fly_modules._ridge.refine`); ``None`` when it
    does not converge in ``max_iter`` residual products. The first correction comes from the estimate of
    :meth:`WarmFactor.first_residual` where there is one."""
    warm.prepare()
    estimate = warm.first_residual(cross, ridge, start)
    refined = refine(gram, cross, ridge, start, warm.apply, max_iter=max_iter, panel_rows=panel_rows,
                     estimate=estimate, nonnegative=nonnegative)
    if refined is None:
        return None
    return RidgeSolution(refined.solution, ridge, "warm", diagonal_ratio_squared(warm.factor), torch.float64,
                         refined.steps, product=refined.product)
