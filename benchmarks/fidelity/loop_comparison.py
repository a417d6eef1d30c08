"""One method's metrics end to end: the official trainer's own loop (``official_loop``: its stream,
its evaluation points, its summary) and the cross-ablation's runner (``OnlineTrainer.train``: our
stream, ``AnytimeEvalTrigger``, ``benchmarks.core.metrics``) on the same generated data, seed and
initial state; compared batch by batch, evaluation by evaluation, metric by metric."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from benchmarks.core import metrics
from benchmarks.core import reference_checkout as ref
from benchmarks.core.metrics import EvaluationLog, summarize

from .comparison import check_pairing, checkout_commit
from .measures import copy_tensors, tensor_differences, worst
from .official_loop import LoopSetup, OfficialRun, run_official_loop
from .ours import OursSide
from .pairs import MethodPair
from .setting import Setting

__all__ = ["LOOP_METHODS", "LOOP_SETUPS", "METRICS", "LoopRow", "Point", "compare_loop"]

# HiDe-Prompt's and NoRGa's classifier alignment: its batch of 64 whatever the stream's, as the side-by-side
# rows give it (``hide_state.setup_trainer``), and their reseeding before each session end.
_ALIGNMENT = {"batchsize": 64}
#: the pairs run through the official loop, and what each run gets beyond the launch scripts' flags
#: (MISA's official run needs its prompt files; HiDe-LoRA's and HiDe-Adapter's their expert blocks)
LOOP_SETUPS: Dict[str, LoopSetup] = {
    "l2p": LoopSetup(), "dualprompt": LoopSetup(), "mvp": LoopSetup(), "flyprompt": LoopSetup(),
    "hide": LoopSetup(attributes=_ALIGNMENT), "hide-no-orth": LoopSetup(("--lam_orth", "0"), _ALIGNMENT),
    "norga": LoopSetup(attributes=_ALIGNMENT), "norga-no-orth": LoopSetup(("--lam_orth", "0"), _ALIGNMENT),
    "sd-lora": LoopSetup(),
    "seq-ft": LoopSetup(("--opt_name", "sgd_sl")), "seq-ft-sl": LoopSetup(("--opt_name", "sgd_sl")),
    # the official CODA-P's keys are key_dim wide (ViT-B's 768 by default, no flag): the setting's width here
    "coda-prompt": LoopSetup(model_kwargs={"key_dim": Setting().shape["embed_dim"]}), "s-prompt": LoopSetup(),
}
LOOP_METHODS = tuple(LOOP_SETUPS)
#: (our ``summarize`` key, the official summary's key)
METRICS = (("A_auc", "A_auc"), ("A_last", "A_last"), ("A_avg", "A_avg"), ("F_last", "F_last"), ("BWT", "BWT_last"))


@dataclass(frozen=True)
class Point:
    """One evaluation: its kind, the mark it is stamped with (anytime: the period's multiple it
    answered; session end: the samples seen), the stream samples trained, the test samples scored,
    the accuracy."""

    kind: str
    mark: int
    samples_seen: int
    test_samples: int
    accuracy: float

    def where(self) -> tuple:
        return self.kind, self.mark, self.samples_seen, self.test_samples


@dataclass
class LoopRow:
    """The comparison of one method (``stream``: ``equal``, or how the two streams differ).

    ``our_float32``: our F_last and BWT from per-class accuracies divided in float32, as the official
    code divides them (``class_accuracy_matrix(dtype=np.float32)``).
    """

    method: str
    official: str
    commit: str
    batches: int
    stream: str
    official_points: List[Point]
    our_points: List[Point]
    official_metrics: Dict[str, float]
    our_metrics: Dict[str, float]
    our_float32: Dict[str, float]
    weights_relative: float
    seconds: float

    @property
    def points_equal(self) -> bool:
        return [p.where() for p in self.official_points] == [p.where() for p in self.our_points]

    @property
    def accuracy_difference(self) -> float:
        """The largest absolute difference of the accuracies at the same points (NaN if the points differ)."""
        if not self.points_equal:
            return math.nan
        return max((abs(a.accuracy - b.accuracy) for a, b in zip(self.official_points, self.our_points)), default=0.0)

    def metric_differences(self) -> Dict[str, float]:
        """Ours minus the official summary's, per metric (fractions)."""
        return {ours: self.our_metrics[ours] - self.official_metrics[official] for ours, official in METRICS}

    def to_dict(self) -> Dict[str, Any]:
        record = asdict(self)
        record.update(points_equal=self.points_equal, accuracy_difference=self.accuracy_difference,
                      metric_differences=self.metric_differences())
        return record


