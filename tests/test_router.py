"""AnalyticRouter: exactness against a float64 batch ridge reference, caching, validation, state."""

from __future__ import annotations

import copy
import io
import warnings
from unittest import mock

import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from fly_modules import (
    AnalyticRouter,
    InvalidParameterError,
    NotFittedError,
    RandomExpansion,
    _compat,
    _ridge,
)


def reference_solution(router: AnalyticRouter, features: torch.Tensor, ids: torch.Tensor, ridge: float) -> np.ndarray:
    """Float64 batch ridge fit on the stacked data, with numpy/scipy only."""
    expansion = router.expansion.weight.double().numpy()
    x = features.double().numpy()
    phi = x @ expansion.T if router.expansion.out_features else x
    if router.expansion.out_features and router.expansion.activation == "relu":
        phi = np.maximum(phi, 0)
    targets = np.eye(router.num_experts)[ids.numpy()]
    system = phi.T @ phi + ridge * np.eye(phi.shape[1])
    return scipy.linalg.solve(system, phi.T @ targets, assume_a="pos")


def assert_same_state(state: dict, before: dict) -> None:
    assert state.keys() == before.keys()
    for key, value in state.items():
        assert torch.equal(value, before[key]) if isinstance(value, torch.Tensor) else value == before[key], key


def clustered(n: int, d: int, experts: int, seed: int = 0, dtype: torch.dtype = torch.float64):
    """Clustered features, float64 by default: the router expands float64 features with a float64
    product, so the exactness tests compare the statistics and solvers alone (the float32 product
    of float32 features has its own test)."""
    g = torch.Generator().manual_seed(seed)
    centers = 3 * torch.randn(experts, d, generator=g)
    ids = torch.randint(0, experts, (n,), generator=g)
    return (centers[ids] + torch.randn(n, d, generator=g)).to(dtype), ids


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    d=st.integers(1, 12),
    m=st.sampled_from([0, 7, 64, 300, 700]),
    experts=st.integers(1, 4),
    n=st.integers(1, 80),
    log_ridge=st.floats(-1, 3),
    per_sample=st.booleans(),
    solver=st.sampled_from(["auto", "cholesky", "eigh"]),
    panel_rows=st.sampled_from([512, 64, 5]),
    fold_rows=st.sampled_from([None, 1, 9]),
)
def test_any_chunking_equals_batch_reference(data, d, m, experts, n, log_ridge, per_sample, solver, panel_rows,
                                             fold_rows):
    with mock.patch.object(_ridge, "PANEL_ROWS", panel_rows):
        check_chunking(data, d, m, experts, n, log_ridge, per_sample, solver, fold_rows)


def check_chunking(data, d, m, experts, n, log_ridge, per_sample, solver, fold_rows=None):
    ridge = 10.0**log_ridge
    features, ids = clustered(n, d, experts, seed=data.draw(st.integers(0, 2**16)))
    router = AnalyticRouter(d, experts, expansion_dim=m, ridge=ridge, solver=solver, seed=data.draw(st.integers(0, 99)),
                            fold_rows=fold_rows)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))
    bounds = [0, *cuts, n]
    if not per_sample:
        ids = ids.clone()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if stop == start:
            continue
        if per_sample:
            router.update(features[start:stop], ids[start:stop])
        else:
            ids[start:stop] = ids[start]  # one expert id for the whole chunk
            router.update(features[start:stop], int(ids[start]))
    expected = reference_solution(router, features, ids, ridge)
    got = router.weight.t().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())


def test_panelled_update_crosses_panel_boundaries(monkeypatch):
    monkeypatch.setattr(_ridge, "PANEL_ROWS", 5)  # 23 rows -> panels of 5
    features, ids = clustered(40, 6, 3)
    router = AnalyticRouter(6, 3, expansion_dim=23, ridge=0.5)
    router.update(features[:17], ids[:17])
    router.update(features[17:], ids[17:])
    phi = router.expansion(features.double())
    torch.testing.assert_close(router.gram_matrix(), phi.t() @ phi, rtol=1e-12, atol=1e-9)
    assert torch.count_nonzero(torch.triu(router.gram, 5)) == 0  # nothing computed above the panels' diagonal blocks
    expected = reference_solution(router, features, ids, 0.5)
    for solver in ("mixed", "cholesky", "eigh"):
        router.solver = solver
        router._mark_stale()
        np.testing.assert_allclose(router.weight.t().numpy(), expected, rtol=1e-6, atol=1e-9)


