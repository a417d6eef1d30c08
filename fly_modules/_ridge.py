"""Kernels and solvers of the analytic router's ridge system ``(G + ridge I) W = Q`` (private).

``gram`` always holds ``G``'s lower triangle; what lies above the diagonal is unspecified, and every
function here reads the lower triangle only. Kernels that walk ``G`` in row panels take the panel
height as an argument: a tuning knob, not a storage format. One function per solver (scikit-learn's
``_ridge.py`` layout), each returning a :class:`RidgeSolution` that carries an estimate of the
system's condition number; the router decides what to do with it. ``benchmarks/speed/router.py``
imports this module directly.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = [
    "PANEL_ROWS", "PRODUCT_PANEL_ROWS", "RidgeSolution", "RouterSolveError", "accumulate_lower_gram", "symmetrize_lower",
    "symmetric_matmul", "Refined", "ResidualProducts", "refine", "residual_converged", "solve_mixed", "solve_cholesky", "solve_eigh",
    "error_bound", "preferred_solver",
    "fold_product_dtype", "fold_product_choice", "fold_panel_rows", "FOLD_PRODUCT_DTYPE",
]

# G is updated in row panels of PANEL_ROWS rows: panel i adds phi_i^T phi[:, :end_i], a fraction
# 1/2 + rows/(2M) of the dense flops (53% at M = 10,000). Shorter panels waste fewer flops, but each
# GEMM is smaller and is a synchronisation point of the BLAS threads; 512 rows measured best on 2-core
# AVX-512 CPUs (benchmarks/speed/router.py prints the kernel ratio).
PANEL_ROWS = 512
# Products of G with a few vectors (the refinement's and the warm solve's residuals) walk it in shorter
# panels: each panel is read twice (for both triangles), and at 64 rows the second read hits the cache.
# On a 2-core AMD EPYC (AVX-512, MKL, 1 thread), one product with 6 vectors took 0.095 s at M = 10,000 in
# panels of 64 rows, 0.102 s of 128, 0.142 s of 256 (a dense product with the full matrix: 0.143 s); at
# M = 4,000: 0.017 s in panels of 64 or 128.
PRODUCT_PANEL_ROWS = 64


# GPUs whose float64 arithmetic runs at half the float32 rate or better, by compute capability: the
# data-centre parts (P100 6.0, V100 7.0, A100 8.0, H100 and H200 9.0). On an H100 a float64 LU took
# 1.12x the time of a float32 LU at M = 10,000 (docs/gpu.md), so a float64 Cholesky costs about what
# the mixed solver's float32 factor costs, without the refinement after it.
FULL_RATE_FLOAT64_CAPABILITIES = frozenset({(6, 0), (7, 0), (8, 0), (9, 0)})
# On a CPU the float32 factor is about twice as fast, but each refinement step is a memory-bound pass
# over G (4-7 steps): the O(M^3) saving outgrows their O(M^2) cost only for large systems. On a shared
# 2-core AMD EPYC the float64 Cholesky was 1.09x faster at M = 2,048, the mixed path 1.30x and 1.62x
# faster at M = 4,096 and 10,000 (benchmarks/speed/router.py; docs/router.md, "Solvers").
MIXED_MIN_WIDTH_CPU = 3_072


def preferred_solver(device: torch.device, width: int) -> str:
    """The solver ``solver="auto"`` runs for float64 statistics of width ``width`` on ``device``:
    ``"cholesky"`` (float64) on GPUs with full-rate float64 and on CPUs below ``MIXED_MIN_WIDTH_CPU``,
    ``"mixed"`` (float32 factor, float64 refinement) elsewhere. ``python -m benchmarks.speed.router``
    times the path not chosen beside the chosen one on the device it runs on."""
    if device.type == "cuda":
        full_rate = torch.cuda.get_device_capability(device) in FULL_RATE_FLOAT64_CAPABILITIES
        return "cholesky" if full_rate else "mixed"
    return "mixed" if width >= MIXED_MIN_WIDTH_CPU else "cholesky"


class RouterSolveError(RuntimeError):
    """The ridge system could not be factorised (not positive definite in floating point)."""


class RidgeSolution(NamedTuple):
    """A solve's answer and what is known about its accuracy."""

    weights: Tensor  #: ``W``, ``(M, num_experts)``
    ridge: float  #: the ridge used (the GCV choice for ``ridge="auto"``)
    solver: str  #: ``"mixed"``, ``"cholesky"`` or ``"eigh"``
    condition: float  #: cond_2(G + ridge I): exact for eigh, a lower bound from the factor otherwise
    precision: torch.dtype  #: the precision the answer is accurate to, up to ``condition``
    refinement_steps: int = 0  #: float64 residual products of a refined solve (mixed or warm)
    factor: Optional[Tensor] = None  #: the float32 Cholesky factor of ``G + ridge I`` (lower), when one was made
    product: Optional[Tensor] = None  #: ``G @ weights`` from a refined solve's last residual (a warm solve's start)


