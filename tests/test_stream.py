"""Tests of benchmarks.core.stream: pinned streams, invariants, edge cases, batching, sharding, exposure.

The pinned digests in ``tests/fixtures/si_blurry_streams.json`` were produced by
``python tests/test_stream.py --regenerate`` and checked, before being committed, against an
independent list-based replay of the reference sampler (FlyGCL ``OnlineSampler``) on the same
label vectors: every session order matched element for element.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.core.stream import SiBlurryStream, check_label_vector
from benchmarks.core.stream_draw import build_si_blurry_stream
from fly_modules import InvalidParameterError, SampleBudgetSchedule

FIXTURE = Path(__file__).parent / "fixtures" / "si_blurry_streams.json"


# ----------------------------------------------------------------------------------------------------
# Label vectors of the pinned streams (closed-form, so they never depend on an RNG implementation)
# ----------------------------------------------------------------------------------------------------


def cifar_like_labels() -> torch.Tensor:
    """100 classes x 500 samples, interleaved (CIFAR-100-sized, shuffled-looking order)."""
    return torch.arange(50_000) % 100


def imagenet_r_like_labels() -> torch.Tensor:
    """200 classes with 60..149 samples each, sorted by class (ImageFolder order, like ImageNet-R)."""
    counts = 60 + (torch.arange(200) * 37) % 90
    return torch.repeat_interleave(torch.arange(200), counts)


LABEL_VECTORS = {"cifar_like_100": cifar_like_labels, "imagenet_r_like_200": imagenet_r_like_labels}


def _pinned_configs():
    configs = []
    for labels in LABEL_VECTORS:
        for seed in range(1, 6):  # the paper protocol, seeds 1-5
            configs.append(
                dict(labels=labels, seed=seed, num_sessions=5, disjoint_ratio=0.5, blurry_ratio=0.1, split="random")
            )
        for extra in (
            dict(disjoint_ratio=0.0, blurry_ratio=0.1),
            dict(disjoint_ratio=1.0, blurry_ratio=0.0),
            dict(disjoint_ratio=0.5, blurry_ratio=1.0),
            dict(disjoint_ratio=0.5, blurry_ratio=0.1, num_sessions=10),
            dict(disjoint_ratio=0.5, blurry_ratio=0.1, split="equal"),
        ):
            config = dict(labels=labels, seed=1, num_sessions=5, split="random")
            config.update(extra)
            configs.append(config)
    return configs


def _build(config: dict) -> SiBlurryStream:
    kwargs = {k: v for k, v in config.items() if k != "labels"}
    return build_si_blurry_stream(LABEL_VECTORS[config["labels"]](), **kwargs)


def _regenerate() -> None:  # pragma: no cover - run by hand only
    entries = []
    for config in _pinned_configs():
        stream = _build(config)
        entry = dict(config)
        entry.update(
            session_sizes=stream.session_sizes().tolist(),
            num_moved=stream.num_moved,
            first_indices=stream.order[:8].tolist(),
            sha256=stream.digest(),
        )
        entries.append(entry)
    payload = {
        "description": "SHA-256 of Si-Blurry session orders (benchmarks.core.stream.SiBlurryStream.digest)",
        "label_vectors": {
            "cifar_like_100": "torch.arange(50000) % 100",
            "imagenet_r_like_200": "torch.repeat_interleave(torch.arange(200), 60 + (torch.arange(200) * 37) % 90)",
        },
        "torch_version": torch.__version__.split("+")[0],
        "streams": entries,
    }
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=1)
    # One line per stream keeps the file short and diffs readable.
    lines = ",\n  ".join(json.dumps(e) for e in entries)
    text = text[: text.index('"streams": [')] + '"streams": [\n  ' + lines + "\n ]\n}"
    FIXTURE.write_text(text + "\n")


# ----------------------------------------------------------------------------------------------------
# Pinned streams
# ----------------------------------------------------------------------------------------------------


def _fixture_entries():
    if not FIXTURE.exists():  # keep the module importable (for --regenerate); the tests then fail
        return [None]
    return json.loads(FIXTURE.read_text())["streams"]


def test_fixture_covers_paper_seeds_on_both_label_vectors():
    entries = _fixture_entries()
    assert entries != [None], f"missing {FIXTURE}"
    for labels in LABEL_VECTORS:
        paper = [
            e["seed"]
            for e in entries
            if e["labels"] == labels and e["split"] == "random" and e["disjoint_ratio"] == 0.5
            and e["blurry_ratio"] == 0.1 and e["num_sessions"] == 5
        ]
        assert sorted(paper)[:5] == [1, 2, 3, 4, 5]


def _entry_id(entry) -> str:
    if entry is None:
        return "missing-fixture"
    return (
        f"{entry['labels']}-s{entry['seed']}-T{entry['num_sessions']}-rD{entry['disjoint_ratio']}-"
        f"rB{entry['blurry_ratio']}-{entry['split']}"
    )


@pytest.mark.parametrize("entry", _fixture_entries(), ids=_entry_id)
def test_stream_matches_pinned_digest(entry):
    assert entry is not None, f"missing {FIXTURE}; run python tests/test_stream.py --regenerate"
    config = {k: entry[k] for k in ("labels", "seed", "num_sessions", "disjoint_ratio", "blurry_ratio", "split")}
    stream = _build(config)
    # Sizes first: a clearer failure than a digest mismatch.
    assert stream.session_sizes().tolist() == entry["session_sizes"]
    assert stream.num_moved == entry["num_moved"]
    assert stream.order[:8].tolist() == entry["first_indices"]
    assert stream.digest() == entry["sha256"], (
        "the stream changed; if torch's CPU randperm/randint changed in a torch upgrade this is expected, "
        "otherwise a refactor broke bit-compatibility with the reference sampler"
    )


def test_digest_is_sensitive_to_order_and_seed():
    labels = cifar_like_labels()[:2000]
    a = build_si_blurry_stream(labels, seed=1)
    b = build_si_blurry_stream(labels, seed=1)
    c = build_si_blurry_stream(labels, seed=2)
    assert a.digest() == b.digest()
    assert a.digest() != c.digest()
    swapped = list(a.session_orders)
    swapped[0] = swapped[0].flip(0)
    assert SiBlurryStream(**{**a.__dict__, "session_orders": tuple(swapped)}).digest() != a.digest()


# ----------------------------------------------------------------------------------------------------
# Structure and invariants
# ----------------------------------------------------------------------------------------------------


def _check_invariants(stream: SiBlurryStream, labels: torch.Tensor) -> None:
    n, num_classes, T = labels.numel(), stream.num_classes, stream.num_sessions
    order = stream.order
    # No sample twice; the random split streams every sample exactly once.
    assert torch.unique(order).numel() == order.numel()
    if stream.split == "random":
        assert torch.equal(torch.sort(order).values, torch.arange(n))
    # Classes: every class has exactly one home; disjoint classes come first in class_order.
    disjoint = torch.cat(stream.disjoint_classes)
    blurry = torch.cat(stream.blurry_classes)
    assert torch.equal(torch.sort(torch.cat([disjoint, blurry])).values, torch.arange(num_classes))
    disjoint_num = int(np.floor(num_classes * float(stream.disjoint_ratio) + 1e-9)) // T * T
    assert disjoint.numel() == disjoint_num
    assert torch.equal(disjoint, stream.class_order[:disjoint_num])
    # A disjoint class is only ever streamed in its home session.
    home = stream.home_session
    for s in range(T):
        session_labels = stream.session_labels(s)
        is_disjoint = ~stream.is_blurry_class[session_labels]
        assert torch.all(home[session_labels[is_disjoint]] == s)
    # Samples of blurry classes outside their home session are exactly the moved ones.
    away = 0
    for s in range(T):
        session_labels = stream.session_labels(s)
        away += int((stream.is_blurry_class[session_labels] & (home[session_labels] != s)).sum())
    assert away <= stream.num_moved


@pytest.mark.parametrize("split", ["random", "equal"])
@pytest.mark.parametrize("disjoint_ratio", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("blurry_ratio", [0.0, 0.1, 1.0])
def test_invariants_over_ratio_grid(split, disjoint_ratio, blurry_ratio):
    labels = imagenet_r_like_labels()
    stream = build_si_blurry_stream(
        labels, disjoint_ratio=disjoint_ratio, blurry_ratio=blurry_ratio, split=split, seed=3
    )
    _check_invariants(stream, labels)
    blurry_samples = int(stream.is_blurry_class[labels].sum())
    if disjoint_ratio == 0.0:
        assert all(c.numel() == 0 for c in stream.disjoint_classes)
        assert blurry_samples == labels.numel()
    if disjoint_ratio == 1.0:  # 200 classes, 5 sessions: nothing left over
        assert all(c.numel() == 0 for c in stream.blurry_classes)
        assert stream.num_moved == 0
    if blurry_ratio == 0.0:
        assert stream.num_moved == 0
        for s in range(stream.num_sessions):  # nothing leaves its home session
            assert torch.all(stream.home_session[stream.session_labels(s)] == s)
    # A donor gives min(quota, its blurry samples); the pool is the sum of what was given.
    home_blurry = [int((stream.is_blurry_class[labels] & (stream.home_session[labels] == s)).sum()) for s in range(5)]
    assert stream.num_moved == sum(min(q, n) for q, n in zip(stream.move_quotas, home_blurry))
    if split == "random":
        assert sum(stream.move_quotas) == int(blurry_samples * blurry_ratio)
    else:
        assert list(stream.move_quotas) == [int(n * blurry_ratio) for n in home_blurry]


def test_disjoint_ratio_one_leaves_remainder_classes_blurry():
    # FlyGCL does not round the blurry count: 103 classes over 5 sessions -> 100 disjoint, 3 blurry.
    labels = torch.arange(103 * 4) % 103
    stream = build_si_blurry_stream(labels, disjoint_ratio=1.0, blurry_ratio=0.5, seed=1)
    assert sum(c.numel() for c in stream.disjoint_classes) == 100
    assert sum(c.numel() for c in stream.blurry_classes) == 3
    assert sum(stream.move_quotas) == (3 * 4) // 2


def test_ratio_floor_is_exact_on_decimal_value():
    # floor(100 * 0.29) must be 29 (float arithmetic gives 28.999...): disjoint_num = 29 // 1 * 1.
    labels = torch.arange(100)
    stream = build_si_blurry_stream(labels, num_sessions=1, disjoint_ratio=0.29, blurry_ratio=0.0, seed=0)
    assert sum(c.numel() for c in stream.disjoint_classes) == 29
    # numpy scalars and Fractions are accepted and give the same stream as the Python float.
    from fractions import Fraction

    for ratio in (np.float64(0.29), Fraction(29, 100)):
        other = build_si_blurry_stream(labels, num_sessions=1, disjoint_ratio=ratio, blurry_ratio=0, seed=0)
        assert other.digest() == stream.digest()


def test_equal_split_sessions_have_equal_class_groups_and_drop_pool_remainder():
    labels = cifar_like_labels()[:10_007]
    stream = build_si_blurry_stream(labels, split="equal", seed=4)
    assert [c.numel() for c in stream.disjoint_classes] == [10] * 5
    assert [c.numel() for c in stream.blurry_classes] == [10] * 5
    pool = stream.num_moved
    assert len(stream) == labels.numel() - pool % 5


def test_empty_sessions_are_allowed_and_handled():
    # 3 classes for 5 sessions, all blurry, nothing moved: at least two sessions hold no sample.
    labels = torch.tensor([0, 1, 2] * 5)
    stream = build_si_blurry_stream(labels, num_sessions=5, disjoint_ratio=0.0, blurry_ratio=0.0, seed=0)
    sizes = stream.session_sizes()
    assert int((sizes == 0).sum()) >= 2 and int(sizes.sum()) == 15
    ends = stream.session_ends()
    assert ends.tolist() == torch.cumsum(sizes, 0).tolist()
    batches = list(stream.batches(4))
    assert {b.session for b in batches} == {s for s in range(5) if sizes[s] > 0}
    per_session = list(stream.sessions(4))
    assert [s for s, _ in per_session] == [0, 1, 2, 3, 4]
    assert [len(group) for _, group in per_session] == [len(sizes_s) for sizes_s in stream.batch_sizes(4)]
    assert [b for _, group in per_session for b in group][-1].samples_seen == 15
    assert stream.batch_sizes(4)[int(torch.nonzero(sizes == 0)[0])] == []
    assert stream.session_ids().numel() == 15


def test_classes_with_very_few_or_no_samples():
    # Class 7 has a single sample; classes 8 and 9 have none (num_classes=10 > max label + 1).
    labels = torch.cat([torch.arange(7).repeat(20), torch.tensor([7])])
    stream = build_si_blurry_stream(labels, num_classes=10, blurry_ratio=1.0, seed=2)
    _check_invariants(stream, labels)
    exposure = stream.exposure()
    assert exposure.table[8] == -1 and exposure.table[9] == -1
    # Class 7's one sample (dataset index 140) exposes it where the stream reaches that sample.
    index = int(exposure.table[7])
    position = int(torch.nonzero(torch.cat(stream.session_orders) == 140)[0])
    assert int(exposure.order[index]) == 7 and int(exposure.first_position[index]) == position
    assert len(exposure) == 8


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    num_classes=st.integers(1, 30),
    num_sessions=st.integers(1, 7),
    disjoint_pct=st.integers(0, 100),
    blurry_pct=st.integers(0, 100),
    seed=st.integers(0, 2**31 - 1),
    sort_labels=st.booleans(),
)
def test_invariants_property(data, num_classes, num_sessions, disjoint_pct, blurry_pct, seed, sort_labels):
    labels = data.draw(st.lists(st.integers(0, num_classes - 1), min_size=1, max_size=200))
    if sort_labels:
        labels.sort()
    labels_t = torch.tensor(labels)
    stream = build_si_blurry_stream(
        labels_t,
        num_sessions=num_sessions,
        disjoint_ratio=disjoint_pct / 100,
        blurry_ratio=blurry_pct / 100,
        seed=seed,
        num_classes=num_classes,
    )
    _check_invariants(stream, labels_t)
    assert stream.session_ends()[-1] == len(stream)


# ----------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(disjoint_ratio=1.5), ValueError, r"disjoint_ratio must lie in \[0, 1\], got 1.5"),
        (dict(blurry_ratio=-0.1), ValueError, r"blurry_ratio must lie in \[0, 1\]"),
        (dict(blurry_ratio=10), ValueError, r"not percentages"),
        (dict(disjoint_ratio=float("nan")), ValueError, r"disjoint_ratio"),
        (dict(disjoint_ratio=True), TypeError, r"disjoint_ratio must be a real number"),
        (dict(blurry_ratio="0.1"), TypeError, r"blurry_ratio must be a real number"),
        (dict(num_sessions=0), InvalidParameterError, r"num_sessions must be an int >= 1, got 0"),
        (dict(num_sessions=2.0), InvalidParameterError, r"num_sessions must be an int >= 1, got float"),
        (dict(seed=1.5), InvalidParameterError, r"seed must be an int, got float"),
        (dict(split="rnd"), ValueError, r"split must be 'random'"),
        (dict(num_classes=5), ValueError, r"labels must lie in \[0, num_classes=5\), found class id 9"),
    ],
)
def test_invalid_arguments_raise_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        build_si_blurry_stream(torch.arange(10), **kwargs)


@pytest.mark.parametrize(
    "labels, error, match",
    [
        (torch.zeros(3, 2, dtype=torch.long), ValueError, r"1-D vector .* got shape \(3, 2\)"),
        (torch.tensor([0.0, 1.0]), TypeError, r"integer class ids, got a tensor of dtype torch.float32"),
        (np.array([0.5, 1.0]), TypeError, r"integer class ids, got values of dtype float64"),
        ([True, False], TypeError, r"integer class ids"),
        (torch.tensor([0, -1]), ValueError, r"non-negative class ids, found -1"),
        (torch.tensor([], dtype=torch.long), ValueError, r"empty"),
        (["a", "b"], TypeError, r"integer class ids"),
    ],
)
def test_invalid_label_vectors(labels, error, match):
    with pytest.raises(error, match=match):
        build_si_blurry_stream(labels)


def test_label_vector_accepts_lists_arrays_and_small_ints():
    expected = torch.tensor([0, 2, 1])
    for labels in ([0, 2, 1], np.array([0, 2, 1], dtype=np.uint8), torch.tensor([0, 2, 1], dtype=torch.int16)):
        out = check_label_vector(labels)
        assert out.dtype == torch.long and torch.equal(out, expected)


def test_equal_split_impossible_with_fewer_classes_than_sessions():
    with pytest.raises(ValueError, match=r"found 3 blurry classes \(3 classes - 0 disjoint\) for 5 sessions"):
        build_si_blurry_stream(torch.arange(3), num_sessions=5, split="equal")
    # The random split handles it (empty sessions instead).
    assert len(build_si_blurry_stream(torch.arange(3), num_sessions=5)) == 3


# ----------------------------------------------------------------------------------------------------
# Batching, sharding, positions
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stream() -> SiBlurryStream:
    return build_si_blurry_stream(cifar_like_labels()[:5_000], seed=2)


def test_batches_are_sequential_session_local_and_partial_at_session_end(stream):
    batches = list(stream.batches(64))
    assert torch.equal(torch.cat([b.indices for b in batches]), stream.order)
    sizes = stream.session_sizes().tolist()
    for session in range(stream.num_sessions):
        in_session = [b for b in batches if b.session == session]
        assert [b.global_size for b in in_session] == stream.batch_sizes(64)[session]
        assert all(b.global_size == 64 for b in in_session[:-1])
        assert in_session[-1].global_size == sizes[session] - 64 * (len(in_session) - 1)
        assert [b.is_session_end for b in in_session] == [False] * (len(in_session) - 1) + [True]
        assert torch.equal(torch.cat([b.indices for b in in_session]), stream.session(session))
    assert [b.index for b in batches] == list(range(len(batches)))
    assert len(batches) == stream.num_batches(64)
    assert all(b.samples_seen == b.start + b.global_size for b in batches)
    assert batches[-1].samples_seen == len(stream)
    assert all(torch.equal(b.targets, stream.targets[b.indices]) for b in batches)


def test_session_ids_and_ends_agree_with_batches(stream):
    ids, ends = stream.session_ids(), stream.session_ends()
    assert ids.numel() == len(stream) == int(ends[-1])
    for b in stream.batches(50):
        assert torch.all(ids[b.start : b.samples_seen] == b.session)
        if b.is_session_end:
            assert b.samples_seen == int(ends[b.session])


@pytest.mark.parametrize("world_size, batch_size", [(2, 64), (3, 48), (4, 16)])
def test_sharding_gives_disjoint_equal_shares_of_every_batch(stream, world_size, batch_size):
    per_rank = [list(stream.batches(batch_size, rank=r, world_size=world_size)) for r in range(world_size)]
    single = list(stream.batches(batch_size, rank=None, world_size=world_size))
    assert all(len(p) == len(single) for p in per_rank)
    for k, global_batch in enumerate(single):
        shares = [p[k].indices for p in per_rank]
        assert all(s.numel() == global_batch.global_size // world_size for s in shares)
        merged = torch.cat(shares)
        assert torch.unique(merged).numel() == merged.numel()
        assert torch.equal(torch.sort(merged).values, torch.sort(global_batch.indices).values)
        assert all(p[k].samples_seen == global_batch.samples_seen for p in per_rank)
    # Reference formula: rank r streams indices[r:total:W] of each session, in local batches of B/W.
    for r in range(world_size):
        for s in range(stream.num_sessions):
            order = stream.session(s)
            total = order.numel() // world_size * world_size
            expected = order[r:total:world_size]
            got = [b.indices for b in per_rank[r] if b.session == s]
            got = torch.cat(got) if got else torch.empty(0, dtype=torch.long)
            assert torch.equal(got, expected)
            local = [b.indices.numel() for b in per_rank[r] if b.session == s]
            b_local = batch_size // world_size
            assert local == [b_local] * (expected.numel() // b_local) + (
                [expected.numel() % b_local] if expected.numel() % b_local else []
            )
    assert stream.session_ends(world_size)[-1] == sum(b.global_size for b in single)


def test_batching_arguments_are_validated(stream):
    with pytest.raises(ValueError, match=r"multiple of world_size .* batch_size=10, world_size=4"):
        next(stream.batches(10, world_size=4))
    with pytest.raises(InvalidParameterError, match=r"rank must be an int in \[0, 1\], got 2"):
        next(stream.batches(8, rank=2, world_size=2))
    with pytest.raises(InvalidParameterError, match=r"batch_size must be an int >= 1, got 0"):
        next(stream.batches(0))
    with pytest.raises(InvalidParameterError, match=r"session must be an int in \[0, 4\], got 5"):
        stream.session(5)


# ----------------------------------------------------------------------------------------------------
# Exposure
# ----------------------------------------------------------------------------------------------------


def _naive_exposure(label_sequence):
    exposed = []
    for label in label_sequence:
        if label not in exposed:
            exposed.append(label)
    return exposed


def test_exposure_order_is_first_appearance(stream):
    exposure = stream.exposure()
    expected = _naive_exposure(stream.targets[stream.order].tolist())
    assert exposure.order.tolist() == expected
    assert torch.equal(exposure.table[exposure.order], torch.arange(len(expected)))
    assert torch.all(exposure.first_position[1:] > exposure.first_position[:-1])
    labels = stream.targets[stream.order]
    assert torch.equal(exposure.to_raw(exposure.to_exposure(labels)), labels)


def test_exposed_classes_at_batch_ends_match_incremental_bookkeeping(stream):
    exposure = stream.exposure()
    seen: list = []
    for b in stream.batches(64):
        for label in b.targets.tolist():  # the reference's add_new_class, batch by batch
            if label not in seen:
                seen.append(label)
        assert exposure.exposed_labels(b.samples_seen).tolist() == seen
        assert exposure.num_exposed(b.samples_seen) == len(seen)
    assert exposure.num_exposed(0) == 0


def test_exposure_with_rank_merge_matches_reference_gather(stream):
    world_size, batch_size = 2, 64
    exposure = stream.exposure(batch_size=batch_size, world_size=world_size)
    per_rank = [list(stream.batches(batch_size, rank=r, world_size=world_size)) for r in range(world_size)]
    merged: list = []
    for step in zip(*per_rank):
        local_lists = []
        for rank_batch in step:  # each rank appends its new labels, then the lists are gathered in rank order
            local = list(merged)
            for label in rank_batch.targets.tolist():
                if label not in local:
                    local.append(label)
            local_lists.append(local)
        merged = _naive_exposure([label for local in local_lists for label in local])
        assert exposure.exposed_labels(step[0].samples_seen).tolist() == merged
    with pytest.raises(ValueError, match="needs the global batch_size"):
        stream.exposure(world_size=2)


def test_eval_subset_selects_test_samples_of_exposed_classes(stream):
    exposure = stream.exposure()
    test_targets = torch.arange(1000) % 100
    midway = int(stream.session_ends()[1])
    indices, remapped = exposure.eval_subset(test_targets, midway)
    exposed = set(exposure.exposed_labels(midway).tolist())
    expected = [i for i, t in enumerate(test_targets.tolist()) if t in exposed]
    assert indices.tolist() == expected
    assert torch.equal(exposure.to_raw(remapped), test_targets[indices])
    assert int(remapped.max()) < len(exposed)
    all_indices, _ = exposure.eval_subset(test_targets)
    assert all_indices.numel() == 1000  # every class is exposed by the end
    empty, _ = exposure.eval_subset(test_targets, 0)
    assert empty.numel() == 0


def test_home_session_in_exposure_order(stream):
    exposure = stream.exposure()
    by_exposure = exposure.per_exposure(stream.home_session)
    assert torch.equal(by_exposure, stream.home_session[exposure.order])


# ----------------------------------------------------------------------------------------------------
# Expert schedule support
# ----------------------------------------------------------------------------------------------------


def test_expert_window_is_floor_of_train_size_over_experts():
    """The task-free budget the runner uses (docs/stream.md): floor(N_train / num_experts) samples."""
    for size, window in ((50_000, 10_000), (24_000, 4_800), (9_430, 1_886)):
        assert SampleBudgetSchedule.from_stream_size(size, 5).samples_per_expert == window


def test_summary_is_plain_python(stream):
    summary = stream.summary()
    json.dumps(summary)
    assert sum(s["size"] for s in summary["sessions"]) == len(stream)


if __name__ == "__main__":  # pragma: no cover
    if "--regenerate" in sys.argv:
        _regenerate()
        print(f"wrote {FIXTURE}")
