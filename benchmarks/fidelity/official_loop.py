"""The official trainer's own run, started as FlyGCL's ``main.py`` starts it: the checkout's argument
parser (``configuration/config.py``) on the launch scripts' flags, the method's trainer built from
them with the seed, ``run()`` and so ``main_worker``: its seeding, its Si-Blurry sampler and test
sampler, its internal step schedule, its evaluation points, its summary in the log (A_auc, A_avg,
A_last, F_last, BWT_last) and its ``seed_*.npy`` files. One process, on the CPU.

Substituted from outside, nothing in the checkout written (docs/verification.md says the same):

* the data: ``--dataset`` names our generated set, which ``DATASETS`` and ``get_statistics`` hand to
  ``main_worker``, wrapped by the checkout's own ``OnlineIterDataset`` (loaded from its file); the
  images already are the model's input, so the trainer's transforms are the identity (no
  augmentation, as on our side);
* the device: ``main_worker`` takes the node's GPU count as the world size and ``rank % count`` as its
  device; here one process whose device is the CPU;
* the backbone: ``--backbone`` names the checkout's ViT loaded with our backbone's weights (and
  ``import models.vit``, which ``select_model`` makes for ``slca``, gives the loaded module);
* the start: once ``main_worker`` has built the model, the model takes our method's initial state
  (the ``prepare`` callable), as in the side-by-side comparison;
* what a pair's side-by-side row also gives the official trainer (``LoopSetup``): more flags, trainer
  attributes once its training loader is built, the generator reseeded before each session end;
* what is read: the batches ``online_step`` gets (their dataset indices), the evaluations
  ``online_evaluate`` makes (stream position, test samples, accuracy), the log records and files.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import re
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from benchmarks.core import reference_checkout as ref

from .official import BACKBONE_NAME, CopiedBackbone
from .seqft_state import vit_importable
from .setting import Setting

__all__ = ["DATASET", "LOOP_FILES", "LoopEvaluation", "LoopSetup", "OfficialRun", "missing_loop_files", "official_arguments",
           "run_official_loop"]

DATASET = "fidelity_generated"  # the --dataset name of the generated set
#: what the loop reads of a checkout beyond the models and trainers
LOOP_FILES = ("configuration/config.py", "datasets/OnlineIterDataset.py", "utils/onlinesampler.py")
# main.py's --method name of a key of reference_checkout.CLASSES, where the two differ
_METHOD_FLAGS = {"hide-lora": "hide_lora", "hide-adapter": "hide_adapter", "sd-lora": "sdlora"}
_METHOD_FLAGS.update({"coda-prompt": "codaprompt", "s-prompt": "sprompt"})
_SUMMARY = re.compile(r"A_auc (\S+) \| A_avg (\S+) \| A_last (\S+) \| F_last (\S+)")
_BWT = re.compile(r"BWT_last (\S+)")


@dataclass(frozen=True)
class LoopEvaluation:
    """One ``online_evaluate`` call of the loop: ``kind`` (``anytime`` or ``session_end``), the stream
    samples ``online_step`` had received, the test samples scored, the accuracy returned."""

    kind: str
    samples_seen: int
    test_samples: int
    accuracy: float


@dataclass
class OfficialRun:
    """What one ``main_worker`` run did and wrote.

    ``sampler_orders``: the sampler's per-session dataset indices, as built from the seed;
    ``batches``: the dataset indices of each ``online_step``; ``fed``: whether the sampler was given
    another order (``run_official_loop``'s ``order``); ``summary``: the summary log line's metrics;
    ``anytime_marks`` / ``anytime_accuracies`` / ``session_accuracies``: its ``seed_*.npy`` files.
    """

    sampler_orders: List[List[int]] = field(default_factory=list)
    batches: List[List[int]] = field(default_factory=list)
    evaluations: List[LoopEvaluation] = field(default_factory=list)
    fed: bool = False
    summary: Dict[str, float] = field(default_factory=dict)
    anytime_marks: List[int] = field(default_factory=list)
    anytime_accuracies: List[float] = field(default_factory=list)
    session_accuracies: List[float] = field(default_factory=list)
    model: Optional[nn.Module] = None

    def state(self) -> Dict[str, Tensor]:
        return dict(self.model.state_dict(keep_vars=True))

    def trainable(self) -> Dict[str, nn.Parameter]:
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}


def official_arguments(setting: Setting, method: str, lr: float, log_path: str) -> List[str]:
    """The launch scripts' flags (``scripts/common_baselines.sh``) with the setting's sizes: Adam at
    ``lr``, constant schedule, ``--rnd_NM``, no augmentation, no mixed precision, no workers."""
    protocol = setting.protocol()
    return [
        "--seeds", str(setting.seed), "--note", "fidelity", "--log_path", log_path, "--method", method,
        "--backbone", BACKBONE_NAME, "--dataset", DATASET, "--data_dir", log_path,
        "--n_tasks", str(setting.num_sessions), "--step_num", str(setting.num_experts),
        "--m", str(round(protocol.blurry_ratio * 100)), "--n", str(round(protocol.disjoint_ratio * 100)),
        "--rnd_NM", "--opt_name", "adam", "--sched_name", "default", "--n_worker", "0",
        "--batchsize", str(setting.batch_size), "--lr", str(lr), "--num_epochs", "1",
        "--online_iter", str(setting.online_iter), "--transforms", "--topk", "1",
        "--eval_period", str(setting.eval_period), "--rp_dim", str(setting.expansion_dim),
        "--rp_ridge", str(setting.ridge),
    ]


def missing_loop_files(path: Path) -> List[str]:
    return [name for name in LOOP_FILES if not (Path(path) / name).is_file()]


class GeneratedImages(Dataset):
    """One of our generated records as the official pipeline reads a torchvision set: ``classes``,
    ``targets`` (a list of ints), ``(image, label)`` items. The image is already the model's input."""

    def __init__(self, record: Any) -> None:
        self.record, self.classes = record, list(record.classes)
        self.targets = [int(label) for label in record.targets]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> Any:
        return self.record[index]


class _DataSets:
    """``DATASETS[--dataset]`` of ``main_worker``: our train or test record, whatever the transform."""

    def __init__(self, train: Any, test: Any) -> None:
        self.train, self.test = GeneratedImages(train), GeneratedImages(test)

    def __call__(self, root: str, train: bool, download: bool = False, transform: Any = None) -> GeneratedImages:
        return self.train if train else self.test

    def statistics(self, dataset: str) -> tuple:
        """``get_statistics``: mean, std, classes, input size, channels."""
        record = self.train.record
        return record.mean, record.std, len(self.train.classes), record.image_size, 3


class _CpuNode:
    """``main_worker``'s GPU count on this node: one device (no processes spawned), and ``rank % it``,
    the device ``main_worker`` picks, is the CPU."""

    def __gt__(self, other: int) -> bool:
        return 1 > other

    def __rmod__(self, rank: int) -> str:
        return "cpu"


def _identity(images: Tensor) -> Tensor:
    return images


@dataclass(frozen=True)
class LoopSetup:
    """What an official run gets beyond the launch scripts' flags: more ``flags``; ``attributes`` of the
    trainer set once ``main_worker`` has built its data and training loader; ``session_end_seed``: the
    global generator reseeded with it plus the session before each ``online_after_task`` (as both sides
    of a pair with ``MethodPair.session_end_seed`` are); ``order``: the per-session dataset indices fed
    to the sampler when its own differ (``None``: its own)."""

    flags: Tuple[str, ...] = ()
    attributes: Mapping[str, Any] = field(default_factory=dict)
    session_end_seed: Optional[int] = None
    order: Optional[List[List[int]]] = None
    #: the model's constructor options that no flag sets (CODA-P's key width), added to what ``select_model`` gets
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)