class Refined(NamedTuple):
    """What :func:`refine` converged to."""

    solution: Tensor
    steps: int  #: float64 residual products
    product: Tensor  #: ``G @ solution``, the last residual's product


def error_bound(solution: RidgeSolution) -> float:
    """A-priori bound on the relative error of ``W``: condition number times the unit roundoff."""
    return solution.condition * torch.finfo(solution.precision).eps


# ============================================================================ panelled kernels
def panels(size: int, panel_rows: int) -> List[Tuple[int, int]]:
    return [(start, min(start + panel_rows, size)) for start in range(0, size, panel_rows)]


# The precision of the fold's products, per device type (``docs/router.md``, "Fold precision"): from
# width FOLD_LOW_PRECISION_MIN_WIDTH, rows that are float32 numbers (the default expansion product of
# float32 features) are multiplied by a float32 GEMM whose panels are added to the float64 G; other
# rows, smaller G (whose folds cost little) and devices not listed multiply in G's dtype.
FOLD_PRODUCT_DTYPE = {"cpu": torch.float32}
FOLD_LOW_PRECISION_MIN_WIDTH = 2048
# Panel height of the low-precision fold: each panel's product is a temporary added to G; at 128 rows it
# stays in the cache (2-core AMD EPYC, M = 4,000, 512 rows: 0.12 s in panels of 128, 0.15 s of 512,
# against 0.20 s for the float64 fold).
LOW_PRECISION_PANEL_ROWS = 128


def fold_product_dtype(gram: Tensor, phi: Tensor) -> torch.dtype:
    """The dtype ``accumulate_lower_gram`` multiplies ``phi`` in: ``FOLD_PRODUCT_DTYPE[device]`` when ``gram`` is
    float64, at least ``FOLD_LOW_PRECISION_MIN_WIDTH`` wide, and every entry of ``phi`` is exactly a float32
    number (nothing is rounded before the product; only the GEMM's products and sums are)."""
    chosen = fold_product_choice(gram.device, gram.shape[0])
    if chosen == torch.float64 or phi.dtype != torch.float64 or gram.dtype != torch.float64:
        return gram.dtype
    return chosen if bool(torch.equal(phi.to(chosen).double(), phi)) else gram.dtype


def fold_product_choice(device: torch.device, width: int) -> torch.dtype:
    """The device and width part of :func:`fold_product_dtype`: the product's dtype for float64 statistics of
    width ``M`` whose rows are float32 numbers."""
    if width < FOLD_LOW_PRECISION_MIN_WIDTH:
        return torch.float64
    return FOLD_PRODUCT_DTYPE.get(device.type, torch.float64)


def fold_panel_rows(product_dtype: torch.dtype, stats_dtype: torch.dtype = torch.float64) -> int:
    """The fold's default panel height: ``PANEL_ROWS`` for products in the statistics' dtype, shorter panels
    (their temporaries stay in the cache) for lower-precision products."""
    return PANEL_ROWS if product_dtype == stats_dtype else LOW_PRECISION_PANEL_ROWS