def test_only_the_lower_triangle_of_the_statistics_is_read(monkeypatch):
    """The panel height is a tuning knob, not a storage format: statistics accumulated with other panels
    (an older checkpoint, another device) and garbage above the diagonal give the same answers."""
    features, ids = clustered(60, 6, 3)
    reference = AnalyticRouter(6, 3, expansion_dim=40, ridge=0.5)
    reference.update(features, ids)
    monkeypatch.setattr(_ridge, "PANEL_ROWS", 7)
    router = AnalyticRouter(6, 3, expansion_dim=40, ridge=0.5)
    router.update(features[:30], ids[:30])
    monkeypatch.setattr(_ridge, "PANEL_ROWS", 3)
    router.load_state_dict(router.state_dict())
    router.update(features[30:], ids[30:])
    router.flush()
    with torch.no_grad():
        upper = torch.ones_like(router.gram, dtype=torch.bool).triu(1)
        router.gram.masked_fill_(upper, float("nan"))  # any read of the upper triangle would show
    torch.testing.assert_close(router.gram_matrix(), reference.gram_matrix(), rtol=1e-12, atol=1e-9)
    expected = reference_solution(router, features, ids, 0.5)
    for solver in ("mixed", "cholesky", "eigh"):
        router.solver = solver
        router._mark_stale()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no silent fallback from mixed precision to float64
            np.testing.assert_allclose(router.weight.t().numpy(), expected, rtol=1e-6, atol=1e-9)
        assert router.solver_ == solver
    router.ridge = "auto"
    router._mark_stale()
    assert torch.isfinite(router.weight).all()


def test_solution_is_cached_until_statistics_change(monkeypatch):
    features, ids = clustered(50, 5, 2)
    router = AnalyticRouter(5, 2, expansion_dim=32, ridge=1.0)
    router.update(features, ids)
    calls = []
    original = router.solve
    monkeypatch.setattr(router, "solve", lambda: calls.append(1) or original())
    router(features)
    router.route(features)
    _ = router.weight
    assert len(calls) == 1
    router.add_expert()  # a new expert has zero weights: no re-solve
    assert router(features).shape == (50, 3)
    assert torch.all(router(features)[:, 2] == 0)
    assert len(calls) == 1
    router.update(features[:3], 0)
    router(features)
    assert len(calls) == 2
    scores = router(features)
    with torch.no_grad():
        router.cross.mul_(2.0)  # e.g. a user's own dist.all_reduce(router.cross): in place, not through us
    torch.testing.assert_close(router(features), 2 * scores)  # W is linear in Q
    assert len(calls) == 3


def test_route_never_picks_an_expert_without_samples():
    features, ids = clustered(60, 4, 2)
    router = AnalyticRouter(4, 3, expansion_dim=16, ridge=1.0)
    router.update(features, ids)
    # Crafted so that every trained expert scores negative: the untrained column scores exactly 0.
    router._solve_if_stale()
    router._solution[:, :2] = -1.0
    assert torch.all(router(features)[:, 2] == 0)
    assert set(router.route(features).tolist()) <= {0, 1}


def test_scores_cover_declared_and_added_experts():
    router = AnalyticRouter(4, 0, expansion_dim=8)
    with pytest.raises(NotFittedError, match="no experts"):
        router(torch.randn(2, 4))
    assert router.add_expert() == 0
    assert router.add_expert(2) == 2
    with pytest.raises(NotFittedError, match="call update"):
        router(torch.randn(2, 4))
    router.update(torch.randn(3, 4), 1)
    assert router(torch.randn(2, 4)).shape == (2, 3)
    assert router.route(torch.randn(5, 4)).tolist() == [1] * 5


