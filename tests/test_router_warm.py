"""AnalyticRouter's warm solves (refinement with the last full solve's factor and the rows
added since): the answer against a full factorisation within float64 rounding, a stale answer caught by the same
bound, and when each path runs, tested by its rule (never by timing)."""

from __future__ import annotations

import pytest
import torch
from ridge_bounds import assert_same_solution
from test_router import clustered

from fly_modules import AnalyticRouter, _ridge, _warm

RIDGE = 10.0


@pytest.fixture
def warm_everywhere(monkeypatch):
    """Warm solves from any M on the CPU, with up to M rows kept, so the small systems of the tests take them."""
    monkeypatch.setitem(_warm.WARM_MIN_WIDTH, "cpu", 1)
    monkeypatch.setattr(_warm, "WARM_ROWS_PER_WIDTH", 1.0)


def streamed_router(solver: str = "auto", experts: int = 3, samples: int = 2000) -> AnalyticRouter:
    features, ids = clustered(samples + 400, 16, experts, seed=4)
    router = AnalyticRouter(16, experts, expansion_dim=300, ridge=RIDGE, solver=solver)
    router.update(features[:samples], ids[:samples])
    router.solve()  # the full solve whose factor the next ones start from
    router.update(features[samples:samples + 100], ids[samples:samples + 100])  # 5% more: a warm solve next
    router.stream = (features[samples + 100:], ids[samples + 100:])  # rows left for the test
    return router


def full_solution(router: AnalyticRouter) -> torch.Tensor:
    return _ridge.solve_cholesky(router.gram, router.cross, RIDGE).weights


@pytest.mark.parametrize("solver", ["auto", "mixed"])
def test_warm_solve_agrees_with_the_full_factorisation(warm_everywhere, solver):
    router = streamed_router(solver)
    warm = router.solve()
    assert router.solver_ == "warm" and router.solve_steps_ > 0
    assert_same_solution(warm, full_solution(router), router.gram_matrix(), RIDGE)


def test_a_stale_warm_solution_fails_the_bound(warm_everywhere, monkeypatch):
    """The planted bug: the warm start accepted without its convergence check returns the last solution after
    the one correction its estimated first residual gives."""
    router = streamed_router()
    monkeypatch.setattr(_ridge, "residual_converged", lambda *args: True)
    stale = router.solve()
    assert router.solver_ == "warm" and router.solve_steps_ == 1  # its first residual, no correction
    with pytest.raises(AssertionError, match="beyond float64 rounding"):
        assert_same_solution(stale, full_solution(router), router.gram_matrix(), RIDGE)


def test_the_first_residual_is_estimated_from_the_last_product_and_the_rows_since(warm_everywhere):
    """``G x`` at the last solve plus ``U^T (U x)`` for the rows recorded since is the residual's product up to
    the folds' rounding (float64 folds at this M), so the first correction needs no pass over ``G``. The
    estimate is computed in float64: a float32 ``U x`` would miss the bound below by orders of magnitude."""
    router = streamed_router()
    router.solve()  # warm: anchors its product
    features, ids = router.stream
    router.update(features[:60].float(), ids[:60])  # float32 features: rows kept exactly, as in a float32 model
    router.flush()
    start = _warm.widened(router._solution, router.cross.shape[1])
    estimate = router._warm.first_residual(router.cross, RIDGE, start)
    true = router.cross - router.gram_matrix() @ start - RIDGE * start
    assert float((estimate - true).abs().max()) <= 1e-10 * float(true.abs().max())
    router._warm.product_rows = router._warm.count  # the planted bug: the rows since are left out
    missed = router._warm.first_residual(router.cross, RIDGE, start)
    assert float((missed - true).abs().max()) > 1e-2 * float(true.abs().max())


def test_a_wrong_first_residual_costs_products_not_accuracy(warm_everywhere):
    router = streamed_router()
    router._warm.anchor(torch.zeros_like(router._solution))  # as if G x were zero at the last solve
    solution = router.solve()
    assert_same_solution(solution, full_solution(router), router.gram_matrix(), RIDGE)


def test_new_experts_start_from_zero_columns(warm_everywhere):
    router = streamed_router()
    features, ids = router.stream
    router.add_expert()
    router.update(features[:50], torch.full((50,), 3))
    warm = router.solve()
    assert router.solver_ == "warm" and warm.shape == (300, 4)
    assert_same_solution(warm, full_solution(router), router.gram_matrix(), RIDGE)


