"""Tests of benchmarks.core.metrics: hand-computed logs, both metric definitions, triggers, JSON round trip."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import pytest
import torch

from benchmarks.core.metrics import (
    AnytimeEvalTrigger,
    EvaluationLog,
    a_auc,
    a_avg,
    a_last,
    bwt,
    class_accuracy_matrix,
    class_backward_transfer,
    class_forgetting,
    count_correct,
    f_last,
    first_exposure_sessions,
    session_accuracy_matrix,
    summarize,
)
from benchmarks.core.stream_draw import build_si_blurry_stream
from fly_modules import InvalidParameterError

# Relative tolerance that absorbs the reference's 1e-5 in correct / (count + 1e-5) on 10-sample classes.
EPS_REL = 1e-5


def hand_log() -> EvaluationLog:
    """Three sessions; session 0 exposes classes 0 and 1, session 1 class 2, session 2 class 3 (10 test images each).

    Session ends (correct per exposed class): [8, 6] -> 0.7; [7, 6, 9] -> 22/30; [5, 6, 8, 10] -> 29/40.
    Anytime: [3] -> 0.3; [5, 4] -> 0.45; [6, 5, 2] -> 13/30; [5, 5, 7, 4] -> 0.525.
    """
    log = EvaluationLog(exposed_labels=[42, 7, 13, 99], meta={"dataset": "hand"})
    log.record("anytime", timestamp=1000, samples_seen=960, session=0, correct=[3], total=[10])
    log.record("anytime", timestamp=2000, samples_seen=1984, session=0, correct=[5, 4], total=[10, 10])
    log.record("session_end", timestamp=2100, samples_seen=2100, session=0, correct=[8, 6], total=[10, 10])
    log.record("anytime", timestamp=3000, samples_seen=2980, session=1, correct=[6, 5, 2], total=[10] * 3)
    log.record("session_end", timestamp=3500, samples_seen=3500, session=1, correct=[7, 6, 9], total=[10] * 3)
    log.record("anytime", timestamp=4000, samples_seen=3968, session=2, correct=[5, 5, 7, 4], total=[10] * 4)
    log.record("session_end", timestamp=4200, samples_seen=4200, session=2, correct=[5, 6, 8, 10], total=[10] * 4)
    return log


def test_accuracies_and_code_definitions_by_hand():
    log = hand_log()
    assert np.allclose(log.anytime_accuracies(), [0.3, 0.45, 13 / 30, 0.525])
    assert log.anytime_timestamps().tolist() == [1000, 2000, 3000, 4000]
    assert np.allclose(log.session_accuracies(), [0.7, 22 / 30, 0.725])
    assert a_auc(log) == pytest.approx((0.3 + 0.45 + 13 / 30 + 0.525) / 4)
    assert a_last(log) == pytest.approx(0.725)
    assert a_avg(log) == pytest.approx((0.7 + 22 / 30 + 0.725) / 3)
    # Class-level: per-class accuracies at session ends [.8 .6 0 0], [.7 .6 .9 0], [.5 .6 .8 1].
    # F_last over classes 0, 1, 2 (best before last > 0): (.3 + 0 + .1) / 3.
    assert f_last(log) == pytest.approx(0.4 / 3, rel=EPS_REL)
    # BWT: last minus first non-zero earlier accuracy: (-.3 + 0 - .1) / 3.
    assert bwt(log) == pytest.approx(-0.4 / 3, rel=EPS_REL)


def test_paper_definitions_by_hand_with_first_exposure_sessions():
    log = hand_log()
    assert first_exposure_sessions(log).tolist() == [0, 0, 1, 2]
    R = session_accuracy_matrix(log)
    expected = np.array([[0.7, np.nan, np.nan], [0.65, 0.9, np.nan], [0.55, 0.8, 1.0]])
    assert np.allclose(R, expected, equal_nan=True)
    assert a_last(log, "paper") == pytest.approx((0.55 + 0.8 + 1.0) / 3)
    assert a_avg(log, "paper") == pytest.approx((0.7 + 0.9 + 1.0) / 3)
    assert f_last(log, "paper") == pytest.approx((0.15 + 0.1 + 0.0) / 3)
    assert bwt(log, "paper") == pytest.approx(((0.55 - 0.7) + (0.8 - 0.9)) / 2)
    assert a_auc(log) == summarize(log, "paper")["A_auc"]


def test_paper_definitions_with_a_custom_class_session_map():
    # Class 1 (exposed in session 0) has its home in session 1.
    log = hand_log()
    home = [0, 1, 1, 2]
    R = session_accuracy_matrix(log, home)
    expected = np.array([[0.8, 0.6, np.nan], [0.7, 0.75, np.nan], [0.5, 0.7, 1.0]])
    assert np.allclose(R, expected, equal_nan=True)
    assert a_last(log, "paper", home) == pytest.approx(2.2 / 3)
    assert a_avg(log, "paper", home) == pytest.approx(2.55 / 3)
    assert f_last(log, "paper", home) == pytest.approx(0.35 / 3)
    assert bwt(log, "paper", home) == pytest.approx(-0.175)
    with pytest.raises(ValueError, match="class_session has 2 entries but 4 classes"):
        session_accuracy_matrix(log, [0, 1])
    with pytest.raises(ValueError, match="holds session 3 but the log has 3 session ends"):
        session_accuracy_matrix(log, [0, 1, 2, 3])


def _reference_forgetting_and_bwt(cls_acc: np.ndarray):
    """Direct transcription of the reference summary loops (FlyGCL main_worker), for cross-checking."""
    acc_diff, bwt_vals = [], []
    for j in range(cls_acc.shape[1]):
        if np.max(cls_acc[:-1, j]) > 0:
            acc_diff.append(np.max(cls_acc[:-1, j]) - cls_acc[-1, j])
        seen = np.where(cls_acc[:-1, j] > 0)[0]
        if len(seen):
            bwt_vals.append(cls_acc[-1, j] - cls_acc[seen[0], j])
    return np.mean(acc_diff), np.mean(bwt_vals)


def test_code_definitions_match_reference_loops_on_random_logs():
    rng = np.random.default_rng(0)
    for _ in range(20):
        log = EvaluationLog()
        exposed = 0
        for session in range(5):
            exposed += int(rng.integers(1, 6))
            total = rng.integers(1, 30, size=exposed)
            correct = rng.integers(0, total + 1)
            log.record(
                "session_end", timestamp=session, samples_seen=session, session=session, correct=correct, total=total
            )
        cls = class_accuracy_matrix(log)
        # Reference per-class accuracy: correct / (count + 1e-5), zeros for classes not yet exposed.
        last = log.session_ends[-1]
        assert np.allclose(cls[-1], last.correct / (last.total + 1e-5), rtol=0, atol=0)
        ref_f, ref_b = _reference_forgetting_and_bwt(cls)
        assert f_last(log) == pytest.approx(ref_f, abs=1e-12)
        assert bwt(log) == pytest.approx(ref_b, abs=1e-12)


def test_float32_class_accuracies_are_the_references_and_move_f_last_by_rounding_only():
    # The reference divides float32 tensors: correct / (count + 1e-5). dtype=np.float32 gives its values
    # bit for bit; the float64 default differs by float32 rounding, and so do F_last and BWT.
    log = hand_log()
    expected = [(torch.tensor(r.correct, dtype=torch.float32) / (torch.tensor(r.total, dtype=torch.float32) + 1e-5))
                .tolist() for r in log.session_ends]
    rounded = class_accuracy_matrix(log, dtype=np.float32)
    for row, values in zip(rounded, expected):
        assert row[: len(values)].tolist() == values
    exact = class_accuracy_matrix(log)
    assert not np.array_equal(rounded, exact) and np.abs(rounded - exact).max() < 1e-7
    assert class_forgetting(exact) == f_last(log) and class_backward_transfer(exact) == bwt(log)
    assert 0 < abs(class_forgetting(rounded) - f_last(log)) < 1e-7
    assert class_forgetting(rounded) == pytest.approx(_reference_forgetting_and_bwt(rounded)[0], abs=0)


def test_zero_exposed_classes_never_divide_by_zero():
    log = EvaluationLog()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning from numpy either
        rec = log.record("session_end", timestamp=0, samples_seen=0, session=0, correct=[], total=[])
        assert math.isnan(rec.accuracy)
        assert math.isnan(a_auc(log))
        assert math.isnan(a_last(log))
        for definition in ("code", "paper"):
            values = summarize(log, definition)
            assert all(math.isnan(v) for v in values.values())
        log.record("session_end", timestamp=10, samples_seen=10, session=1, correct=[1, 0], total=[2, 2])
        # The empty first session is skipped by the means; F_last/BWT have no class with earlier accuracy.
        assert a_avg(log) == pytest.approx(0.25)
        assert a_last(log) == pytest.approx(0.25)
        assert math.isnan(f_last(log)) and math.isnan(bwt(log))
        assert a_last(log, "paper") == pytest.approx(0.25)
        assert math.isnan(bwt(log, "paper"))


def test_single_session_forgetting_is_nan():
    log = EvaluationLog()
    log.record("session_end", timestamp=5, samples_seen=5, session=0, correct=[1], total=[1])
    assert math.isnan(f_last(log)) and math.isnan(bwt(log))
    assert f_last(log, "paper") == 0.0  # R[T, 0] is both the max and the final value
    assert a_last(log) == 1.0


def test_log_round_trips_through_json():
    log = hand_log()
    text = json.dumps(log.to_dict())
    back = EvaluationLog.from_dict(json.loads(text))
    assert back.exposed_labels == [42, 7, 13, 99] and back.meta == {"dataset": "hand"}
    assert [r.kind for r in back.records] == [r.kind for r in log.records]
    for definition in ("code", "paper"):
        assert summarize(back, definition) == summarize(log, definition)
    with pytest.raises(ValueError, match="format_version"):
        EvaluationLog.from_dict({**log.to_dict(), "format_version": 99})


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(kind="final"), ValueError, "kind must be one of"),
        (dict(correct=[3, 1], total=[2, 1]), ValueError, r"correct exceeds total for exposure index 0: 3 > 2"),
        (dict(correct=[1], total=[1, 2]), ValueError, "lengths 1 and 2"),
        (dict(correct=[0.5], total=[1]), TypeError, "whole numbers"),
        (dict(correct=[-1], total=[1]), ValueError, "non-negative"),
        (dict(timestamp=-1), InvalidParameterError, r"EvaluationLog.record: timestamp must be an int >= 0, got -1"),
        (dict(session=1.0), InvalidParameterError, "session must be an int >= 0, got float 1.0"),
    ],
)
def test_record_validation(kwargs, error, match):
    args = dict(kind="anytime", timestamp=0, samples_seen=0, session=0, correct=[1], total=[1])
    args.update(kwargs)
    kind = args.pop("kind")
    with pytest.raises(error, match=match):
        EvaluationLog().record(kind, **args)


def test_exposure_cannot_shrink():
    log = EvaluationLog()
    log.record("anytime", timestamp=1000, samples_seen=900, session=0, correct=[1, 1], total=[1, 1])
    with pytest.raises(ValueError, match="covers 1 exposed classes but the previous one covered 2"):
        log.record("anytime", timestamp=2000, samples_seen=1900, session=0, correct=[1], total=[1])


def test_count_correct_and_record_predictions():
    predictions = torch.tensor([0, 1, 1, 2, 2, 0])
    targets = torch.tensor([0, 1, 2, 2, 0, 0])
    correct, total = count_correct(predictions, targets, 4)
    assert correct.tolist() == [2, 1, 1, 0] and total.tolist() == [3, 1, 2, 0]
    log = EvaluationLog()
    rec = log.record_predictions(
        "session_end", timestamp=6, samples_seen=6, session=0, predictions=predictions, targets=targets, num_exposed=4
    )
    assert rec.accuracy == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match=r"targets must lie in \[0, num_classes=2\)"):
        count_correct(predictions, targets, 2)
    with pytest.raises(ValueError, match="equal length"):
        count_correct(predictions[:2], targets, 4)


# ----------------------------------------------------------------------------------------------------
# When evaluations happen
# ----------------------------------------------------------------------------------------------------


def _run_trigger(trigger: AnytimeEvalTrigger, batch_sizes):
    seen, out = 0, []
    for size in batch_sizes:
        seen += size
        stamp = trigger.step(seen, size)
        if stamp is not None:
            out.append((seen, stamp))
    return out


def test_flygcl_rule_evaluates_one_batch_before_the_mark():
    # Reference-protocol 2.1: with B = 64 the first evaluation runs at 960 samples, the second at 1984.
    events = _run_trigger(AnytimeEvalTrigger(1000), [64] * 70)
    assert events[:3] == [(960, 1000), (1984, 2000), (2944, 3000)]
    # Strictly greater: a batch that would land exactly on the mark does not trigger early.
    assert _run_trigger(AnytimeEvalTrigger(1000), [500] * 4) == [(1000, 1000), (2000, 2000)]


def test_other_rules_and_disabled_trigger():
    assert _run_trigger(AnytimeEvalTrigger(1000, rule="sib"), [64] * 40)[:2] == [(1024, 1000), (2048, 2000)]
    assert _run_trigger(AnytimeEvalTrigger(1000, rule="reached"), [500] * 4) == [(1000, 1000), (2000, 2000)]
    assert _run_trigger(AnytimeEvalTrigger(None), [64] * 100) == []
    with pytest.raises(ValueError, match="rule must be"):
        AnytimeEvalTrigger(1000, rule="every")
    with pytest.raises(InvalidParameterError, match="AnytimeEvalTrigger: period must be an int >= 1, got 0"):
        AnytimeEvalTrigger(0)


def test_at_most_one_evaluation_per_batch_and_marks_lag_behind():
    # Batches larger than the period: one evaluation per batch, the mark advances by one period each time.
    events = _run_trigger(AnytimeEvalTrigger(1000), [2500] * 3)
    assert events == [(2500, 1000), (5000, 2000), (7500, 3000)]


def test_trigger_state_round_trip():
    trigger = AnytimeEvalTrigger(100)
    _run_trigger(trigger, [64] * 5)
    clone = AnytimeEvalTrigger(1)
    clone.load_state_dict(trigger.state_dict())
    assert clone.step(400, 64) == trigger.step(400, 64)


@dataclass(frozen=True)
class PlannedEvaluation:
    """An evaluation a run performs; ``batch_index`` is the global index of the batch after which it runs
    (``-1`` for the session-end evaluation of an empty session before any batch)."""

    kind: str
    session: int
    batch_index: int
    timestamp: int
    samples_seen: int


def plan_evaluations(session_batch_sizes: Sequence[Sequence[int]], *, period: Optional[int] = 1000) -> List[PlannedEvaluation]:
    """Every evaluation of a run, in order, from the global batch sizes of each session: after each batch an
    anytime evaluation may run, after the last batch of every session (also an empty one) a session-end one."""
    trigger = AnytimeEvalTrigger(period)
    plan: List[PlannedEvaluation] = []
    seen, batch_index = 0, -1
    for session, sizes in enumerate(session_batch_sizes):
        for size in sizes:
            seen += size
            batch_index += 1
            stamp = trigger.step(seen, size)
            if stamp is not None:
                plan.append(PlannedEvaluation("anytime", session, batch_index, stamp, seen))
        plan.append(PlannedEvaluation("session_end", session, batch_index, seen, seen))
    return plan


def test_plan_covers_anytime_and_every_session_end_including_empty_sessions():
    plan = plan_evaluations([[64] * 20, [], [64, 10]], period=1000)
    kinds = [(p.kind, p.session, p.samples_seen) for p in plan]
    assert kinds == [
        ("anytime", 0, 960),
        ("session_end", 0, 1280),
        ("session_end", 1, 1280),
        ("session_end", 2, 1354),
    ]
    assert plan[2].batch_index == 19 and plan[3].batch_index == 21


def test_plan_from_a_stream_and_recomputing_metrics_from_the_log_alone():
    """An end-to-end bookkeeping run with a fake model that is right on even raw labels only."""
    labels = torch.arange(3000) % 30
    test_targets = torch.arange(600) % 30
    stream = build_si_blurry_stream(labels, seed=1)
    exposure = stream.exposure()
    plan = plan_evaluations(stream.batch_sizes(64), period=500)
    assert sum(p.kind == "session_end" for p in plan) == stream.num_sessions
    log = EvaluationLog(exposed_labels=exposure.order)
    accuracies = {"anytime": [], "session_end": []}
    for p in plan:
        indices, targets = exposure.eval_subset(test_targets, p.samples_seen)
        raw = test_targets[indices]
        predictions = torch.where(raw % 2 == 0, targets, torch.zeros_like(targets) - 1)
        log.record_predictions(
            p.kind, timestamp=p.timestamp, samples_seen=p.samples_seen, session=p.session,
            predictions=predictions, targets=targets, num_exposed=exposure.num_exposed(p.samples_seen),
        )
        accuracies[p.kind].append(float((predictions == targets).double().mean()) if len(targets) else math.nan)
    # Half of the classes are always right, the other half always wrong.
    assert a_last(log) == pytest.approx(0.5)
    # The anytime and session-end accuracies vary with the classes exposed: the means are over the right ones.
    assert a_auc(log) == pytest.approx(np.nanmean(accuracies["anytime"]))
    assert a_avg(log) == pytest.approx(np.nanmean(accuracies["session_end"]))
    assert np.nanmean(accuracies["anytime"]) != pytest.approx(np.nanmean(accuracies["session_end"]))
    assert f_last(log) == pytest.approx(0.0, abs=1e-9)
    back = EvaluationLog.from_dict(json.loads(json.dumps(log.to_dict())))
    for definition in ("code", "paper"):
        np.testing.assert_equal(summarize(back, definition), summarize(log, definition))