def test_gcv_picks_the_minimiser_over_its_grid():
    features, ids = clustered(200, 6, 3)
    grid = [1e-3, 1e-1, 1e1, 1e3, 1e5]
    router = AnalyticRouter(6, 3, expansion_dim=50, ridge="auto", ridge_grid=grid)
    router.update(features, ids)
    router.solve()
    phi = router.expansion(features.double()).numpy()
    y = np.eye(3)[ids.numpy()]

    def gcv(lam):
        hat = phi @ np.linalg.solve(phi.T @ phi + lam * np.eye(50), phi.T)
        residual = y - hat @ y
        return len(y) * (residual**2).sum() / (len(y) - np.trace(hat)) ** 2

    assert router.ridge_ == grid[int(np.argmin([gcv(lam) for lam in grid]))]
    np.testing.assert_allclose(router.weight.t().numpy(), reference_solution(router, features, ids, router.ridge_), rtol=1e-6)


def test_merge_equals_one_router_fed_the_union():
    features, ids = clustered(90, 5, 3)
    whole = AnalyticRouter(5, 3, expansion_dim=40, ridge=2.0, seed=3)
    whole.update(features, ids)
    left = AnalyticRouter(5, 2, expansion_dim=40, ridge=2.0, seed=3)
    right = AnalyticRouter(5, 3, expansion_dim=40, ridge=2.0, seed=3)
    mask = ids < 2
    left.update(features[mask], ids[mask])
    right.update(features[~mask], ids[~mask])
    assert left.merge_(right) is left
    assert left.num_experts == 3
    whole.flush()
    torch.testing.assert_close(left.gram, whole.gram)
    torch.testing.assert_close(left.cross, whole.cross)
    assert torch.equal(left.counts, whole.counts)
    torch.testing.assert_close(left(features), whole(features))
    with pytest.raises(ValueError, match="different random expansions"):
        left.merge_(AnalyticRouter(5, 3, expansion_dim=40, seed=4))
    with pytest.raises(ValueError, match="differ in"):
        left.merge_(AnalyticRouter(5, 3, expansion_dim=41, seed=3))


def test_state_dict_round_trip_into_fresh_router_and_copies():
    features, ids = clustered(80, 6, 4)
    router = AnalyticRouter(6, 4, expansion_dim=30, ridge=1.5, seed=9)
    router.update(features, ids)
    scores = router(features)
    buffer = io.BytesIO()
    torch.save(router.state_dict(), buffer)
    buffer.seek(0)
    state = _compat.load_weights(buffer)
    assert "_solution" not in state  # the cache is not saved
    fresh = AnalyticRouter(6, 0, expansion_dim=30, ridge=1.5, seed=0)  # other seed, no experts
    fresh.load_state_dict(state)
    assert fresh.num_experts == 4
    assert torch.equal(fresh(features), scores)
    assert torch.equal(copy.deepcopy(router)(features), scores)


