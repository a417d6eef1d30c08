"""Anytime evaluation schedule, evaluation log and the GCL metrics (A_auc, A_last, A_avg, F_last, BWT).

Everything is recomputable from an :class:`EvaluationLog`, which stores per exposed class
(exposure-indexed, docs/protocol.md §1.7) the correct predictions and test samples of every
evaluation and round-trips through JSON. Metrics follow the official code (``definition="code"``, the
paper's tables) or the paper's session-matrix definitions (``"paper"``), docs/protocol.md §2.3. An
undefined value (nothing to average) is NaN; accuracies are fractions in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from fly_modules._validation import check_int

__all__ = [
    "EvalKind",
    "Definition",
    "EvalRecord",
    "EvaluationLog",
    "AnytimeEvalTrigger",
    "count_correct",
    "class_accuracy_matrix",
    "class_forgetting",
    "class_backward_transfer",
    "first_exposure_sessions",
    "session_accuracy_matrix",
    "a_auc",
    "a_last",
    "a_avg",
    "f_last",
    "bwt",
    "summarize",
]

EvalKind = Literal["anytime", "session_end"]
Definition = Literal["code", "paper"]
TriggerRule = Literal["flygcl", "sib", "reached"]
ArrayLike = Union[Tensor, np.ndarray, Sequence[int]]

#: Per-class accuracy in the reference is correct / (count + 1e-5) (FlyGCL ``online_evaluate``).
REFERENCE_EPSILON = 1e-5
_KINDS = ("anytime", "session_end")
_LOG_FORMAT_VERSION = 1


def _nan_mean(values: Sequence[float]) -> float:
    """Mean of the finite entries; NaN (without a warning) when there is none."""
    array = np.asarray(values, dtype=np.float64)
    array = array[~np.isnan(array)]
    return float(array.mean()) if array.size else math.nan


def _as_count_vector(values: ArrayLike, name: str) -> np.ndarray:
    if isinstance(values, Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one entry per exposed class), got shape {array.shape}")
    if array.size and array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise TypeError(f"{name} must hold whole numbers, got non-integer values")
    elif array.size and array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    array = array.astype(np.int64)
    if array.size and array.min() < 0:
        raise ValueError(f"{name} must be non-negative, found {int(array.min())}")
    return array


# ----------------------------------------------------------------------------------------------------
# Counting
# ----------------------------------------------------------------------------------------------------


def count_correct(predictions: Tensor, targets: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """Per-class correct and total counts of one batch, vectorised (``bincount``).

    Args:
        predictions: ``(n,)`` predicted class indices (exposure-indexed).
        targets: ``(n,)`` true class indices (exposure-indexed), in ``[0, num_classes)``.
        num_classes: length of the returned vectors (the number of exposed classes).

    Returns:
        ``(correct, total)``, two ``(num_classes,)`` long tensors on the targets' device; sum them
        over test batches and pass them to :meth:`EvaluationLog.record`.
    """
    if predictions.shape != targets.shape or targets.ndim != 1:
        raise ValueError(
            f"predictions and targets must be 1-D of equal length, got shapes {tuple(predictions.shape)} "
            f"and {tuple(targets.shape)}"
        )
    num_classes = check_int(num_classes, "num_classes", caller="count_correct", minimum=0)
    targets = targets.long()
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= num_classes):
        raise ValueError(
            f"targets must lie in [0, num_classes={num_classes}), found range "
            f"[{int(targets.min())}, {int(targets.max())}]"
        )
    total = torch.bincount(targets, minlength=num_classes)
    correct = torch.bincount(targets[predictions.to(targets.device).long() == targets], minlength=num_classes)
    return correct, total


# ----------------------------------------------------------------------------------------------------
# Log
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class EvalRecord:
    """One evaluation.

    Attributes:
        kind: ``"anytime"`` (periodic, feeds A_auc) or ``"session_end"`` (after a session's last batch).
        timestamp: for anytime evaluations the reference's mark ``num_eval`` (1000, 2000, ...), which is
            what it saves as the evaluation time; for session ends the samples seen.
        samples_seen: stream samples consumed (all ranks) when the evaluation ran.
        session: session during (anytime) or at the end of which (session_end) the evaluation ran.
        correct: ``(K,)`` int64 correct predictions per exposed class, exposure-indexed.
        total: ``(K,)`` int64 test samples per exposed class, exposure-indexed.
    """

    kind: str
    timestamp: int
    samples_seen: int
    session: int
    correct: np.ndarray
    total: np.ndarray

    @property
    def num_exposed(self) -> int:
        """Number of exposed classes at this evaluation."""
        return int(self.total.size)

    @property
    def accuracy(self) -> float:
        """Sample-level accuracy over all exposed classes (NaN when there is no test sample)."""
        total = int(self.total.sum())
        return int(self.correct.sum()) / total if total else math.nan

    def class_accuracy(self, epsilon: float = 0.0, dtype: Any = np.float64) -> np.ndarray:
        """``(K,)`` per-class accuracy ``correct / (total + epsilon)``, computed in ``dtype``; NaN for
        classes without samples when ``epsilon == 0`` (the reference uses ``epsilon=1e-5``, which gives 0
        there)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.correct.astype(dtype) / (self.total.astype(dtype) + dtype(epsilon))

    def to_dict(self) -> Dict[str, Any]:
        """JSON-serialisable form (plain ints and lists)."""
        return {
            "kind": self.kind,
            "timestamp": self.timestamp,
            "samples_seen": self.samples_seen,
            "session": self.session,
            "correct": self.correct.tolist(),
            "total": self.total.tolist(),
        }


class EvaluationLog:
    """Append-only record of every evaluation of a run; the only input the metric functions need.

    Args:
        exposed_labels: optional raw class ids in exposure order (``exposure.order``), kept so that
            exposure-indexed counts can be mapped back to dataset classes.
        meta: optional JSON-serialisable run description (dataset, seed, method, ...).

    Example::

        log = EvaluationLog()
        log.record("anytime", timestamp=1000, samples_seen=960, session=0, correct=c, total=t)
        ...
        summarize(log)                       # official-code definitions
        summarize(log, definition="paper")   # the paper's session-matrix definitions
    """

    def __init__(self, exposed_labels: Optional[ArrayLike] = None, meta: Optional[Dict[str, Any]] = None) -> None:
        self.records: List[EvalRecord] = []
        self.exposed_labels: Optional[List[int]] = None
        self.meta: Dict[str, Any] = dict(meta or {})
        if exposed_labels is not None:
            self.set_exposed_labels(exposed_labels)

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        return (
            f"EvaluationLog(anytime={len(self.anytime)}, session_end={len(self.session_ends)}, "
            f"exposed={self.records[-1].num_exposed if self.records else 0})"
        )

    def set_exposed_labels(self, labels: ArrayLike) -> None:
        """Store the raw class ids in exposure order (may grow as the run exposes classes)."""
        self.exposed_labels = [int(v) for v in _as_count_vector(labels, "exposed_labels")]

    def record(
        self,
        kind: EvalKind,
        *,
        timestamp: int,
        samples_seen: int,
        session: int,
        correct: ArrayLike,
        total: ArrayLike,
    ) -> EvalRecord:
        """Append one evaluation (per-class counts, exposure-indexed) and return its record.

        Raises:
            ValueError: unknown kind, mismatched lengths, ``correct > total``, or fewer exposed
                classes than the previous evaluation (exposure order only grows).
        """
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        correct_v = _as_count_vector(correct, "correct")
        total_v = _as_count_vector(total, "total")
        if correct_v.shape != total_v.shape:
            raise ValueError(
                f"correct and total must have one entry per exposed class, got lengths "
                f"{correct_v.size} and {total_v.size}"
            )
        if np.any(correct_v > total_v):
            bad = int(np.argmax(correct_v > total_v))
            raise ValueError(
                f"correct exceeds total for exposure index {bad}: {correct_v[bad]} > {total_v[bad]}"
            )
        if self.records and total_v.size < self.records[-1].num_exposed:
            raise ValueError(
                f"an evaluation covers {total_v.size} exposed classes but the previous one covered "
                f"{self.records[-1].num_exposed}; exposure order only grows"
            )
        rec = EvalRecord(
            kind=kind,
            timestamp=check_int(timestamp, "timestamp", caller="EvaluationLog.record", minimum=0),
            samples_seen=check_int(samples_seen, "samples_seen", caller="EvaluationLog.record", minimum=0),
            session=check_int(session, "session", caller="EvaluationLog.record", minimum=0),
            correct=correct_v,
            total=total_v,
        )
        self.records.append(rec)
        return rec

    def record_predictions(
        self,
        kind: EvalKind,
        *,
        timestamp: int,
        samples_seen: int,
        session: int,
        predictions: Tensor,
        targets: Tensor,
        num_exposed: int,
    ) -> EvalRecord:
        """Like :meth:`record`, from the predictions and exposure-indexed targets of the whole test subset."""
        correct, total = count_correct(predictions, targets, num_exposed)
        return self.record(
            kind, timestamp=timestamp, samples_seen=samples_seen, session=session, correct=correct, total=total
        )

    @property
    def anytime(self) -> List[EvalRecord]:
        """Anytime evaluations, in order."""
        return [r for r in self.records if r.kind == "anytime"]

    @property
    def session_ends(self) -> List[EvalRecord]:
        """Session-end evaluations, in order (one per finished session)."""
        return [r for r in self.records if r.kind == "session_end"]

    def anytime_accuracies(self) -> np.ndarray:
        """``(S,)`` accuracies of the anytime evaluations (the reference's ``seed_*_eval.npy``)."""
        return np.array([r.accuracy for r in self.anytime], dtype=np.float64)

    def anytime_timestamps(self) -> np.ndarray:
        """``(S,)`` timestamps of the anytime evaluations (the reference's ``seed_*_eval_time.npy``)."""
        return np.array([r.timestamp for r in self.anytime], dtype=np.int64)

    def session_accuracies(self) -> np.ndarray:
        """``(T,)`` accuracies at the session ends (the reference's ``task_acc``)."""
        return np.array([r.accuracy for r in self.session_ends], dtype=np.float64)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-serialisable dictionary (plain ints, lists and strings)."""
        return {
            "format_version": _LOG_FORMAT_VERSION,
            "exposed_labels": self.exposed_labels,
            "meta": self.meta,
            "records": [r.to_dict() for r in self.records],
        }

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> EvaluationLog:
        """Rebuild a log written by :meth:`to_dict` (validates every record again)."""
        version = data.get("format_version")
        if version != _LOG_FORMAT_VERSION:
            raise ValueError(f"unsupported evaluation-log format_version {version!r}, expected {_LOG_FORMAT_VERSION}")
        log = cls(exposed_labels=data.get("exposed_labels"), meta=data.get("meta"))
        for item in data["records"]:
            log.record(
                item["kind"],
                timestamp=item["timestamp"],
                samples_seen=item["samples_seen"],
                session=item["session"],
                correct=item["correct"],
                total=item["total"],
            )
        return log


# ----------------------------------------------------------------------------------------------------
# When to evaluate
# ----------------------------------------------------------------------------------------------------


class AnytimeEvalTrigger:
    """Decides after each training batch whether an anytime evaluation is due.

    Args:
        period: evaluation period in *samples* (reference: 1000). ``None`` disables anytime evaluation.
        rule: ``"flygcl"`` (default, FlyGCL ``main_worker``): due when
            ``samples_seen + batch_size > next_mark`` -- i.e. one batch *before* the mark is crossed,
            so with B=64 the first evaluation runs at 960 samples and the second at 1984;
            ``"sib"`` (Si-Blurry trainer): due when ``samples_seen > next_mark``;
            ``"reached"``: due when ``samples_seen >= next_mark``.

    At most one evaluation per batch; after each the mark advances by ``period`` and the evaluation is
    stamped with the mark it answered (the reference's ``data_cnt``).
    """

    def __init__(self, period: Optional[int] = 1000, *, rule: TriggerRule = "flygcl") -> None:
        if period is not None:
            period = check_int(period, "period", caller="AnytimeEvalTrigger", minimum=1)
        if rule not in ("flygcl", "sib", "reached"):
            raise ValueError(f"rule must be 'flygcl', 'sib' or 'reached', got {rule!r}")
        self.period = period
        self.rule = rule
        self.next_mark: Optional[int] = period

    def step(self, samples_seen: int, batch_size: int) -> Optional[int]:
        """Report a finished batch; return the timestamp to record if an evaluation is due, else ``None``.

        Args:
            samples_seen: samples consumed so far *including* this batch (all ranks).
            batch_size: global size of this batch.
        """
        if self.next_mark is None:
            return None
        samples_seen = check_int(samples_seen, "samples_seen", caller="AnytimeEvalTrigger.step", minimum=0)
        batch_size = check_int(batch_size, "batch_size", caller="AnytimeEvalTrigger.step", minimum=0)
        if self.rule == "flygcl":
            due = samples_seen + batch_size > self.next_mark
        elif self.rule == "sib":
            due = samples_seen > self.next_mark
        else:
            due = samples_seen >= self.next_mark
        if not due:
            return None
        stamp = self.next_mark
        self.next_mark += self.period
        return stamp

    def state_dict(self) -> Dict[str, Any]:
        """Trigger state for resuming a run (period, rule and the next mark)."""
        return {"period": self.period, "rule": self.rule, "next_mark": self.next_mark}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""
        self.period, self.rule, self.next_mark = state["period"], state["rule"], state["next_mark"]


# ----------------------------------------------------------------------------------------------------
# Matrices
# ----------------------------------------------------------------------------------------------------


def class_accuracy_matrix(
    log: EvaluationLog, epsilon: float = REFERENCE_EPSILON, dtype: Any = np.float64
) -> np.ndarray:
    """``(T, K)`` per-class accuracies at the session ends, exposure-indexed (reference ``cls_acc``).

    ``K`` is the number of classes exposed at the last session end; classes not yet exposed at an
    earlier session end get 0 (as in the reference, whose vectors have one entry per class and zero
    counts there). The entries are ``correct / (count + epsilon)`` divided in ``dtype`` (the matrix
    is float64 either way): the reference divides float32 tensors, so ``dtype=np.float32`` gives its
    ``cls_acc`` exactly, and the float64 default differs from it by float32 rounding (about 6e-8).
    """
    ends = log.session_ends
    width = max((r.num_exposed for r in ends), default=0)
    matrix = np.zeros((len(ends), width), dtype=np.float64)
    for row, rec in enumerate(ends):
        if rec.num_exposed:
            values = rec.class_accuracy(epsilon, dtype)
            matrix[row, : rec.num_exposed] = np.nan_to_num(values, nan=0.0)
    return matrix


def first_exposure_sessions(log: EvaluationLog) -> np.ndarray:
    """``(K,)`` session in which each exposure index was first exposed, from the session-end records.

    Exposure indices ``[n_{j-1}, n_j)`` belong to session ``j``, where ``n_j`` is the number of
    exposed classes at the end of session ``j``.
    """
    counts = [r.num_exposed for r in log.session_ends]
    width = counts[-1] if counts else 0
    sessions = np.empty(width, dtype=np.int64)
    previous = 0
    for session, count in enumerate(counts):
        sessions[previous:count] = session
        previous = count
    return sessions


def session_accuracy_matrix(log: EvaluationLog, class_session: Optional[ArrayLike] = None) -> np.ndarray:
    """The paper's ``(T, T)`` matrix ``R[i, j]``: accuracy after session ``i`` on the data of session ``j``.

    Args:
        log: the run's log; row ``i`` is its ``i``-th session-end evaluation.
        class_session: exposure-indexed session of every class (length >= exposed classes at the
            last session end). Default: :func:`first_exposure_sessions`.

    Returns:
        ``R`` with NaN where session ``j`` has no exposed test sample at evaluation ``i`` (for the
        default map: every ``j > i``, and whole columns of sessions that exposed no new class).
    """
    ends = log.session_ends
    num_sessions = len(ends)
    if class_session is None:
        mapping = first_exposure_sessions(log)
    else:
        mapping = _as_count_vector(class_session, "class_session")
        needed = max((r.num_exposed for r in ends), default=0)
        if mapping.size < needed:
            raise ValueError(
                f"class_session has {mapping.size} entries but {needed} classes are exposed at the last session end"
            )
        if mapping.size and mapping.max() >= num_sessions:
            raise ValueError(
                f"class_session holds session {int(mapping.max())} but the log has {num_sessions} session ends"
            )
    matrix = np.full((num_sessions, num_sessions), np.nan)
    for row, rec in enumerate(ends):
        if rec.num_exposed == 0:
            continue
        session_of_sample = mapping[: rec.num_exposed]
        correct = np.bincount(session_of_sample, weights=rec.correct, minlength=num_sessions)
        total = np.bincount(session_of_sample, weights=rec.total, minlength=num_sessions)
        has_data = total > 0
        matrix[row, has_data] = correct[has_data] / total[has_data]
    return matrix


# ----------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------


def _check_definition(definition: str) -> None:
    if definition not in ("code", "paper"):
        raise ValueError(f"definition must be 'code' (official FlyGCL) or 'paper', got {definition!r}")


def a_auc(log: EvaluationLog) -> float:
    """A_auc: mean accuracy of the anytime evaluations (same in code and paper; NaN if none)."""
    return _nan_mean(log.anytime_accuracies())


def a_last(log: EvaluationLog, definition: Definition = "code", class_session: Optional[ArrayLike] = None) -> float:
    """A_last: final accuracy.

    ``"code"``: sample-level accuracy of the last session-end evaluation over all exposed classes.
    ``"paper"``: ``mean_j R[T, j]``, the mean over sessions of the final per-session accuracy.
    """
    _check_definition(definition)
    if definition == "code":
        accuracies = log.session_accuracies()
        return float(accuracies[-1]) if accuracies.size else math.nan
    matrix = session_accuracy_matrix(log, class_session)
    return _nan_mean(matrix[-1]) if matrix.size else math.nan


def a_avg(log: EvaluationLog, definition: Definition = "code", class_session: Optional[ArrayLike] = None) -> float:
    """A_avg: average accuracy over the session ends.

    ``"code"``: mean of the session-end accuracies (each over all classes exposed at that point).
    ``"paper"``: ``mean_i R[i, i]``, each session's accuracy on its own data right after it.
    """
    _check_definition(definition)
    if definition == "code":
        return _nan_mean(log.session_accuracies())
    return _nan_mean(np.diagonal(session_accuracy_matrix(log, class_session)))


def f_last(log: EvaluationLog, definition: Definition = "code", class_session: Optional[ArrayLike] = None) -> float:
    """F_last: final forgetting (lower is better).

    ``"code"`` (class-level, FlyGCL ``main_worker``): over classes whose maximum per-class accuracy
    in the first ``T-1`` session ends is > 0, the mean of (that maximum - final accuracy), with the
    reference's ``correct / (count + 1e-5)`` per-class accuracies. NaN with fewer than two sessions.

    ``"paper"``: ``mean_j (max_i R[i, j] - R[T, j])`` over the sessions ``j`` with final data; the max
    runs over every session end where column ``j`` is defined (including the last, as written in the
    paper, so the last session contributes 0).
    """
    _check_definition(definition)
    if definition == "code":
        return class_forgetting(class_accuracy_matrix(log))
    matrix = session_accuracy_matrix(log, class_session)
    if matrix.size == 0:
        return math.nan
    final = matrix[-1]
    has_final = ~np.isnan(final)
    if not has_final.any():
        return math.nan
    best = np.nanmax(matrix[:, has_final], axis=0)
    return _nan_mean(best - final[has_final])


def bwt(log: EvaluationLog, definition: Definition = "code", class_session: Optional[ArrayLike] = None) -> float:
    """Backward transfer (higher is better; negative means forgetting).

    ``"code"`` (class-level ``BWT_last`` of FlyGCL): for each class with a non-zero per-class accuracy
    at some session end before the last, (final accuracy - first such non-zero accuracy); the mean
    over those classes. NaN with fewer than two sessions or no such class (reference: -999).

    ``"paper"``: ``mean_{i<T} (R[T, i] - R[i, i])`` over the sessions where both are defined.
    """
    _check_definition(definition)
    if definition == "code":
        return class_backward_transfer(class_accuracy_matrix(log))
    matrix = session_accuracy_matrix(log, class_session)
    if matrix.shape[0] < 2:
        return math.nan
    diag = np.diagonal(matrix)[:-1]
    return _nan_mean(matrix[-1, :-1] - diag)


def class_forgetting(cls: np.ndarray) -> float:
    """F_last of the code from a ``(T, K)`` :func:`class_accuracy_matrix`: over the classes whose best
    accuracy before the last session end is > 0, the mean of that best minus the final accuracy."""
    if cls.shape[0] < 2:
        return math.nan
    best_before = cls[:-1].max(axis=0)
    counted = best_before > 0
    return _nan_mean((best_before - cls[-1])[counted])


def class_backward_transfer(cls: np.ndarray) -> float:
    """BWT of the code from a ``(T, K)`` :func:`class_accuracy_matrix`: over the classes with a
    non-zero accuracy before the last session end, the mean of the final minus the first such one."""
    if cls.shape[0] < 2:
        return math.nan
    before = cls[:-1]
    nonzero = before > 0
    counted = nonzero.any(axis=0)
    first_row = np.argmax(nonzero, axis=0)  # first True per column
    first_acc = before[first_row, np.arange(before.shape[1])]
    return _nan_mean((cls[-1] - first_acc)[counted])


def summarize(
    log: EvaluationLog, definition: Definition = "code", class_session: Optional[ArrayLike] = None
) -> Dict[str, float]:
    """All metrics of a run as ``{"A_auc", "A_last", "A_avg", "F_last", "BWT"}`` (fractions, NaN if undefined)."""
    return {
        "A_auc": a_auc(log),
        "A_last": a_last(log, definition, class_session),
        "A_avg": a_avg(log, definition, class_session),
        "F_last": f_last(log, definition, class_session),
        "BWT": bwt(log, definition, class_session),
    }
