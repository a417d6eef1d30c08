"""The task-based codebases (JH-LEE l2p-pytorch / dualprompt-pytorch, HiDe-Prompt, NoRGa).

Their per-batch training lives in ``engine.train_one_epoch(model, original_model, criterion, data_loader,
optimizer, device, epoch, max_norm, set_training_mode, task_id, class_mask, ..., args)``. The harnesses
call that function with a loader of ONE stream batch, so every batch runs the repository's own body
(which does not depend on the batch's position, only its printing does), and the README loop's
``end_batch()`` follows each call. Evaluation is their ``engine.evaluate`` on one batch. The optimizer
is timm's ``create_optimizer(args, ...)`` as their ``main.py`` makes it, made again at each task start
(their default ``reinit_optimizer``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List

import torch

from benchmarks.upstream.harnesses._flygcl import TINY_VIT
from benchmarks.upstream.stream import CLASSES_PER_TASK, NUM_TASKS

TINY = dict(TINY_VIT, num_classes=NUM_TASKS * CLASSES_PER_TASK)
FROZEN = ("blocks", "patch_embed", "cls_token", "norm", "pos_embed")  # their --freeze default


def base_args(**overrides: Any) -> SimpleNamespace:
    """The run arguments train_one_epoch / evaluate / create_optimizer read (their configs' defaults)."""
    args = SimpleNamespace(
        distributed=False, epochs=1, print_freq=10, train_mask=True, task_inc=False,
        nb_classes=NUM_TASKS * CLASSES_PER_TASK, num_tasks=NUM_TASKS, pull_constraint=True,
        pull_constraint_coeff=0.1, clip_grad=1.0, opt="adam", opt_eps=1e-8, opt_betas=(0.9, 0.999), momentum=0.9,
        weight_decay=0.0, lr=0.03 * 8 / 256.0, reinit_optimizer=True, sched="constant", layer_decay=None,
        opt_args=None)
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def freeze(model: torch.nn.Module, original_model: torch.nn.Module, prefixes=FROZEN) -> None:
    """As their main.py: all of original_model frozen, and the model's parameters under ``prefixes``."""
    for parameter in original_model.parameters():
        parameter.requires_grad = False
    for name, parameter in model.named_parameters():
        if name.startswith(tuple(prefixes)):
            parameter.requires_grad = False


def prompt_usage(ctx: SimpleNamespace, outputs: List[Any], pool: int) -> None:
    """Add the prompt slots the training forwards used (their output's ``prompt_idx``) to ``ctx.usage``."""
    for output in outputs:
        index = output.get("prompt_idx") if isinstance(output, dict) else None
        if index is not None:
            ctx.usage += torch.bincount(index.reshape(-1).cpu(), minlength=pool).float()


def class_mask() -> List[List[int]]:
    return [list(range(t * CLASSES_PER_TASK, (t + 1) * CLASSES_PER_TASK)) for t in range(NUM_TASKS)]


def target_task_map() -> Dict[int, int]:
    return {c: t for t, classes in enumerate(class_mask()) for c in classes}