def official_points(run: OfficialRun) -> List[Point]:
    """The official evaluations, each anytime one stamped with its mark from ``seed_*_eval_time.npy``."""
    marks = iter(run.anytime_marks)
    points = []
    for evaluation in run.evaluations:
        mark = next(marks) if evaluation.kind == "anytime" else evaluation.samples_seen
        points.append(Point(evaluation.kind, mark, evaluation.samples_seen, evaluation.test_samples, evaluation.accuracy))
    anytime = [point.accuracy for point in points if point.kind == "anytime"]
    if len(anytime) != len(run.anytime_marks) or anytime != run.anytime_accuracies:
        raise ValueError(f"the official run's files hold {len(run.anytime_marks)} anytime evaluations but "
                         f"online_evaluate ran {len(anytime)}; expected the same evaluations in both")
    return points


def our_points(ours: OursSide) -> List[Point]:
    log = ours.run.evaluator.logs[ours.variant]
    return [Point(r.kind, r.timestamp, r.samples_seen, int(r.total.sum()), float(r.accuracy)) for r in log.records]


def float32_class_metrics(log: EvaluationLog) -> Dict[str, float]:
    """F_last and BWT of ``log`` from float32 per-class accuracies (the official ``cls_acc``)."""
    matrix = metrics.class_accuracy_matrix(log, dtype=np.float32)
    return {"F_last": metrics.class_forgetting(matrix), "BWT": metrics.class_backward_transfer(matrix)}


def _stream(official: OfficialRun, batches: List[List[int]]) -> str:
    if official.batches != batches:
        return "differs: batch for batch"
    return "fed ours: the official sampler's order differs" if official.fed else "equal"


def _preparation(pair: MethodPair, ours: OursSide):
    """The official model, once ``main_worker`` has built it: our initial state (the side-by-side start)."""

    def prepare(model: nn.Module) -> None:
        names = {ours_name: name for name, ours_name in pair.weights.items()}
        copy_tensors(ours.state(), dict(model.state_dict(keep_vars=True)), names)
        if pair.align is not None:
            pair.align(model, ours.model)

    return prepare


def compare_loop(
    checkout: ref.Checkout, pair: MethodPair, setting: Setting, setup: Optional[LoopSetup] = None
) -> LoopRow:
    """Run ``pair``'s official loop (with ``setup``'s flags and attributes: ``LOOP_SETUPS``), then our
    runner, on ``setting``; compare (module docstring)."""
    started = time.perf_counter()
    torch.manual_seed(setting.seed)
    train, test = setting.data()
    ours = OursSide(pair, setting, train, test)
    order = [indices.tolist() for indices in ours.run.stream.session_orders]
    setup = dataclasses.replace(setup or LoopSetup(), order=order, session_end_seed=pair.session_end_seed)
    official = run_official_loop(checkout, pair.official, setting, train=train, test=test,
                                 backbone=ours.model.backbone, lr=pair.official_lr,
                                 prepare=_preparation(pair, ours), setup=setup)
    check_pairing(pair, official, ours)
    ours.trainer.train()
    batches = [batch.indices.tolist() for batch in ours.batches()]
    differences = tensor_differences(official.state(), ours.state(), pair.names())
    log = ours.run.evaluator.logs[ours.variant]
    return LoopRow(
        method=f"{pair.method} ({pair.variant})" if pair.variant else pair.method, official=ref.CLASSES[pair.official][3], commit=checkout_commit(checkout.path),
        batches=len(batches), stream=_stream(official, batches), official_points=official_points(official),
        our_points=our_points(ours), official_metrics=official.summary,
        our_metrics=summarize(log), our_float32=float32_class_metrics(log), weights_relative=worst(differences).relative,
        seconds=time.perf_counter() - started,
    )