def test_more_rows_than_kept_or_samples_without_rows_factorise(warm_everywhere):
    features, ids = clustered(2000, 16, 3, seed=4)
    router = AnalyticRouter(16, 3, expansion_dim=300, ridge=RIDGE)
    router.update(features[:1000], ids[:1000])
    router.solve()
    assert router.solver_ == "cholesky"  # auto below 3,072 on a CPU; its factor is kept
    router.update(features[1000:1301], ids[1000:1301])  # 301 rows: one more than the 300 kept
    router.solve()
    assert router.solver_ == "cholesky"
    router.update(features[1301:1601], ids[1301:1601])  # exactly 300: warm
    router.solve()
    assert router.solver_ == "warm"
    other = AnalyticRouter(16, 3, expansion_dim=300, ridge=RIDGE)
    other.update(features[1601:1611], ids[1601:1611])
    router.merge_(other)  # samples whose rows the factor never saw
    router.solve()
    assert router.solver_ == "cholesky"


def test_a_changed_ridge_or_an_exact_solver_factorises(warm_everywhere):
    router = streamed_router()
    router.ridge = 2 * RIDGE
    router.solve()
    assert router.solver_ == "cholesky"
    for solver in ("cholesky", "eigh"):
        router.solver = solver
        router.update(*(t[:10] for t in router.stream))
        router.solve()
        assert router.solver_ == solver


def test_a_warm_solve_out_of_iterations_falls_back_and_refactorises(warm_everywhere, monkeypatch):
    router = streamed_router()
    monkeypatch.setattr(_warm, "WARM_MAX_ITERATIONS", 1)
    solution = router.solve()
    assert router.solver_ == "cholesky"
    assert router._warm is not None and router._warm.samples == router.num_samples  # the new factor
    assert_same_solution(solution, full_solution(router), router.gram_matrix(), RIDGE)


def test_a_slow_warm_solve_makes_the_next_one_full(warm_everywhere):
    router = streamed_router()
    router.solve()
    assert router.solver_ == "warm"
    router._warm.slow = True  # as after a solve that used over 3/4 of its iterations
    router.update(*(t[:10] for t in router.stream))
    router.solve()
    assert router.solver_ == "cholesky"


def test_the_width_rule_keeps_small_systems_and_other_devices_on_full_solves():
    assert not _warm.warm_enabled(torch.device("cpu"), _warm.WARM_MIN_WIDTH["cpu"] - 1)
    assert _warm.warm_enabled(torch.device("cpu"), _warm.WARM_MIN_WIDTH["cpu"])
    assert not _warm.warm_enabled(torch.device("cuda"), 10_000)  # not measured there
    for solver, path in (("auto", "cholesky"), ("mixed", "mixed")):
        router = streamed_router(solver)
        router.solve()
        assert router.solver_ == path and router._warm is None  # nothing kept where it cannot be used


def test_a_forgotten_factor_means_a_full_solve(warm_everywhere):
    router = streamed_router()
    router._forget_factor()
    router.solve()
    assert router.solver_ == "cholesky"


def test_warm_solves_inside_and_outside_inference_mode(warm_everywhere):
    router = streamed_router()
    features, ids = router.stream
    with torch.inference_mode():
        router.solve()  # allocates the triangular solves of the rows
        router.update(features[:10], ids[:10])  # the first rows kept since the factor
    router.update(features[10:20], ids[10:20])
    router.solve()
    assert router.solver_ == "warm"
    with torch.inference_mode():
        router.update(features[20:30], ids[20:30])
        warm = router.solve()
    assert router.solver_ == "warm"
    assert_same_solution(warm, full_solution(router), router.gram_matrix(), RIDGE)


def test_a_save_is_a_solve_boundary_so_a_resumed_router_solves_as_the_uninterrupted_one(warm_everywhere):
    """The warm factor is not saved: the run that saves and the run resumed from its checkpoint both solve in
    full next, then warm from the same factor, so their solutions stay the same bit for bit."""
    router = streamed_router()
    features, ids = router.stream
    checkpoint = router.state_dict()
    resumed = AnalyticRouter(16, 3, expansion_dim=300, ridge=RIDGE)
    resumed.load_state_dict(checkpoint)
    paths = {}
    for name, run in (("saved", router), ("resumed", resumed)):
        paths[name] = []
        for start in (0, 50):
            run.update(features[start:start + 50], ids[start:start + 50])
            run.solve()
            paths[name].append(run.solver_)
    assert paths["saved"] == paths["resumed"] and paths["saved"][1] == "warm"
    assert paths["saved"][0] != "warm"  # the save dropped the factor in the run that saved, too
    assert torch.equal(router.weight, resumed.weight)