class _Watcher:
    """Set on the trainer instance, in front of the class's own methods (which it calls unchanged):
    the data substitutions after ``setup_distributed_dataset``, our initial state after
    ``setup_distributed_model``, and the records of the batches and evaluations."""

    def __init__(self, trainer: Any, prepare: Callable[[nn.Module], None], setup: LoopSetup) -> None:
        self.trainer, self.prepare, self.setup = trainer, prepare, setup
        self.run, self.samples_seen = OfficialRun(), 0
        for name in ("setup_distributed_dataset", "setup_distributed_model", "online_step", "online_evaluate",
                     "online_after_task"):
            setattr(trainer, name, getattr(self, name))

    def _own(self, name: str) -> Callable[..., Any]:
        return getattr(type(self.trainer), name).__get__(self.trainer)

    def setup_distributed_dataset(self) -> None:
        self._own("setup_distributed_dataset")()
        self.trainer.train_transform = self.trainer.test_transform_tensor = _identity
        self.trainer.__dict__.update(self.setup.attributes)
        self.trainer.kwargs.update(self.setup.model_kwargs)
        sampler, order = self.trainer.train_sampler, self.setup.order
        self.run.sampler_orders = [[int(i) for i in indices] for indices in sampler.indices]
        if order is not None and order != self.run.sampler_orders:
            sampler.indices, self.run.fed = [list(indices) for indices in order], True

    def setup_distributed_model(self) -> None:
        self._own("setup_distributed_model")()
        self.prepare(self.trainer.model_without_ddp)

    def online_step(self, images: Tensor, labels: Tensor, idx: Tensor) -> Any:
        self.run.batches.append([int(i) for i in idx])
        self.samples_seen += int(images.shape[0])
        return self._own("online_step")(images, labels, idx)

    def online_after_task(self, task_id: int) -> Any:
        if self.setup.session_end_seed is not None:
            torch.manual_seed(self.setup.session_end_seed + task_id)
        return self._own("online_after_task")(task_id)

    def online_evaluate(self, test_loader: Any, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        result = self._own("online_evaluate")(test_loader, *args, **kwargs)
        kind = "session_end" if kwargs.get("end", False) else "anytime"
        evaluation = LoopEvaluation(kind, self.samples_seen, len(test_loader.sampler), float(result["avg_acc"]))
        self.run.evaluations.append(evaluation)
        return result


class _LogLines(logging.Handler):
    """The messages of the root logger (the official code's ``logging.getLogger()``) while attached."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def summary(self) -> Dict[str, float]:
        """The metrics of the summary lines (``A_auc ... | F_last ...`` and ``BWT_last ...``)."""
        found: Dict[str, float] = {}
        for line in self.lines:
            if match := _SUMMARY.fullmatch(line.strip()):
                found.update(zip(("A_auc", "A_avg", "A_last", "F_last"), map(float, match.groups())))
            elif match := _BWT.fullmatch(line.strip()):
                found["BWT_last"] = float(match.group(1))
        if len(found) != 5:
            raise ValueError(f"the official run logged no summary (found {sorted(found)}); expected main_worker's "
                             "'A_auc ... | F_last ...' and 'BWT_last ...' lines at its end")
        return found


@contextlib.contextmanager
def _captured_log() -> Iterator[_LogLines]:
    root, handler = logging.getLogger(), _LogLines()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@contextlib.contextmanager
def _replaced(namespace: Dict[str, Any], values: Mapping[str, Any]) -> Iterator[None]:
    """``namespace`` (a module's globals, ``sys.modules``) with ``values`` set, restored afterwards."""
    missing = object()
    saved = {name: namespace.get(name, missing) for name in values}
    namespace.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = value


def _module_from_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ref.CheckoutError("--flygcl", path.parent.parent, ref.FLYGCL, f"missing {path.parent.name}/{path.name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _registry(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name, "the registry the official parser reads its choices from")
    module.__dict__.update(attributes)
    return module


def _parse(checkout: ref.Checkout, method: str, trainer: type, argv: Sequence[str]) -> argparse.Namespace:
    """The checkout's ``base_parser()`` on ``argv``; its imports of the data sets and trainers
    registries get ours (our data set, the loaded trainer), not the packages (which import everything)."""
    registries = {"datasets": _registry("datasets", DATASETS={DATASET: None}),
                  "methods": _registry("methods", METHODS={method: trainer})}
    with _replaced(sys.modules, registries):
        config = _module_from_file("fidelity_flygcl_config", checkout.path / "configuration" / "config.py")
    with _replaced(vars(sys), {"argv": ["main.py", *argv]}):
        return config.base_parser()


@contextlib.contextmanager
def _cudnn_kept() -> Iterator[None]:
    """``main_worker`` sets cuDNN's global flags; they are this process's again afterwards."""
    flags = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags


def run_official_loop(
    checkout: ref.Checkout, method: str, setting: Setting, *, train: Any, test: Any, backbone: nn.Module, lr: float,
    prepare: Callable[[nn.Module], None], setup: LoopSetup = LoopSetup(),
) -> OfficialRun:
    """``main.py``'s run of ``method`` (a key of ``reference_checkout.CLASSES``) on ``setting`` (see the
    module docstring), with ``setup``'s additions."""
    official_method = _METHOD_FLAGS.get(method, method)
    data = _DataSets(train, test)
    online_iter_dataset = _module_from_file(
        "fidelity_flygcl_online_iter_dataset", checkout.path / "datasets" / "OnlineIterDataset.py"
    ).OnlineIterDataset
    substitutes = {"DATASETS": {DATASET: data}, "get_statistics": data.statistics,
                   "OnlineIterDataset": online_iter_dataset}
    with tempfile.TemporaryDirectory(prefix="fidelity-loop-") as logs:
        argv = [*official_arguments(setting, official_method, lr, logs), *setup.flags]
        args = _parse(checkout, official_method, checkout.trainers[method], argv)
        args.rnd_seed = args.seeds[0]  # main.py's loop over --seeds, for the one seed
        trainer = checkout.trainers[method](**vars(args))
        trainer.world_size, trainer.ngpus_per_nodes = 1, _CpuNode()
        watcher = _Watcher(trainer, prepare, setup)
        factory = CopiedBackbone(checkout, setting, backbone)
        with _replaced(checkout.base_trainer.main_worker.__globals__, substitutes), _cudnn_kept(), \
                ref.backbone_factory(checkout, BACKBONE_NAME, factory), vit_importable(checkout), _captured_log() as log:
            trainer.run()
        run = watcher.run
        run.summary, run.model = log.summary(), trainer.model_without_ddp
        saved = Path(trainer.log_dir)
        run.session_accuracies = np.load(saved / f"seed_{args.rnd_seed}.npy", allow_pickle=False).tolist()
        run.anytime_accuracies = np.load(saved / f"seed_{args.rnd_seed}_eval.npy", allow_pickle=False).tolist()
        run.anytime_marks = [int(mark) for mark in np.load(saved / f"seed_{args.rnd_seed}_eval_time.npy",
                                                           allow_pickle=False)]
    return run
