"""The core's CUDA paths against CPU float64 references (``pytest -m cuda``; skipped without a GPU).

Every tolerance is a worst-case rounding bound, written next to its assertion, so it holds on any GPU.
torch's default IEEE float32 matmuls are assumed (the tests check that nothing switched TF32 on).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from fly_modules import AGGREGATION_RULES, AnalyticRouter, TemporalEnsembleHead, seen_class_mask

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def ieee_float32_matmuls():
    assert not torch.backends.cuda.matmul.allow_tf32, "TF32 matmuls are on: the float32 tolerances assume IEEE"


def clustered(n: int, d: int, experts: int, seed: int = 0):
    """float64 features holding float32 values (either dtype carries the same numbers), and expert ids."""
    generator = torch.Generator().manual_seed(seed)
    centers = 3 * torch.randn(experts, d, generator=generator)
    ids = torch.randint(0, experts, (n,), generator=generator)
    return (centers[ids] + torch.randn(n, d, generator=generator)).double(), ids


@pytest.mark.parametrize("solver", ["auto", "cholesky", "eigh"])
@pytest.mark.parametrize("stats_dtype", [torch.float64, torch.float32])
def test_router_on_cuda_equals_the_cpu_float64_reference(stats_dtype, solver):
    n, d, m, experts, ridge = 600, 32, 256, 4, 3e5  # condition number 46: float32 bound 0.005
    features, ids = clustered(n, d, experts)
    reference = AnalyticRouter(d, experts, expansion_dim=m, ridge=ridge)
    reference.update(features, ids)
    router = AnalyticRouter(d, experts, expansion_dim=m, ridge=ridge, solver=solver, stats_dtype=stats_dtype, device=CUDA)
    for start in range(0, n, 128):  # batches, as in training
        router.update(features[start:start + 128].to(CUDA), ids[start:start + 128].to(CUDA))
    eigenvalues = torch.linalg.eigvalsh(reference.gram_matrix())
    condition = float((eigenvalues.max() + ridge) / (eigenvalues.min().clamp_min(0) + ridge))
    # Forward error of W: accumulating n non-negative terms perturbs G by at most n u relative (ReLU
    # features: |Phi|^T |Phi| = G), the factorisation by about m u, and W moves by cond times that.
    u = torch.finfo(stats_dtype).eps
    bound = condition * (n + m) * u
    assert bound < 0.01, "the test's system must be well enough conditioned for the bound to mean something"
    expected = reference.weight.t()  # (M, experts)
    error = float((router.weight.t().cpu().double() - expected).abs().max())
    assert error <= bound * float(expected.abs().max())
    # Scores s = phi W: |ds| <= sum_j |phi_j| |dW_j| plus the products' own rounding (below bound, as
    # bound >= (m + d) u): twice the first term covers both.
    queries, _ = clustered(64, d, experts, seed=1)
    phi = reference.expansion(queries)
    got = router(queries.to(CUDA).to(stats_dtype)).cpu().double()
    allowed = 2 * bound * float(expected.abs().max()) * phi.abs().sum(dim=1, keepdim=True)
    assert bool(((got - reference(queries)).abs() <= allowed).all())
    assert router.counts.cpu().tolist() == reference.counts.tolist()


def test_float32_features_on_cuda_are_expanded_within_the_rounding_bound():
    d, m = 48, 200
    features, ids = clustered(300, d, 3)
    router = AnalyticRouter(d, 3, expansion_dim=m, ridge=1.0, device=CUDA)
    narrow = router.expansion(features.float().to(CUDA)).cpu()
    weight = router.expansion.weight.cpu()
    wide = torch.relu(features @ weight.t())  # the float64 product on the CPU
    u = 2.0**-24
    gamma = d * u / (1 - d * u)  # a length-d float32 dot product, any summation order
    magnitude = features.abs() @ weight.abs().t()
    assert bool(((narrow - wide).abs() <= gamma * magnitude).all())


def naive_scores(ensemble: TemporalEnsembleHead, features, ids, mask, rule):
    """Per-sample reference in float64 on the CPU: the online head and the sample's expert's copies.

    Also returns, per sample, the largest ``sum_k |w_ck x_k| + |b_c|`` over its members: the scale of the
    float32 logits' rounding error."""
    weight, bias = ensemble.online.weight.detach().cpu().double(), ensemble.online.bias.detach().cpu().double()
    bank, bank_bias = ensemble.ema_weight.cpu().double(), ensemble.ema_bias.cpu().double()
    rows, scales = [], []
    for x, e in zip(features.cpu().double(), ids.tolist()):
        members = [(weight, bias)] + [(bank[e, k], bank_bias[e, k]) for k in range(bank.shape[1])]
        logits = torch.stack([w @ x + b for w, b in members])
        scales.append(max(float((w.abs() @ x.abs() + b.abs()).max()) for w, b in members))
        logits = logits + mask.cpu().double()
        probs = logits.softmax(-1)
        entropy = torch.special.entr(probs).sum(-1)
        rows.append({
            "mean": logits.mean(0), "max_prob": logits.max(0).values, "min_entropy": logits[entropy.argmin()],
            "softmax_mean": probs.mean(0), "softmax_max": probs.max(0).values,
            "softmax_min_entropy": probs[entropy.argmin()],
            "logit_min_entropy": logits[_first_nan_else_least(-(logits * (logits + 1e-8).log()).sum(-1))],
        }[rule])
    return torch.stack(rows), torch.tensor(scales, dtype=torch.float64).unsqueeze(1)


