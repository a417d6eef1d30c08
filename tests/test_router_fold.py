"""The fold's product precision: rows that are float32 numbers fold with a float32 GEMM on the CPU from
``FOLD_LOW_PRECISION_MIN_WIDTH``; G, the solution and the routes stay within the stated bounds of the float64 fold."""

from __future__ import annotations

import pytest
import torch
from test_router import clustered

from fly_modules import AnalyticRouter, _ridge

M, D, EXPERTS, FOLD, RIDGE = _ridge.FOLD_LOW_PRECISION_MIN_WIDTH, 32, 3, 512, 1e2
U32, U64 = 2.0**-24, 2.0**-53


def float32_stream(n: int):
    features, ids = clustered(n, D, EXPERTS, seed=7, dtype=torch.float32)
    return features / 4, ids  # |h| ~ 1, as a LayerNorm'ed CLS token


def fed_router(features: torch.Tensor, ids: torch.Tensor) -> AnalyticRouter:
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=RIDGE, solver="cholesky", fold_rows=FOLD)
    for start in range(0, features.shape[0], 64):
        router.update(features[start:start + 64], ids[start:start + 64])
    router.flush()
    return router


def test_float32_fold_stays_within_its_rounding_bound_of_the_float64_fold():
    features, ids = float32_stream(1100)
    router = fed_router(features, ids)
    phi = router.expansion(features)  # the router's own rows: float64 holding float32 numbers
    assert _ridge.fold_product_dtype(router.gram, phi) == torch.float32
    reference = torch.zeros(M, M, dtype=torch.float64)
    _ridge.accumulate_lower_gram(reference, phi)  # the float64 fold of the same rows
    # A float32 dot product of k terms is within (k + 1) u32 sum |a_i b_i| of the exact one in any order;
    # float64 folds and the sums of folds add n u64 of it. phi >= 0 (relu): sum |a_i b_i| = G.
    magnitude = phi.abs().t() @ phi.abs()
    bound = ((FOLD + 1) * U32 + 2 * phi.shape[0] * U64) * magnitude
    gap = torch.tril(router.gram - reference).abs()
    assert bool((gap <= torch.tril(bound)).all()), f"largest excess {float((gap - bound).max()):.3g}"
    assert float(gap.max()) > 0  # the float32 path ran: its products round


def test_float32_fold_keeps_the_solution_and_the_routes():
    features, ids = float32_stream(1300)
    train, queries = (features[:1100], ids[:1100]), features[1100:]
    fast = fed_router(*train)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(_ridge.FOLD_PRODUCT_DTYPE, "cpu", torch.float64)
        exact = fed_router(*train)
    error = _ridge.symmetrize_lower(fast.gram - exact.gram)
    # (A + E) y = b against A x = b, A = G + ridge I >= ridge I: ||y - x|| <= ||E||_2 ||y|| / ridge, plus the
    # two float64 solves' rounding (2 cond eps64 each, normwise); Frobenius norms bound the 2-norms.
    solution_fast, solution_exact = fast.solve(), exact.solve()
    condition = (float(exact.gram_matrix().norm()) + RIDGE) / RIDGE
    scale = float(solution_fast.norm())
    bound = float(error.norm()) / RIDGE * scale + 4 * condition * U64 * scale
    assert float((solution_fast - solution_exact).norm()) <= bound
    assert torch.equal(fast.route(queries), exact.route(queries))


@pytest.mark.parametrize("width", [M - 1, M])
def test_rows_that_are_not_float32_numbers_or_small_systems_fold_in_float64(width):
    gram = torch.zeros(width, width, dtype=torch.float64)
    float32_rows = torch.rand(4, width).double()
    float64_rows = float32_rows + 2.0**-40  # no longer float32 numbers
    assert _ridge.fold_product_dtype(gram, float64_rows) == torch.float64
    assert _ridge.fold_product_dtype(gram, float32_rows) == (torch.float32 if width >= M else torch.float64)
    assert _ridge.fold_product_dtype(gram.float(), float32_rows.float()) == torch.float32  # float32 statistics
    assert _ridge.fold_product_dtype(gram.to("meta"), float32_rows.to("meta")) == torch.float64  # not listed
