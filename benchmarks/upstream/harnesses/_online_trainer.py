"""The online trainers of FlyGCL, Si-Blurry and MISA (``methods/_trainer.py`` and its subclasses).

Their trainers are built in ``main_worker`` from dataset files, log folders and GPUs. Here a trainer
object is created without ``__init__`` and given the attributes its per-batch methods read (model,
optimizer, scheduler, masks, transforms off so two runs compare bitwise); every training and
evaluation step then goes through the repository's own ``online_step`` / ``online_train`` /
``online_evaluate``.
"""

from __future__ import annotations

from typing import Any, List

import torch

from benchmarks.upstream.observe import capture_outputs


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


def train_batch(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> List[float]:
    """The trainer's own ``online_step`` on one stream batch; the losses of its online iterations."""
    start = len(ctx.losses)
    ctx.trainer.online_step(x, y, None)
    return ctx.losses[start:]


def evaluate(trainer: Any, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The trainer's own ``online_evaluate`` on one batch; the model output it computed."""
    with capture_outputs(model) as outputs:
        trainer.online_evaluate([(x, y)])
    return outputs[-1].detach()