def accumulate_lower_gram(gram: Tensor, phi: Tensor, panel_rows: int = PANEL_ROWS,
                          product_dtype: Optional[torch.dtype] = None) -> None:
    """Add ``phi^T phi`` to the lower triangle of ``gram`` (plus, harmlessly, the panels' diagonal blocks).

    ``product_dtype`` (default: ``gram``'s) is the precision of each panel's GEMM; a panel computed in a
    lower precision is added to ``gram`` in ``gram``'s.
    """
    if product_dtype is None or product_dtype == gram.dtype:
        for start, stop in panels(gram.shape[0], panel_rows):
            gram[start:stop, :stop].addmm_(phi[:, start:stop].t(), phi[:, :stop])
        return
    low = phi.to(product_dtype)
    for start, stop in panels(gram.shape[0], panel_rows):
        gram[start:stop, :stop] += low[:, start:stop].t() @ low[:, :stop]


def symmetrize_lower(block: Tensor) -> Tensor:
    """The symmetric matrix whose lower triangle is ``block``'s (the upper triangle is never read)."""
    return torch.tril(block) + torch.tril(block, -1).mT


def symmetric_matmul(gram: Tensor, x: Tensor, panel_rows: int = PANEL_ROWS) -> Tensor:
    """``G @ x`` from the lower triangle of ``gram`` without materialising the full matrix."""
    # Computed as x^T G, k x M: MKL's products of a short wide left operand with a panel run 1.4-1.6x
    # faster than those of a panel with a tall thin right operand (the form G x) at k = 6.
    rows = x.t().contiguous()
    out = torch.zeros_like(rows)
    for start, stop in panels(gram.shape[0], panel_rows):
        out[:, start:stop] += rows[:, start:stop] @ symmetrize_lower(gram[start:stop, start:stop])
        if start:
            # Strictly below the diagonal: stored once for both triangles.
            left = gram[start:stop, :start]
            out[:, start:stop].addmm_(rows[:, :start], left.t())
            out[:, :start].addmm_(rows[:, start:stop], left)
    return out.t().contiguous()


def symmetric_abs_row_sums(gram: Tensor, panel_rows: int = PANEL_ROWS) -> Tensor:
    """Row sums of ``|G|`` (the infinity norm's ingredients) from the lower triangle of ``gram``."""
    sums = gram.new_zeros(gram.shape[0])
    for start, stop in panels(gram.shape[0], panel_rows):
        sums[start:stop] += symmetrize_lower(gram[start:stop, start:stop]).abs().sum(dim=1)
        if start:
            left = gram[start:stop, :start].abs()
            sums[start:stop] += left.sum(dim=1)
            sums[:start] += left.sum(dim=0)
    return sums


# ==================================================================================== Cholesky
def cholesky_factor(gram: Tensor, ridge: float, dtype: torch.dtype) -> Tuple[Tensor, int]:
    """Lower Cholesky factor of ``G + ridge I`` in ``dtype``, in one copy of G; and LAPACK's ``info``.

    LAPACK factorises column-major matrices in place; the transposed view of a row-major copy is one,
    so factorising it as *upper* (its upper triangle is the copy's lower triangle) needs no second
    M x M buffer (``cholesky_ex(system, out=system)`` on the row-major copy would make one internally).
    """
    system = gram.to(dtype=dtype, copy=True)
    system.diagonal().add_(ridge)
    column_major = system.mT
    info = torch.empty((), dtype=torch.int32, device=gram.device)
    torch.linalg.cholesky_ex(column_major, upper=True, out=(column_major, info))
    return system, int(info)


def cholesky_solve(factor: Tensor, rhs: Tensor) -> Tensor:
    """Solve ``L L^T x = rhs`` with two triangular solves on views of ``factor`` (lower triangle = L).

    ``torch.cholesky_solve`` would copy the whole M x M factor on every call.
    """
    return torch.linalg.solve_triangular(factor.mT, torch.linalg.solve_triangular(factor, rhs, upper=False), upper=True)


