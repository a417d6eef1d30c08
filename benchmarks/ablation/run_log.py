"""What a training shows in the dashboards (``--log``): at every anytime evaluation, per variant, the anytime
accuracy (and the ensemble members'), the routing accuracy and the experts' use of its selection, the
forgetting so far, the training loss and throughput; at the end the metrics and the settings.

:class:`TrainingLog` is the trainer's watch (``OnlineTrainer.train(watch=...)``): the loss is summed on the
device batch by batch and read once per evaluation; the rest is read from the evaluator's counts of that
evaluation. The backends are ``benchmarks.ablation.loggers``; docs/benchmark.md lists the tags.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from torch import Tensor

from ..core.metrics import f_last
from ..core.protocol import RunSpec
from ..core.variants import VARIANTS
from .diagnostics import ROUTING_VERSIONS
from .loggers import LOGGERS, LogTarget, RunLogger

__all__ = ["SUMMARY_METRICS", "TrainingLog", "flat_settings", "log_target", "training_log"]

#: a variant's selection -> the routing counts that score it (``oracle`` is the true expert: nothing to score)
_SELECTION_COUNTS = {"own": "own", "routed": "rear"}
#: the metrics of a run record written as the dashboard run's summary
SUMMARY_METRICS = ("A_auc", "A_last", "A_avg", "F_last")


def log_target(output: Path) -> LogTarget:
    """Where a sweep writing to ``output`` logs; its shards share the folder and the group."""
    return LogTarget(output / "logs", Path(output).as_posix())


class TrainingLog:
    """The dashboard runs of one training: one per (backend, variant), opened by :meth:`open`.

    Args:
        names: backends (``--log``, keys of ``benchmarks.ablation.loggers.LOGGERS``).
        target: where the sweep logs (:func:`log_target`).
        runs: the training's variants as dashboard runs.
        hparams: the settings of the training (the variant is added per run).
    """

    def __init__(self, names: Sequence[str], target: LogTarget, runs: Sequence[RunSpec],
                 hparams: Mapping[str, Any]) -> None:
        self.names, self.target, self.runs, self.hparams = list(names), target, list(runs), dict(hparams)
        self.loggers: Dict[str, List[RunLogger]] = {}
        self.evaluator: Any = None
        self.loss_sum: Optional[Tensor] = None
        self.loss_batches = 0
        self.last_samples, self.last_seconds = 0, 0.0

    def open(self, evaluator: Any, *, samples_seen: int, train_seconds: float) -> None:
        """Open every run at the stream position the training starts from (0, or a checkpoint's)."""
        self.evaluator, self.last_samples, self.last_seconds = evaluator, samples_seen, train_seconds
        start = samples_seen + 1 if samples_seen > 0 else 0  # the first step this process logs
        for run in self.runs:
            opened = self.loggers.setdefault(run.variant, [])  # kept one by one: close() ends what did open
            for name in self.names:
                opened.append(LOGGERS[name].logger(self.target, run, start_step=start, hparams=self.run_hparams(run)))

    def run_hparams(self, run: RunSpec) -> Dict[str, Any]:
        return {**self.hparams, "method": run.method, "variant": run.variant, "dataset": run.dataset, "seed": run.seed}

    # ------------------------------------------------------------------------------------ the watch
    def batch_trained(self, loss: Tensor) -> None:
        """A stream batch's last loss, summed on its device (read at the next evaluation)."""
        loss = loss.detach().double()
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.loss_batches += 1

    def evaluated(self, trainer: Any) -> None:
        """After an anytime evaluation: every variant's scalars at the stream samples seen."""
        position = trainer.position
        shared = self.training_scalars(trainer)
        for variant, loggers in self.loggers.items():
            scalars = {**self.variant_scalars(variant), **shared}
            for logger in loggers:
                logger.log(position.samples_seen, scalars)

    def training_scalars(self, trainer: Any) -> Dict[str, float]:
        """Loss since the last evaluation, training throughput, each expert's share of the training samples."""
        position, scalars = trainer.position, {}
        if self.loss_sum is not None:
            scalars["train/loss"] = float(self.loss_sum) / self.loss_batches
        seconds = position.train_seconds - self.last_seconds
        if seconds > 0:
            scalars["train/samples_per_second"] = (position.samples_seen - self.last_samples) / seconds
        self.loss_sum, self.loss_batches = None, 0
        self.last_samples, self.last_seconds = position.samples_seen, position.train_seconds
        trained = trainer.usage.counts.sum(dim=0).tolist()
        scalars.update({f"experts/trained_share/{e}": n / max(sum(trained), 1) for e, n in enumerate(trained)})
        return scalars

    def variant_scalars(self, variant: str) -> Dict[str, float]:
        """The variant's accuracy, its members', forgetting so far, its selection's routing and expert use."""
        evaluator = self.evaluator
        log = evaluator.logs[variant]
        scalars = {"accuracy/anytime": log.records[-1].accuracy}
        for name, member in zip(evaluator.member_names, evaluator.member_logs.get(variant, ())):
            scalars[f"accuracy/member/{name}"] = member.records[-1].accuracy
        forgetting = f_last(log)  # over the session ends so far: NaN before the second
        if not math.isnan(forgetting):
            scalars["forgetting"] = forgetting
        who = _SELECTION_COUNTS.get(VARIANTS[variant].selection)
        entry = evaluator.routing[-1]
        if who is not None and entry["samples"]:
            for version in ROUTING_VERSIONS:
                scalars[f"routing/{version}"] = entry[f"{who}_{version}"] / entry["samples"]
            scalars["routing/chance_modal"] = entry["chance_modal"] / entry["samples"]
            use = evaluator.expert_use[who].tolist()
            scalars.update({f"experts/routed_share/{e}": n / max(sum(use), 1) for e, n in enumerate(use)})
        return {tag: value for tag, value in scalars.items() if not math.isnan(value)}

    # ------------------------------------------------------------------------------------- the end
    def finish(self, records: Mapping[str, Mapping[str, Any]], samples_seen: int) -> None:
        """Each variant's metrics as its run's summary, with the settings as hyperparameters."""
        for variant, loggers in self.loggers.items():
            metrics = records[variant]["metrics"]
            summary = {name: metrics[name] for name in SUMMARY_METRICS}
            run = next(run for run in self.runs if run.variant == variant)
            for logger in loggers:
                logger.finish(samples_seen, summary, self.run_hparams(run))

    def close(self) -> None:
        """Close every run opened (also after a failed or interrupted training: their files end cleanly)."""
        for loggers in self.loggers.values():
            for logger in loggers:
                logger.close()
        self.loggers = {}


def flat_settings(settings: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested settings as one level, ``a.b`` keys (the dashboards' hyperparameter tables are flat)."""
    flat: Dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def training_log(names: Sequence[str], output: Path, *, method: str, dataset: str, seed: int,
                 variants: Sequence[str], settings: Mapping[str, Any]) -> Optional[TrainingLog]:
    """The :class:`TrainingLog` of one training (``None`` without ``--log``)."""
    if not names:
        return None
    runs = [RunSpec(method, variant, dataset, seed) for variant in variants]
    return TrainingLog(names, log_target(output), runs, flat_settings(settings))
