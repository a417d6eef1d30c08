"""Where a sweep's runs are watched while they train: one class per dashboard, in the table :data:`LOGGERS`.

A dashboard run is one variant of one training (a :class:`~benchmarks.core.protocol.RunSpec`: its name
and tags are the method, the variant, the dataset and the seed), so that every variant of a method is a curve of the same chart. The
runner talks to :class:`RunLogger` only (``benchmarks.ablation.run_log``): scalars by step (stream samples
seen), then the run's metrics as its summary and its settings as hyperparameters. A backend's package is
imported only when its logger opens; :func:`parse_loggers` checks, before any work, that it is installed.

A run resumed from a checkpoint continues its curves: the logger opens at ``start_step``, the first step
not logged before the checkpoint (TensorBoard purges the later steps of the killed process, the CSV drops
them, W&B resumes the run by its id and keeps its steps increasing). Every process writes its own files:
TensorBoard's event files are named after the process, and a training is held by one process at a time
(``claims.py``); under ``torchrun`` only the first process logs.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..core.protocol import RunSpec

__all__ = ["LOGGERS", "LogTarget", "RunLogger", "parse_loggers", "run_folder", "run_tags"]


def run_folder(run: RunSpec) -> Path:
    """A dashboard run's folder under a backend's: one variant of one training, laid out as the result files."""
    return Path(run.key)


def run_tags(run: RunSpec) -> Tuple[str, ...]:
    return (run.method, run.variant, run.dataset, f"seed{run.seed}")


@dataclass(frozen=True)
class LogTarget:
    """Where a sweep logs: ``folder`` (``<output>/logs``) and ``group``, the sweep every shard shares."""

    folder: Path
    group: str


class RunLogger:
    """One dashboard run, as the runner writes it (the protocol every backend implements)."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Scalars at ``step``; on disk when the call returns (a killed process loses none before a checkpoint)."""
        raise NotImplementedError

    def finish(self, step: int, summary: Mapping[str, float], hparams: Mapping[str, Any]) -> None:
        """The run's metrics as its summary, with its settings as hyperparameters."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def hparam_value(value: Any) -> Any:
    """A setting as the dashboards take hyperparameters: numbers, strings and booleans as they are, the rest
    (lists, objects, ``None``) as JSON text."""
    return value if isinstance(value, (bool, int, float, str)) else json.dumps(value, sort_keys=True)


class TensorBoardLogger(RunLogger):
    """``torch.utils.tensorboard``: an event file in ``<folder>/tensorboard/<run>``, the hyperparameters in the
    HParams plugin's format with the metrics as ``metrics/<name>``."""

    def __init__(self, target: LogTarget, run: RunSpec, *, start_step: int, hparams: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events of a killed process at or after the first step this one logs are dropped on reading.
        self.writer = SummaryWriter(log_dir=str(target.folder / "tensorboard" / run_folder(run)), purge_step=start_step)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def finish(self, step: int, summary: Mapping[str, float], hparams: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        metrics = {f"metrics/{name}": value for name, value in summary.items()}
        for event in hparams_summaries({k: hparam_value(v) for k, v in hparams.items()}, metrics):
            self.writer.file_writer.add_summary(event)
        self.log(step, metrics)

    def close(self) -> None:
        self.writer.close()


class WandbLogger(RunLogger):
    """``wandb``: one run per variant in the sweep's group, its settings as the config. The run id is kept in
    ``<folder>/wandb/ids/<run>.txt``: a fresh training starts a new run, a resumed one continues its own.
    Offline mode (``WANDB_MODE=offline``) needs no account; ``WANDB_PROJECT`` names the project."""

    def __init__(self, target: LogTarget, run: RunSpec, *, start_step: int, hparams: Mapping[str, Any]) -> None:
        import wandb

        id_file = target.folder / "wandb" / "ids" / run_folder(run).with_suffix(".txt")
        resumed = start_step > 0 and id_file.exists()
        run_id = id_file.read_text().strip() if resumed else uuid.uuid4().hex[:16]
        id_file.parent.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "fly-modules"), group=target.group, name=run.key,
            tags=list(run_tags(run)), config={k: hparam_value(v) for k, v in hparams.items()}, id=run_id,
            resume="allow", dir=os.environ.get("WANDB_DIR", str(target.folder)), reinit="create_new",
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)  # W&B ignores a step below its last: nothing is logged twice

    def finish(self, step: int, summary: Mapping[str, float], hparams: Mapping[str, Any]) -> None:
        self.run.summary.update(dict(summary))

    def close(self) -> None:
        self.run.finish()


class CsvLogger(RunLogger):
    """``<folder>/csv/<run>.csv``: rows ``step,tag,value``; the summary as ``summary/<name>`` and the settings
    as ``hparam/<name>`` rows at the last step."""

    FIELDS = ("step", "tag", "value")

    def __init__(self, target: LogTarget, run: RunSpec, *, start_step: int, hparams: Mapping[str, Any]) -> None:
        self.path = (target.folder / "csv" / run_folder(run)).with_suffix(".csv")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: List[Dict[str, str]] = []
        if start_step > 0 and self.path.exists():  # a resumed run: the rows before its first step
            with self.path.open(newline="") as file:
                kept = [row for row in csv.DictReader(file) if int(row["step"]) < start_step]
        self.file = self.path.open("w", newline="")
        self.rows = csv.DictWriter(self.file, fieldnames=self.FIELDS)
        self.rows.writeheader()
        self.rows.writerows(kept)
        self.file.flush()

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.rows.writerows({"step": step, "tag": tag, "value": value} for tag, value in scalars.items())
        self.file.flush()

    def finish(self, step: int, summary: Mapping[str, float], hparams: Mapping[str, Any]) -> None:
        self.log(step, {**{f"summary/{k}": v for k, v in summary.items()},
                        **{f"hparam/{k}": hparam_value(v) for k, v in hparams.items()}})

    def close(self) -> None:
        self.file.close()


@dataclass(frozen=True)
class Backend:
    """A dashboard: its logger class, the package it imports and the extra of setup.cfg that installs it."""

    logger: type
    package: Optional[str]
    extra: Optional[str]


#: ``--log`` name -> backend
LOGGERS: Dict[str, Backend] = {
    "tensorboard": Backend(TensorBoardLogger, "tensorboard", "tensorboard"),
    "wandb": Backend(WandbLogger, "wandb", "wandb"),
    "csv": Backend(CsvLogger, None, None),
}


def parse_loggers(text: str) -> List[str]:
    """``--log``'s value: comma-separated names of :data:`LOGGERS`, each with its package installed."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in LOGGERS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected comma-separated names from {', '.join(LOGGERS)}, got {text!r}")
    for name in names:
        backend = LOGGERS[name]
        if backend.package is not None and importlib.util.find_spec(backend.package) is None:
            raise argparse.ArgumentTypeError(f"{name} needs the {backend.package} package: "
                                             f"pip install -e \".[{backend.extra}]\" (or \".[log]\" for every logger)")
    return list(dict.fromkeys(names))