def test_to_dtype_and_float32_statistics():
    features, ids = clustered(40, 4, 2)
    router = AnalyticRouter(4, 2, expansion_dim=20, ridge=1.0, stats_dtype=torch.float32)
    router.update(features, ids)
    assert router.gram.dtype == torch.float32 and router(features).dtype == torch.float32
    router64 = AnalyticRouter(4, 2, expansion_dim=20, ridge=1.0)
    router64.update(features, ids)
    torch.testing.assert_close(router(features).double(), router64(features), rtol=1e-4, atol=1e-4)
    converted = copy.deepcopy(router64).to(torch.float32)
    assert converted.gram.dtype == torch.float32
    torch.testing.assert_close(converted(features).double(), router64(features), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cast", [torch.float16, torch.bfloat16])
def test_half_precision_casts_keep_the_statistics_solvable(cast):
    """A parent model's .half() must not round G (the solve needs float32 at least)."""
    features, ids = clustered(40, 4, 2)
    router = AnalyticRouter(4, 2, expansion_dim=20, ridge=1.0)
    router.update(features, ids)
    expected = router(features)
    parent = nn.Sequential(nn.Linear(4, 4), router).to(cast)
    assert parent[0].weight.dtype == cast
    assert {router.gram.dtype, router.cross.dtype, router.expansion.weight.dtype} == {torch.float64}
    torch.testing.assert_close(router(features.to(cast)), router.expansion(features.to(cast)) @ router.solve())
    torch.testing.assert_close(router(features), expected)


@pytest.mark.parametrize("stats_dtype, scale", [(torch.float32, 1e30), (torch.float64, 1e200)])
def test_features_that_overflow_the_statistics_are_rejected(stats_dtype, scale):
    router = AnalyticRouter(3, 2, expansion_dim=10, ridge=1.0, stats_dtype=stats_dtype)
    router.update(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
    before = copy.deepcopy(router.state_dict())
    with pytest.raises(ValueError, match="overflow"):
        router.update(torch.full((2, 3), scale, dtype=torch.float64), 0)  # finite as given
    assert_same_state(router.state_dict(), before)


def test_same_seed_same_expansion_and_other_seed_differs():
    a, b, c = (RandomExpansion(5, 11, seed=s) for s in (1, 1, 2))
    assert torch.equal(a.weight, b.weight) and not torch.equal(a.weight, c.weight)
    assert torch.equal(RandomExpansion(5, 11, seed=1, dtype=torch.float64).weight.float(), a.weight)


@pytest.mark.parametrize(
    "features, ids, error, match",
    [
        (torch.tensor([[float("nan"), 0, 0]]), 0, ValueError, "1 NaN"),
        (torch.tensor([[float("inf"), 0, 0]]), 0, ValueError, "1 infinite"),
        (torch.zeros(2, 4), 0, ValueError, "4 columns"),
        (torch.zeros(3), 0, ValueError, "unsqueeze"),
        (torch.zeros(2, 3, 1), 0, ValueError, "3-d tensor"),
        (torch.zeros(0, 3), 0, ValueError, "empty batch"),
        (torch.zeros(2, 3, dtype=torch.long), 0, TypeError, "floating point"),
        (torch.zeros(2, 3), -1, ValueError, "non-negative"),
        (torch.zeros(2, 3), 2, ValueError, "does not exist"),
        (torch.zeros(2, 3), torch.tensor([0, 1, 1]), ValueError, "3 expert ids for a batch of 2"),
        (torch.zeros(2, 3), torch.tensor([0.0, 1.0]), TypeError, "integers"),
        ([[0.0, 0.0, 0.0]], 0, TypeError, "torch.Tensor"),
    ],
)
def test_bad_input_is_rejected_and_leaves_statistics_unchanged(features, ids, error, match):
    router = AnalyticRouter(3, 2, expansion_dim=10, ridge=1.0)
    router.update(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
    before = copy.deepcopy(router.state_dict())
    with pytest.raises(error, match=match):
        router.update(features, ids)
    assert_same_state(router.state_dict(), before)


def test_constructor_validation():
    with pytest.raises(ValueError, match="ridge must be a finite number > 0 or .auto., got 0.0"):
        AnalyticRouter(3, ridge=0.0)
    with pytest.raises(ValueError, match="'auto'"):
        AnalyticRouter(3, ridge="gcv")
    with pytest.raises(ValueError, match="solver must be one of"):
        AnalyticRouter(3, solver="lu")
    with pytest.raises(TypeError, match="stats_dtype"):
        AnalyticRouter(3, stats_dtype=torch.float16)
    with pytest.raises(ValueError, match="activation"):
        AnalyticRouter(3, activation="tanh")


def test_wrong_device_is_a_clear_error():
    router = AnalyticRouter(3, 1, expansion_dim=4)
    with pytest.raises(ValueError, match="are on meta but the module's state is on cpu"):
        router.update(torch.zeros(2, 3, device="meta"), 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"in_features": 0},
        {"in_features": 3.0},
        {"num_experts": True},
        {"num_experts": -1},
        {"expansion_dim": -1},
        {"ridge": True},
        {"ridge": float("inf")},
        {"ridge_grid": []},
        {"ridge_grid": [1.0, -1.0]},
        {"solver": None},
        {"stats_dtype": "float64"},
        {"seed": 1.5},
        {"activation": "tanh"},
    ],
)
def test_every_parameter_error_is_an_invalid_parameter_error(kwargs):
    arguments = {"in_features": 3, **kwargs}
    with pytest.raises(InvalidParameterError):
        AnalyticRouter(**arguments)


def test_integer_parameters_accept_numpy_integers():
    router = AnalyticRouter(np.int64(3), np.int32(1), expansion_dim=np.int64(8), seed=np.int64(2))
    assert router.add_expert(np.int16(2)) == 2
    assert router.in_features == 3 and router.expansion.seed == 2 and type(router.expansion.seed) is int
    with pytest.raises(InvalidParameterError, match="count must be an int >= 1"):
        router.add_expert(0)


def fitted_router(**kwargs) -> AnalyticRouter:
    features, ids = clustered(32, 6, 3)
    router = AnalyticRouter(6, 3, **{"expansion_dim": 40, "ridge": 1e4, **kwargs})
    router.update(features, ids)
    return router


@pytest.mark.parametrize(
    "target, match",
    [
        (dict(expansion_dim=30), r"checkpoint entry expansion.weight has shape \(40, 6\) but this module expects \(30, 6\)"),
        (dict(ridge=5.0), r"saved with ridge=10000.0 but this module has ridge=5.0; build the router with the checkpoint"),
        (dict(ridge="auto"), r"saved with ridge=10000.0 but this module has ridge='auto'"),
        (dict(solver="eigh"), r"saved with solver='auto' but this module has solver='eigh'"),
        (dict(activation="identity"), r"saved with activation='relu' but this module has activation='identity'"),
    ],
)
def test_mismatched_checkpoint_is_refused_and_changes_nothing(target, match):
    state = fitted_router().state_dict()
    router = AnalyticRouter(6, 1, **{"expansion_dim": 40, "ridge": 1e4, **target})
    before = copy.deepcopy(router.state_dict())
    with pytest.raises(InvalidParameterError, match=match) as caught:
        router.load_state_dict(state)
    assert "\n" not in str(caught.value)
    assert_same_state(router.state_dict(), before)
    assert router.num_samples == 0 and router.num_experts == 1
    with pytest.raises(NotFittedError):
        router(torch.randn(2, 6))


def test_settings_travel_with_the_checkpoint_and_the_seed_is_adopted():
    source = fitted_router(ridge="auto", ridge_grid=[1.0, 10.0], solver="eigh", seed=7)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    state = _compat.load_weights(buffer)
    assert state["_extra_state"] == {
        "ridge": "auto", "ridge_grid": [1.0, 10.0], "solver": "eigh", "activation": "relu", "seed": 7
    }
    router = AnalyticRouter(6, 0, expansion_dim=40, ridge="auto", ridge_grid=[1.0, 10.0], solver="eigh", seed=0)
    router.load_state_dict(state)
    assert router.expansion.seed == 7
    features = torch.randn(5, 6)
    torch.testing.assert_close(router(features), source(features))
    with pytest.raises(InvalidParameterError, match=r"ridge_grid=\[1.0, 10.0\] but this module has ridge_grid=None"):
        AnalyticRouter(6, 0, expansion_dim=40, ridge="auto", solver="eigh").load_state_dict(state)


@pytest.mark.parametrize("version", [1, None])  # None: no metadata, as from a safetensors file
def test_checkpoints_without_settings_load_with_the_routers_own(version):
    state = fitted_router().state_dict()
    del state["_extra_state"]
    if version is None:
        del state._metadata
    else:
        state._metadata[""]["version"] = version
    router = AnalyticRouter(6, 0, expansion_dim=40, ridge=5.0)  # such a checkpoint cannot say its ridge: ours stays
    assert router.load_state_dict(state).missing_keys == []
    assert router.ridge == 5.0 and router.num_samples == 32


def test_partial_checkpoint_is_refused_and_an_absent_router_is_skipped_without_strict():
    state = fitted_router().state_dict()
    router = AnalyticRouter(6, 3, expansion_dim=40, ridge=1e4)
    with pytest.raises(InvalidParameterError, match=r"lacks \['counts'\]"):
        router.load_state_dict({k: v for k, v in state.items() if k != "counts"}, strict=False)
    parent = nn.Sequential(nn.Linear(6, 6), router)
    result = parent.load_state_dict(nn.Sequential(nn.Linear(6, 6)).state_dict(), strict=False)
    assert router.num_samples == 0 and "1.gram" in result.missing_keys
    parent.load_state_dict({**{f"1.{k}": v for k, v in state.items()}, **nn.Linear(6, 6).state_dict(prefix="0.")})
    assert router.num_samples == 32


def test_float32_features_are_expanded_in_float32_within_the_rounding_bound():
    """The float32 product against the float64 product of the same numbers, with worst-case bounds that
    hold for any summation order (so on any CPU): a length-d dot product in float32 is within
    gamma = d u / (1 - d u), u = 2^-24, of the exact one relative to sum_k |h_k||R_jk|; G and Q inherit it."""
    d, m, n = 48, 200, 300
    features, ids = clustered(n, d, 3, dtype=torch.float32)
    wide = AnalyticRouter(d, 3, expansion_dim=m, ridge=1.0)
    narrow = AnalyticRouter(d, 3, expansion_dim=m, ridge=1.0)
    wide.update(features.double(), ids)  # exactly the same numbers, float64 product
    narrow.update(features, ids)
    u = 2.0**-24
    gamma = d * u / (1 - d * u)
    accumulation = 2 * n * torch.finfo(torch.float64).eps  # both sums run in float64
    magnitude = features.double().abs() @ wide.expansion.weight.abs().t()  # (n, m): bounds |phi| and its error
    phi_error = (narrow.expansion(features) - wide.expansion(features.double())).abs()
    assert bool((phi_error <= gamma * magnitude).all())
    gram_bound = (2 * gamma + gamma**2 + accumulation) * (magnitude.t() @ magnitude)
    narrow.flush()
    wide.flush()
    assert bool((torch.tril(narrow.gram - wide.gram).abs() <= torch.tril(gram_bound)).all())
    onehot = torch.nn.functional.one_hot(ids, 3).double()
    assert bool(((narrow.cross - wide.cross).abs() <= (gamma + accumulation) * (magnitude.t() @ onehot)).all())
    assert narrow.expansion(features).dtype == torch.float64
    # Routing: the smallest top-2 margin of these queries is ~9e-4 and the score errors are ~4e-6 (a
    # float32 rounding amplified by cond(G + ridge I)), 200x apart: no route can flip on any CPU.
    queries, _ = clustered(200, d, 3, seed=1, dtype=torch.float32)
    reference = wide(queries.double())
    top2 = reference.topk(2, dim=1).values
    assert float((narrow(queries) - reference).abs().max()) <= 0.1 * float((top2[:, 0] - top2[:, 1]).min())
    assert torch.equal(narrow.route(queries), wide.route(queries.double()))


@pytest.mark.parametrize("scale", [1e25, 1e-25])
def test_features_beyond_the_float32_range_are_expanded_in_float64(scale):
    features, ids = clustered(20, 4, 2, dtype=torch.float32)
    features = features * scale  # finite float32 numbers whose float32 product would overflow / underflow
    wide = AnalyticRouter(4, 2, expansion_dim=16, ridge=scale**2)
    narrow = AnalyticRouter(4, 2, expansion_dim=16, ridge=scale**2)
    wide.update(features.double(), ids)
    narrow.update(features, ids)
    narrow.flush()
    wide.flush()
    assert narrow.num_samples and torch.count_nonzero(narrow.gram)
    assert torch.equal(narrow.gram, wide.gram) and bool(torch.isfinite(narrow.gram).all())
    assert torch.equal(narrow(features), wide(features.double()))


def test_reduced_precision_float32_matmuls_keep_the_float64_product():
    """With float32 matmuls allowed to round to bfloat16 (or TF32 on a GPU), the float32 product is not exact
    enough: the router multiplies in float64 then. Set per backend where torch has it (2.9), else globally."""
    features, _ = clustered(8, 4, 2, dtype=torch.float32)
    router = AnalyticRouter(4, 1, expansion_dim=16)
    backend = getattr(torch.backends.mkldnn, "matmul", None)
    per_backend = getattr(backend, "fp32_precision", None) is not None
    before = backend.fp32_precision if per_backend else torch.get_float32_matmul_precision()
    try:
        if per_backend:
            backend.fp32_precision = "bf16"
        else:
            torch.set_float32_matmul_precision("medium")
        assert torch.equal(router.expansion(features), router.expansion(features.double()))
    finally:
        if per_backend:
            backend.fp32_precision = before
        else:
            torch.set_float32_matmul_precision(before)
    assert torch.equal(router.expansion(features), torch.relu(features @ router.expansion.weight.float().t()).double())
