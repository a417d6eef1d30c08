"""The online trainers of FlyGCL, Si-Blurry and MISA (``methods/_trainer.py`` and its subclasses), and
the Pair that drives them.

Their trainers are built in ``main_worker`` from dataset files, log folders and GPUs. Here a trainer
object is created without ``__init__`` and given the attributes its per-batch methods read (model,
optimizer, scheduler, masks, transforms off so two runs compare bitwise); every training and
evaluation step then goes through the repository's own ``online_step`` / ``online_train`` /
``online_evaluate``. A harness declares the checkout's import, the model and trainer classes and their
options; ``OnlineTrainerPair`` builds them the same way for every repository.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence

import torch

from benchmarks.upstream.observe import PromptFuncCapture, capture_outputs
from benchmarks.upstream.pair import Pair, active_handle
from benchmarks.upstream.task_stream import CLASSES_PER_TASK, NUM_TASKS

NUM_CLASSES = NUM_TASKS * CLASSES_PER_TASK


def make_trainer(cls: type, model: torch.nn.Module, optimizer: Any, scheduler: Any, *, n_classes: int,
                 online_iter: int = 2, **extra: Any) -> Any:
    trainer = object.__new__(cls)
    trainer.model = model
    trainer.model_without_ddp = model
    trainer.criterion = model.loss_fn if hasattr(model, "loss_fn") else torch.nn.CrossEntropyLoss(reduction="mean")
    trainer.optimizer = optimizer
    trainer.scheduler = scheduler
    trainer.scaler = torch.cuda.amp.GradScaler(enabled=False)
    trainer.use_amp = False
    trainer.device = torch.device("cpu")
    trainer.n_classes = n_classes
    trainer.exposed_classes = []
    trainer.mask = torch.zeros(n_classes) - torch.inf
    trainer.train_transform = lambda x: x  # augmentation off: the checks compare two runs bitwise
    trainer.test_transform = lambda x: x
    trainer.test_transform_tensor = lambda x: x
    trainer.online_iter = online_iter
    trainer.topk = 1
    trainer.sched_name = "default"
    trainer.distributed = False
    trainer.world_size = 1
    trainer.lr = extra.pop("lr", 5e-3)
    trainer.lr_gamma = 0.9999
    for key, value in extra.items():
        setattr(trainer, key, value)
    return trainer


def replay_settings(**extra: Any) -> dict:
    """An empty replay memory: the trainers' replay branches are never taken (memory_size 0)."""
    from utils.memory import Memory  # the checkout's own module

    return dict(memory=Memory(), memory_size=0, memory_batchsize=0, train_dataset=None, temp_batchsize=8, seen=0,
                **extra)


def record_losses(trainer: Any) -> List[float]:
    """Wrap the trainer's own ``online_train`` (an instance attribute) to keep every iteration's loss."""
    losses: List[float] = []
    original = trainer.online_train

    def online_train(data):
        loss, acc = original(data)
        losses.append(float(loss))
        return loss, acc

    trainer.online_train = online_train
    return losses


class OnlineTrainerPair(Pair):
    """A model of ``models.<module>`` trained by a trainer of ``methods.<module>``, one ``online_step`` a batch.

    Declared by a harness: ``import_checkout(checkout, modules)`` (a staticmethod: the repository's import,
    returning the stand-ins made), ``modules`` it imports, ``backbone``, ``model_class`` / ``trainer_class`` (module
    path and class name), ``model_options`` (constructor keywords besides the backbone),
    ``model_flags`` (attributes set on the built model), ``scheduler_gamma`` (None: the repository's
    scheduler call passes none) and ``trainer_options`` (attributes of the trainer).
    """

    schedule = "samples"
    import_checkout: Callable[[Path, Sequence[str]], List[str]]
    modules: Sequence[str] = ()
    backbone = ""
    model_class = ""
    trainer_class = ""
    model_options: Dict[str, Any] = {}
    model_flags: Dict[str, Any] = {}
    model_description = ""
    scheduler_gamma: Optional[float] = 0.9999
    masks_logits = True  # the evaluation's seen-class mask is the handle's logit mask

    def __init__(self, checkout: Path) -> None:
        self.stubs = self.import_checkout(checkout, self.modules)
        from utils.train_utils import select_optimizer, select_scheduler

        self.model_cls = _resolve(self.model_class)
        self.trainer_cls = _resolve(self.trainer_class)
        self.select_optimizer, self.select_scheduler = select_optimizer, select_scheduler

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none", model=self.model_description)

    def trainer_options(self) -> Dict[str, Any]:
        return {}

    def build(self, seed):
        torch.manual_seed(seed)
        model = self.model_cls(backbone_name=self.backbone, **self.model_options)
        for key, value in self.model_flags.items():
            setattr(model, key, value)
        optimizer = self.select_optimizer("adam", 5e-3, model)
        gamma = () if self.scheduler_gamma is None else (self.scheduler_gamma,)
        scheduler = self.select_scheduler("default", optimizer, *gamma)
        trainer = make_trainer(self.trainer_cls, model, optimizer, scheduler, n_classes=NUM_CLASSES,
                               **self.trainer_options())
        return SimpleNamespace(model=model, optimizer=optimizer, trainer=trainer, losses=record_losses(trainer))

    def start_task(self, ctx, task, own_advance):
        ctx.trainer.online_before_task(task)

    def train_batch(self, ctx, x, y, task):
        """The trainer's own ``online_step`` on the batch; the losses of its online iterations."""
        start = len(ctx.losses)
        ctx.trainer.online_step(x, y, None)
        return ctx.losses[start:]

    def selection_capture(self, ctx) -> ContextManager:
        """Records what the evaluation forward selected; ``used_rows`` reads it."""
        return PromptFuncCapture(ctx.model)

    def used_rows(self, ctx, capture) -> torch.Tensor:
        """The pool row each sample used, from what ``selection_capture`` recorded."""
        raise NotImplementedError

    def eval_logits(self, ctx, x, y):
        handle = active_handle(ctx)
        if self.masks_logits and handle is not None:
            handle.set_logit_mask(ctx.trainer.mask.clone())
        ctx.model.eval()
        with self.selection_capture(ctx) as capture, capture_outputs(ctx.model) as outputs:
            ctx.trainer.online_evaluate([(x, y)])
        return outputs[-1].detach(), self.used_rows(ctx, capture)

    def slots_per_expert(self, ctx) -> int:
        return 1

    def expert_slots(self, ctx, expert):
        size = self.slots_per_expert(ctx)
        return list(range(expert * size, (expert + 1) * size))


def _resolve(qualified: str) -> type:
    module, _, name = qualified.rpartition(".")
    return getattr(importlib.import_module(module), name)
