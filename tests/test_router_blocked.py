"""The router's blocked statistics update: rows wait in a bounded buffer and are folded into G and Q in one
rank-k update; everything that reads the statistics sees every row added so far."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from fold_log import FoldLog
from ridge_bounds import assert_same_solution

from fly_modules import AnalyticRouter, InvalidParameterError, _blocked, _compat, _ridge

D, M, EXPERTS = 6, 40, 3


def stream(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centers = 3 * torch.randn(EXPERTS, D, generator=g, dtype=torch.float64)
    ids = torch.randint(0, EXPERTS, (n,), generator=g)
    return centers[ids] + torch.randn(n, D, generator=g, dtype=torch.float64), ids


def feed(router: AnalyticRouter, features: torch.Tensor, ids: torch.Tensor, sizes) -> None:
    start = 0
    for size in sizes:
        router.update(features[start:start + size], ids[start:start + size])
        start += size
    assert start == features.shape[0]


def assert_float64_statistics(router: AnalyticRouter, features: torch.Tensor, ids: torch.Tensor) -> None:
    """G and Q against the float64 sums of the whole stream, within worst-case rounding bounds that hold
    for any summation order (so on any CPU): with a = |h| |R|^T >= |phi|, each float64 dot product of
    the expansion is within gamma_d a of the exact one, and each sum of n terms within 2 n eps of it."""
    router.flush()
    eps = torch.finfo(torch.float64).eps
    gamma = D * eps / (1 - D * eps)
    phi = router.expansion(features)
    magnitude = features.abs() @ router.expansion.weight.abs().t()
    onehot = torch.nn.functional.one_hot(ids, EXPERTS).double()
    tolerance = 2 * gamma + gamma**2 + 2 * features.shape[0] * eps
    gram_error = torch.tril(router.gram - phi.t() @ phi).abs()
    assert bool((gram_error <= torch.tril(tolerance * (magnitude.t() @ magnitude))).all())
    assert bool(((router.cross - phi.t() @ onehot).abs() <= tolerance * (magnitude.t() @ onehot)).all())
    assert torch.equal(router.counts, torch.bincount(ids, minlength=EXPERTS))


def test_rows_wait_in_the_buffer_until_flush_and_a_read_changes_nothing():
    features, ids = stream(70)
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    feed(router, features[:10], ids[:10], [4, 6])
    assert router.pending_rows == 10 and router.num_samples == 10
    assert torch.count_nonzero(router.gram) == torch.count_nonzero(router.cross) == 0  # nothing folded yet
    assert router.pending_rows == 10  # reading the buffers folds nothing
    router.flush()
    assert router.pending_rows == 0 and torch.count_nonzero(router.gram) > 0
    assert_float64_statistics(router, features[:10], ids[:10])
    # Appends that would overflow the buffer fold first; a batch as large as the buffer goes straight in.
    feed(router, features[10:], ids[10:], [9, 9, 20, 3, 15, 4])
    assert 0 < router.pending_rows < 16
    assert_float64_statistics(router, features, ids)


@pytest.mark.parametrize("fold_rows", [None, 1, 7, 64])
def test_solve_sees_the_pending_rows(fold_rows):
    features, ids = stream(50)
    blocked = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=fold_rows)
    per_batch = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=1)
    for router in (blocked, per_batch):
        feed(router, features, ids, [5] * 10)
    assert_same_solution(blocked.weight, per_batch.weight, per_batch.gram_matrix(), 1.0)
    assert blocked.pending_rows == 0


def test_the_buffer_size_rule_and_its_memory_bound():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert _blocked.default_fold_rows(10_000, cpu) == 512 and _blocked.default_fold_rows(10_000, gpu) == 1024
    assert _blocked.default_fold_rows(64, cpu) == 64 and _blocked.default_fold_rows(2_048, cpu) == 256
    for width in (1, 64, 700, 4_096, 10_000, 50_000):
        for device in (cpu, gpu):
            rows = _blocked.default_fold_rows(width, device)
            assert rows * width <= max(64 * width, width * width / 8)
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0)
    assert router.pending_bytes == 0  # allocated on the first update
    router.update(*stream(3))
    assert router.pending_bytes == 64 * M * 8 + 64 * 8  # 64 float64 rows of phi and their int64 ids


def test_state_dict_holds_every_row_and_a_resumed_run_folds_where_the_uninterrupted_one_does(monkeypatch):
    features, ids = stream(90)
    folds = FoldLog(monkeypatch)
    whole = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    feed(whole, features, ids, [5] * 18)
    whole.flush()
    uninterrupted = folds.take()

    run = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    feed(run, features[:35], ids[:35], [5] * 7)
    assert run.pending_rows == 5
    buffer = io.BytesIO()
    torch.save(run.state_dict(), buffer)
    assert run.pending_rows == 5 and folds.sizes == [15, 15]  # saving folds nothing
    buffer.seek(0)
    resumed = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    resumed.update(features[:3], ids[:3])  # rows of another run, replaced by the checkpoint's
    resumed.load_state_dict(_compat.load_weights(buffer))
    assert resumed.pending_rows == 5 and resumed.num_samples == 35
    assert_float64_statistics(copy.deepcopy(resumed), features[:35], ids[:35])
    del folds.sizes[2:]  # the copy's fold
    feed(resumed, features[35:], ids[35:], [5] * 11)
    resumed.flush()
    assert folds.sizes == uninterrupted  # the same summation history, so the same bits on any CPU
    for name in ("gram", "cross", "counts"):
        assert torch.equal(getattr(whole, name), getattr(resumed, name)), name
    assert torch.equal(whole.weight, resumed.weight)


def test_a_checkpoint_before_pending_rows_were_saved_still_loads():
    features, ids = stream(20)
    old = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    old.update(features, ids)
    old.flush()
    state = {k: v for k, v in old.state_dict().items() if not k.startswith("pending_")}  # version 2's entries
    loaded = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    loaded.update(features[:4], ids[:4])
    loaded.load_state_dict(state)
    assert loaded.pending_rows == 0
    assert_float64_statistics(loaded, features, ids)


@pytest.mark.parametrize("fault, match", [
    (lambda s: s.pop("pending_ids"), "lacks"),
    (lambda s: s.update(pending_phi=s["pending_phi"][:, :-1]), "pending_phi has shape"),
    (lambda s: s.update(pending_ids=s["pending_ids"][:-1]), "pending_ids has shape"),
    (lambda s: s.update(pending_ids=s["pending_ids"].double()), "integer dtype"),
    (lambda s: s.update(pending_ids=s["pending_ids"] + EXPERTS), "outside 0..2"),
])
def test_damaged_pending_rows_are_refused_before_anything_changes(fault, match):
    features, ids = stream(12)
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    router.update(features[:7], ids[:7])
    state = router.state_dict()
    fault(state)
    other = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    other.update(features[7:], ids[7:])
    with pytest.raises(InvalidParameterError, match=match):
        other.load_state_dict(state)
    assert other.pending_rows == 5
    assert_float64_statistics(other, features[7:], ids[7:])


def test_a_move_that_changes_nothing_folds_nothing_and_a_real_one_folds_first():
    features, ids = stream(12)
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    router.update(features, ids)
    router.to("cpu").to(torch.float64).cpu().double().half()  # a framework's per-experience model.to(device)
    assert router.pending_rows == 12
    router.float()
    assert router.pending_rows == 0 and router.gram.dtype == torch.float32


def test_a_refused_checkpoint_keeps_the_pending_rows():
    features, ids = stream(20)
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    router.update(features[:8], ids[:8])
    state = AnalyticRouter(D, EXPERTS, expansion_dim=M + 1, ridge=1.0).state_dict()
    with pytest.raises(InvalidParameterError):
        router.load_state_dict(state)
    assert router.pending_rows == 8
    assert_float64_statistics(router, features[:8], ids[:8])


def test_merge_reset_copies_and_casts_fold_or_drop_the_pending_rows():
    features, ids = stream(40)
    left = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=32)
    right = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=32)
    left.update(features[:15], ids[:15])
    right.update(features[15:], ids[15:])
    twin = copy.deepcopy(right)
    assert twin.pending_rows == right.pending_rows == 25
    left.merge_(right)  # both sides fold
    assert left.pending_rows == right.pending_rows == 0
    assert_float64_statistics(left, features, ids)
    assert_float64_statistics(twin, features[15:], ids[15:])
    narrow = copy.deepcopy(twin)
    narrow.update(features[:2], ids[:2])
    narrow.float()  # folded in float64 first, then cast
    assert narrow.gram.dtype == torch.float32 and narrow.pending_rows == 0 and narrow.pending_bytes == 0
    phi = twin.expansion(torch.cat([features[15:], features[:2]]))
    torch.testing.assert_close(torch.tril(narrow.gram), torch.tril(phi.t() @ phi).float())
    twin.update(features[:3], ids[:3])
    twin.reset_statistics()  # the pending rows go with the statistics
    assert twin.pending_rows == 0 and twin.num_samples == 0 and torch.count_nonzero(twin.gram) == 0


def test_rows_added_in_inference_mode_can_be_followed_by_rows_outside_it():
    features, ids = stream(12)
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=32)
    with torch.inference_mode():
        router.update(features[:6], ids[:6])  # allocates the buffer
    router.update(features[6:], ids[6:])
    assert_float64_statistics(router, features, ids)


def test_fold_rows_is_validated_and_a_change_takes_effect_at_the_next_update():
    with pytest.raises(InvalidParameterError, match="fold_rows"):
        AnalyticRouter(D, EXPERTS, expansion_dim=M, fold_rows=0)
    features, ids = stream(30)
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    router.update(features[:10], ids[:10])
    router.fold_rows = 4
    router.update(features[10:12], ids[10:12])
    assert router.pending_rows == 2 and router._pending.capacity == 4
    router.update(features[12:], ids[12:])
    assert_float64_statistics(router, features, ids)


def test_the_device_property_does_not_fold():
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0, fold_rows=16)
    router.update(*stream(5))
    assert router.device == torch.device("cpu") and router.stats_dtype == torch.float64
    assert router.pending_rows == 5


def test_auto_solver_rule_per_device_and_width(monkeypatch):
    cpu = torch.device("cpu")
    assert _ridge.preferred_solver(cpu, 4_096) == "mixed" and _ridge.preferred_solver(cpu, 2_048) == "cholesky"
    for capability, expected in (((9, 0), "cholesky"), ((8, 0), "cholesky"), ((8, 6), "mixed"), ((8, 9), "mixed")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert _ridge.preferred_solver(torch.device("cuda"), 10_000) == expected, capability


def test_auto_solver_follows_the_rule_and_matches_the_other_path():
    features, ids = stream(200)
    router = AnalyticRouter(D, EXPERTS, expansion_dim=M, ridge=1.0)
    router.update(features, ids)
    weights = router.weight.t()
    assert router.solver_ == _ridge.preferred_solver(router.device, M) == "cholesky"
    mixed = _ridge.solve_mixed(router.gram, router.cross, 1.0)
    assert_same_solution(weights, mixed.weights, router.gram_matrix(), 1.0)