def diagonal_ratio_squared(factor: Tensor) -> float:
    """``(max L_ii / min L_ii)^2``: a free lower bound on cond_2 of the factorised matrix."""
    diagonal = factor.diagonal().abs().double()
    return float((diagonal.max() / diagonal.min()) ** 2)


def inverse_iteration_probe(size: int, like: Tensor) -> Tensor:
    """A fixed random start vector ``(size, 1)`` (drawn on the CPU: the same on every device)."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    return torch.randn(size, 1, generator=generator, dtype=torch.float64).to(device=like.device, dtype=like.dtype)


def suggested_ridge(ridge: float, largest_diagonal: float, dtype: torch.dtype) -> float:
    """A ridge worth trying instead: 100x larger, and at least 1e-8 max diag(G) in float64 (scaled by
    the precision's epsilon), which keeps cond(G + ridge I) <= M * 1e8 * eps64 / eps."""
    scale = torch.finfo(dtype).eps / torch.finfo(torch.float64).eps
    return max(ridge * 100, largest_diagonal * 1e-8 * scale)


def factorisation_failure(info: int, dtype: torch.dtype, ridge: float, gram: Tensor) -> RouterSolveError:
    largest = float(gram.diagonal().max())
    return RouterSolveError(
        f"AnalyticRouter: the Cholesky factorisation of (G + ridge*I) failed at column {info} in {dtype}: "
        f"the system is not positive definite to working precision (ridge={ridge:g}, largest diagonal entry "
        f"of G={largest:.3g}). Increase `ridge` (e.g. to {suggested_ridge(ridge, largest, dtype):.3g}) or pass "
        f"ridge='auto'" + (", or accumulate in float64 (stats_dtype=torch.float64)." if dtype != torch.float64 else ".")
    )


def solve_cholesky(gram: Tensor, cross: Tensor, ridge: float, *, keep_factor: bool = False) -> RidgeSolution:
    """Cholesky solve in ``gram``'s dtype; raises :class:`RouterSolveError` when the factorisation fails.

    With ``keep_factor`` the answer carries a float32 copy of the factor (for later warm solves).

    The condition estimate costs one extra pair of triangular solves: a probe vector rides along with
    ``Q`` (``y1 = A^-1 x``), one more solve gives ``y2 = A^-1 y1``, and ``||y1|| / ||y2|| >= lambda_min``
    while ``max diag(A) <= lambda_max``, so their ratio is a lower bound on cond_2(A) that two steps of
    inverse iteration make close for the clusters of small eigenvalues ridge systems have.
    """
    factor, info = cholesky_factor(gram, ridge, gram.dtype)
    if info:
        raise factorisation_failure(info, gram.dtype, ridge, gram)
    probe = inverse_iteration_probe(gram.shape[0], gram)
    solved = cholesky_solve(factor, torch.cat([cross, probe], dim=1))
    weights, first = solved[:, :-1], solved[:, -1:]
    second = cholesky_solve(factor, first)
    largest_diagonal = float(gram.diagonal().max()) + ridge
    growth = float(second.double().norm() / first.double().norm())  # in float64: float32 would overflow
    condition = max(diagonal_ratio_squared(factor), largest_diagonal * growth)
    kept = factor.to(torch.float32) if keep_factor else None
    return RidgeSolution(weights.contiguous(), ridge, "cholesky", condition, gram.dtype, factor=kept)


def solve_mixed(gram: Tensor, cross: Tensor, ridge: float, *, panel_rows: int = PRODUCT_PANEL_ROWS,
                max_iter: int = 30, nonnegative: bool = False) -> Optional[RidgeSolution]:
    """Float32 Cholesky factor + float64 iterative refinement (:func:`refine`); ``None`` when it does not converge.

    Each step solves the float64 residual ``Q - (G + lambda I) x`` with the float32 factor; the error contracts
    by about ``cond(G + lambda I) * 2^-24`` per step. Convergence itself bounds the condition number by about
    ``2^24``, so the float32 factor's diagonal ratio (free) is the estimate reported. ``nonnegative``: as for
    :func:`refine`.
    """
    factor, info = cholesky_factor(gram, ridge, torch.float32)
    if info:
        return None
    start = cholesky_solve(factor, cross.float()).double()
    refined = refine(gram, cross, ridge, start, functools.partial(float32_solve, factor), max_iter=max_iter,
                     panel_rows=panel_rows, nonnegative=nonnegative)
    if refined is None:
        return None
    return RidgeSolution(refined.solution, ridge, "mixed", diagonal_ratio_squared(factor), torch.float64,
                         refined.steps, factor, refined.product)


def float32_solve(factor: Tensor, residual: Tensor) -> Tensor:
    """``(L L^T)^-1 residual`` with a float32 factor, in float64: the mixed solver's correction."""
    return cholesky_solve(factor, residual.float()).double()


class ResidualProducts:
    """``G @ x`` for the refinement's residuals, and ``||G||_inf`` for its stopping test.

    The norm costs a pass over ``G`` of its own (:func:`symmetric_abs_row_sums`), except when ``G`` has no negative
    entry (a Gram matrix of ReLU features): then ``|G| 1 = G 1`` rides along with the first product as one more
    column, a small fraction of the pass. Were an entry negative after all (an edited ``G``), ``max(G 1)`` would
    understate the norm, which only makes the test stricter.
    """

    def __init__(self, gram: Tensor, panel_rows: int, nonnegative: bool) -> None:
        self.gram, self.panel_rows = gram, panel_rows
        self.norm: Optional[float] = None if nonnegative else float(symmetric_abs_row_sums(gram, panel_rows).max())

    def __call__(self, vectors: Tensor) -> Tensor:
        if self.norm is not None:
            return symmetric_matmul(self.gram, vectors, self.panel_rows)
        ones = vectors.new_ones(vectors.shape[0], 1)
        product = symmetric_matmul(self.gram, torch.cat([vectors, ones], dim=1), self.panel_rows)
        self.norm = float(product[:, -1].max())
        return product[:, :-1]


def residual_converged(residual: float, solution: float, scale: float) -> bool:
    """The refinement's stopping test, ``max|r| <= eps64 ||G + ridge I||_inf max|x|`` (``scale`` = the last two)."""
    return residual <= scale * solution


def refine(gram: Tensor, cross: Tensor, ridge: float, solution: Tensor, correct: Callable[[Tensor], Tensor], *,
           max_iter: int, panel_rows: int = PRODUCT_PANEL_ROWS, estimate: Optional[Tensor] = None,
           nonnegative: bool = False) -> Optional[Refined]:
    """Iterative refinement of ``solution`` (in place) on the float64 residual; ``None`` when it does not
    converge in ``max_iter`` residual products.

    ``correct`` maps a residual to a correction through an approximate inverse of ``G + ridge I`` (a float32
    factor, or the warm solve's). ``estimate``, an estimate of the first residual, gives the first correction
    without a product (it is never tested: only true residuals are). Refinement stops once the residual is at
    the float64 rounding level of the product (:func:`residual_converged`, infinity norms), where the answer is
    as accurate as a float64 Cholesky or LU solve. When a correction fails to halve, it accepts the solution if
    the residual meets LAPACK ``dsposv``'s looser ``sqrt(M)`` criterion (refinement has stalled at rounding
    noise) and gives up otherwise (the approximate inverse is too far off: ``cond * 2^-24`` near 1 or above
    for a float32 factor). ``nonnegative`` says ``G`` has no negative entry (ReLU features): ``||G||_inf`` is then
    ``max(G 1)``, read from the first product (:class:`ResidualProducts`) instead of a pass of its own.
    """
    products = ResidualProducts(gram, panel_rows, nonnegative)
    previous = math.inf
    if estimate is not None:
        correction = correct(estimate)
        solution += correction
        previous = float(correction.abs().max())
    for steps in range(1, max_iter + 1):
        product = products(solution)
        residual = cross - product - ridge * solution
        size_r, size_x = float(residual.abs().max()), float(solution.abs().max())
        scale = torch.finfo(torch.float64).eps * (products.norm + ridge)
        if residual_converged(size_r, size_x, scale):
            return Refined(solution, steps, product)
        correction = correct(residual)
        size = float(correction.abs().max())
        if size > 0.5 * previous:
            stalled_at_rounding_noise = size_r <= math.sqrt(gram.shape[0]) * scale * size_x
            return Refined(solution, steps, product) if stalled_at_rounding_noise else None
        solution += correction
        previous = size
    return None


# ======================================================================================= eigh
def solve_eigh(gram: Tensor, cross: Tensor, ridge: Optional[float], *, grid: Optional[Sequence[float]] = None,
               num_samples: int = 0) -> RidgeSolution:
    """Solve through ``G = V diag(s) V^T``; with ``ridge=None`` choose it by GCV over ``grid`` first.

    Generalised cross-validation needs only the statistics: with ``q = V^T Q`` and ``n`` samples whose
    targets are one-hot (so ``sum ||y||^2 = n``),
    ``RSS(l) = n - sum_i ||q_i||^2 (s_i + 2 l) / (s_i + l)^2`` and ``tr H(l) = sum_i s_i / (s_i + l)``,
    and ``GCV(l) = n * RSS(l) / (n - tr H(l))^2``. The condition number is exact from the eigenvalues.
    """
    eigenvalues, eigenvectors = torch.linalg.eigh(gram)  # reads the lower triangle only
    eigenvalues = eigenvalues.clamp_min(0)
    rotated = eigenvectors.t() @ cross
    if ridge is None:
        chosen = _gcv_ridge(eigenvalues, rotated, grid, num_samples)
    else:
        chosen = float(ridge)
    weights = eigenvectors @ (rotated / (eigenvalues + chosen).unsqueeze(1))
    condition = float((eigenvalues.max() + chosen) / (eigenvalues.min() + chosen))
    return RidgeSolution(weights, chosen, "eigh", condition, gram.dtype)


def _gcv_ridge(eigenvalues: Tensor, rotated: Tensor, grid: Optional[Sequence[float]], num_samples: int) -> float:
    if grid is None:
        mean = float(eigenvalues.mean()) or 1.0
        grid = [mean * 10.0 ** (k / 4) for k in range(-24, 25)]
    candidates = torch.tensor(list(grid), dtype=eigenvalues.dtype, device=eigenvalues.device)
    energy = rotated.pow(2).sum(dim=1)
    s = eigenvalues.unsqueeze(0)
    lam = candidates.unsqueeze(1)
    rss = num_samples - (energy * (s + 2 * lam) / (s + lam) ** 2).sum(dim=1)
    dof = (s / (s + lam)).sum(dim=1)
    gcv = num_samples * rss.clamp_min(0) / (num_samples - dof).pow(2)
    gcv = torch.where(dof < num_samples - 1e-9, gcv, torch.full_like(gcv, math.inf))
    return float(candidates[int(torch.argmin(gcv))])


def conditioning_message(result: RidgeSolution, largest_diagonal: float) -> str:
    """The router's warning for an ill-conditioned solve: how far off the weights may be, and the fix."""
    suggested = suggested_ridge(result.ridge, largest_diagonal, result.precision)
    return (
        f"AnalyticRouter: (G + ridge*I) is ill-conditioned (condition number ~{result.condition:.2g} with "
        f"ridge={result.ridge:g}, solver {result.solver!r} in {result.precision}): the routing weights may be "
        f"off by up to {error_bound(result):.2g} relative. Increase `ridge` (e.g. to {suggested:.3g}) "
        f"or pass ridge='auto'"
        + (", or accumulate in float64 (stats_dtype=torch.float64)." if result.precision != torch.float64 else ".")
    )
