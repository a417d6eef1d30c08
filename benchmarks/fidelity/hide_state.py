"""HiDe-Prompt's and NoRGa's official trainer, set up as a run of the launch scripts sets it up, and its
inference (task from the gate branch, then the prompt branch with that task's prefixes)."""

from __future__ import annotations

from typing import Any, Tuple

import torch
from torch import Tensor

__all__ = ["official_predict", "setup_trainer", "setup_trainer_without_orthogonality"]


def setup_trainer(trainer: Any) -> None:
    """What ``_Trainer.__init__`` and ``setup_distributed_dataset`` would give it: the configuration's
    defaults (``--lam_orth 1 --ca_num_per_class 200 --ca_steps 200``), the classifier alignment's batch of
    64 (the launch scripts' batch size; ours keeps 64 whatever the stream's), and an empty first-session
    table."""
    trainer.__dict__.update(
        lam_orth=1.0, ca_num_per_class=200, ca_steps=200, batchsize=64,
        class_to_first_task=[-1] * trainer.n_classes,
    )


def setup_trainer_without_orthogonality(trainer: Any) -> None:
    """:func:`setup_trainer` with ``--lam_orth 0``."""
    setup_trainer(trainer)
    trainer.lam_orth = 0.0


@torch.no_grad()
def official_predict(trainer: Any, images: Tensor) -> Tuple[Tensor, Tensor]:
    """``online_evaluate``'s decision for one batch, from the trainer's and model's own calls."""
    trainer.model_without_ddp.eval()
    tasks = trainer._predict_task_from_gate(images)
    logits, _ = trainer.model_without_ddp.forward_prompt(images, task_id=tasks)
    return logits + trainer.mask, tasks