def _first_nan_else_least(values: torch.Tensor) -> int:
    """FlyGCL's min_entropy choice: the first NaN member (a negative or masked logit), else the least."""
    nans = values.isnan().nonzero()
    return int(nans[0]) if len(nans) else int(values.argmin())


def trained_ensemble(rule: str) -> TemporalEnsembleHead:
    torch.manual_seed(0)
    ensemble = TemporalEnsembleHead(nn.Linear(16, 10), 3, decays=(0.5, 0.9), aggregate=rule)
    for expert in range(3):
        ensemble.start_expert(expert)
        for _ in range(3):
            with torch.no_grad():
                ensemble.online.weight.add_(0.1 * torch.randn_like(ensemble.online.weight))
            ensemble.update()
    return ensemble.to(CUDA)


@pytest.mark.parametrize("rule", AGGREGATION_RULES)
def test_ensemble_device_path_equals_the_per_sample_reference(rule):
    ensemble = trained_ensemble(rule)
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(64, 16, generator=generator)
    ids = torch.randint(0, 3, (64,), generator=generator)
    mask = seen_class_mask(7, 10)
    got = ensemble(features.to(CUDA), ids.to(CUDA), mask.to(CUDA)).cpu().double()
    expected, scale = naive_scores(ensemble, features, ids, mask, rule)
    # float32 logits (16 products and a bias) are within gamma_17 = 17 u / (1 - 17 u) of the float64
    # ones relative to sum |w||x| + |b|, in any summation order; a softmax moves by at most as much as
    # its largest logit error, and the min-entropy rules pick the same member unless two entropies tie
    # within that error. Masked classes are -inf (or 0 after a softmax) in both.
    u = 2.0**-24
    allowed = 2 * (17 * u / (1 - 17 * u)) * scale.expand_as(expected)
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(got))
    assert bool(((got - expected).abs()[finite] <= allowed[finite]).all())


def test_ensemble_hot_path_does_not_synchronise_the_host():
    ensemble = trained_ensemble("softmax_max")
    features = torch.randn(256, 16, device=CUDA)
    ids = torch.randint(0, 3, (256,), device=CUDA)
    mask = seen_class_mask(7, 10, device=CUDA)
    ensemble(features, ids, mask)  # warm-up: lazy CUDA initialisation may synchronise once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call below raises
    try:
        for rule in AGGREGATION_RULES:
            ensemble.aggregate = rule
            ensemble(features, ids, mask)
            ensemble(features, 2, mask)
        ensemble(features)  # the training path
        ensemble.update()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    checked = TemporalEnsembleHead(nn.Linear(16, 10), 3, check_values=True).to(CUDA)
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="synchroniz"):  # the check can fail: value checks read on the host
        torch.cuda.set_sync_debug_mode("error")
        try:
            checked(features, ids)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_an_update_on_cuda_reads_the_device_once():
    """One host read per update (the features' finiteness and peak together); the overflow check of
    phi is settled by a bound, and the fold itself never synchronises."""
    features, _ = clustered(16, 6, 3)
    router = AnalyticRouter(6, 3, expansion_dim=40, ridge=1.0, fold_rows=16, device=CUDA)
    features = features.float().to(CUDA)
    router.update(features[:8], 0)  # allocations and kernels loaded
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            router.update(features[8:16], 1)  # fills the buffer: a fold
        finally:
            torch.cuda.set_sync_debug_mode("default")
    synchronising = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(synchronising) == 1, [str(w.message) for w in synchronising]
