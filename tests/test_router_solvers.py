"""AnalyticRouter's solvers on hard systems: the mixed-precision solver's float64 accuracy and its fallback,
a failed factorisation, the conditioning warnings, and the Cholesky path's condition estimate."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ridge_bounds import assert_same_solution
from test_router import clustered, reference_solution

from fly_modules import AnalyticRouter, RouterConditioningWarning, RouterSolveError, _ridge


def test_mixed_precision_solver_reaches_float64_accuracy():
    features, ids = clustered(3000, 24, 5)
    router = AnalyticRouter(24, 5, expansion_dim=400, ridge=1e3, solver="mixed")
    router.update(features, ids)
    with_mixed = router.solve().clone()
    assert router.solver_ == "mixed"
    expected = reference_solution(router, features, ids, 1e3)
    # As a float64 solve is accurate (a float32 one is off by cond * 2^-24, ~1e8 times more).
    assert_same_solution(with_mixed, expected, router.gram_matrix(), 1e3)


@pytest.mark.parametrize("panel_rows", [1, 7, 64, 500])
def test_products_with_g_read_its_lower_triangle_only(panel_rows):
    """The residuals' kernels against the dense symmetric matrix, with garbage above the diagonal (a fold
    writes the lower triangle only) and panels that do not divide M."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(40, 150, generator=generator, dtype=torch.float64)
    symmetric = rows.t() @ rows - 3.0
    gram = torch.tril(symmetric) + torch.triu(torch.full_like(symmetric, 1e6), 1)
    vectors = torch.randn(150, 6, generator=generator, dtype=torch.float64)
    product = _ridge.symmetric_matmul(gram, vectors, panel_rows)
    assert product.shape == vectors.shape and product.is_contiguous()
    torch.testing.assert_close(product, symmetric @ vectors, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(_ridge.symmetric_abs_row_sums(gram, panel_rows), symmetric.abs().sum(dim=1))


def test_stopping_norm_of_a_nonnegative_gram_rides_with_the_first_product():
    """ReLU features give a Gram matrix without negative entries: its infinity norm is max(G 1), read from one
    more column of the first product, equal to the pass of its own; an edited G with negative entries makes the
    column understate the norm, which only makes the stopping test stricter."""
    generator = torch.Generator().manual_seed(1)
    rows = torch.rand(30, 120, generator=generator, dtype=torch.float64)
    gram = torch.tril(rows.t() @ rows) + torch.triu(torch.full((120, 120), 1e6, dtype=torch.float64), 1)
    vectors = torch.randn(120, 3, generator=generator, dtype=torch.float64)
    separate = _ridge.ResidualProducts(gram, 16, nonnegative=False)
    riding = _ridge.ResidualProducts(gram, 16, nonnegative=True)
    assert riding.norm is None
    torch.testing.assert_close(riding(vectors), separate(vectors), rtol=1e-13, atol=0)
    assert riding.norm == pytest.approx(separate.norm, rel=1e-14)
    signed = gram.clone()
    signed[5:, 0] = -1.0
    understated = _ridge.ResidualProducts(signed, 16, nonnegative=True)
    understated(vectors)
    assert understated.norm < _ridge.ResidualProducts(signed, 16, nonnegative=False).norm


@pytest.mark.parametrize("nonnegative", [False, True])
def test_mixed_solver_with_either_norm_reaches_float64_accuracy(nonnegative):
    features, ids = clustered(3000, 24, 5)
    router = AnalyticRouter(24, 5, expansion_dim=400, ridge=1e3)
    router.update(features, ids)
    router.flush()
    result = _ridge.solve_mixed(router.gram, router.cross, 1e3, nonnegative=nonnegative)
    assert_same_solution(result.weights, reference_solution(router, features, ids, 1e3), router.gram_matrix(), 1e3)


def test_mixed_precision_falls_back_on_ill_conditioned_system():
    # 250 samples < M = 300: G is singular, so cond(G + ridge I) = (lambda_max(G) + ridge) / ridge ~ 2e8 on
    # any CPU: beyond a float32 factor (cond * 2^-24 ~ 12), well within float64 (cond * 2^-53 ~ 2e-8).
    features, ids = clustered(250, 8, 2)
    router = AnalyticRouter(8, 2, expansion_dim=300, ridge=1e-2, solver="mixed")
    router.update(features, ids)
    with pytest.warns(RuntimeWarning, match="float64 Cholesky") as caught:
        router.solve()
    assert not [w for w in caught if issubclass(w.category, RouterConditioningWarning)]
    assert router.solver_ == "cholesky"
    router.solver = "auto"
    router._mark_stale()
    router.solve()  # the automatic choice falls back silently
    assert router.solver_ == "cholesky"
    np.testing.assert_allclose(router.weight.t().numpy(), reference_solution(router, features, ids, 1e-2), rtol=1e-5)


@pytest.mark.parametrize("stats_dtype, solver", [(torch.float32, "cholesky"), (torch.float64, "auto"), (torch.float64, "cholesky")])
def test_failed_factorisation_says_what_to_do(stats_dtype, solver):
    router = AnalyticRouter(2, 1, expansion_dim=0, ridge=0.5, solver=solver, stats_dtype=stats_dtype)
    router.update(torch.ones(1, 2), 0)
    router.flush()
    with torch.no_grad():  # statistics no stream can produce: G + 0.5 I has eigenvalues 3.5 and -0.5
        router.gram.copy_(torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
    # Its Cholesky fails in any rounding: the second pivot is 1.5 - 2^2 / 1.5 < 0 with an O(1) margin.
    with pytest.raises(RouterSolveError, match=r"failed at column 2 .* Increase `ridge`"):
        router.solve()


def ill_conditioned_router(solver: str, stats_dtype: torch.dtype = torch.float64) -> AnalyticRouter:
    """G = diag(2^40, 2^-40) exactly, on every CPU: the features' products are powers of two, each entry of G
    has one non-zero term, and a diagonal G needs no rotation in eigh. With ridge 2^-40, cond(G + ridge I)
    = (2^40 + 2^-40) / 2^-39 ~ 2^79 ~ 6e23, beyond any precision."""
    router = AnalyticRouter(2, 1, expansion_dim=0, ridge=2.0**-40, solver=solver, stats_dtype=stats_dtype)
    router.update(torch.tensor([[2.0**20, 0.0], [0.0, 2.0**-20]], dtype=torch.float64), 0)
    assert torch.equal(router.gram_matrix(), torch.diag(torch.tensor([2.0**40, 2.0**-40], dtype=stats_dtype)))
    return router


@pytest.mark.parametrize(
    "solver, stats_dtype",
    [("eigh", torch.float64), ("auto", torch.float64), ("cholesky", torch.float64), ("cholesky", torch.float32),
     ("auto", torch.float32)],
)
def test_ill_conditioned_solution_warns_with_the_fix(solver, stats_dtype):
    router = ill_conditioned_router(solver, stats_dtype)
    with pytest.warns(RouterConditioningWarning, match=r"condition number ~.*e\+2\d.*Increase `ridge`.*ridge='auto'"):
        router.solve()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        router(torch.ones(1, 2))  # the cached solution does not warn again
    router.ridge = "auto"
    router._mark_stale()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # GCV never picks an unreliable ridge here
        router.solve()


def test_rank_deficient_statistics_with_a_tiny_ridge_warn_in_eigh():
    """The reported case: near-singular data and a tiny ridge gave weights of 1e19 without a word.

    Two samples (2^20, 2^20) and (2^-20, -2^-20): each entry of G is 2^40 +- 2^-40, which rounds to 2^40 in
    float64 whatever the order or fusion of the operations, so the computed G is 2^40 [[1, 1], [1, 1]],
    exactly singular. A backward-stable eigh returns its zero eigenvalue within a few ulps of 2^41
    (|s_min| <= 2^-9), so cond >= 2^41 / (2^-9 + 2^-30) = 2^50: far beyond the warning bound (1e-2 / eps =
    4.5e13 < 2^50 = 1.1e15).
    """
    router = AnalyticRouter(2, 2, expansion_dim=0, ridge=2.0**-30, solver="eigh")
    router.update(torch.tensor([[2.0**20, 2.0**20], [2.0**-20, -(2.0**-20)]], dtype=torch.float64), torch.tensor([0, 1]))
    assert torch.equal(router.gram_matrix(), torch.full((2, 2), 2.0**40, dtype=torch.float64))
    with pytest.warns(RouterConditioningWarning, match="ill-conditioned"):
        router.solve()


def test_cholesky_condition_estimate_is_a_tight_lower_bound():
    """Two inverse-iteration steps with the factor find the cluster of small eigenvalues of a rank-deficient G."""
    features, ids = clustered(40, 6, 2)
    router = AnalyticRouter(6, 2, expansion_dim=64, ridge=1e-3, solver="cholesky")
    router.update(features, ids)  # 40 samples < 64 = M: lambda_min(G) = 0, cond = (lambda_max + ridge) / ridge
    exact = (float(torch.linalg.eigvalsh(router.gram_matrix()).max()) + 1e-3) / 1e-3
    estimate = _ridge.solve_cholesky(router.gram, router.cross, 1e-3).condition
    assert exact / 10 <= estimate <= exact * (1 + 1e-6)
