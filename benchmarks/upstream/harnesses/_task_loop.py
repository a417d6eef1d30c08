"""The task-based codebases (JH-LEE l2p-pytorch / dualprompt-pytorch, HiDe-Prompt, NoRGa).

Their per-batch training lives in ``engine.train_one_epoch(model, original_model, criterion, data_loader,
optimizer, device, epoch, max_norm, set_training_mode, task_id, class_mask, ..., args)``. The harnesses
call that function with a loader of ONE stream batch, so every batch runs the repository's own body
(which does not depend on the batch's position, only its printing does), and the README loop's
``end_batch()`` follows each call. Evaluation is their ``engine.evaluate`` on one batch. The optimizer
is timm's ``create_optimizer(args, ...)`` as their ``main.py`` makes it, made again at each task start
(their default ``reinit_optimizer``). ``TaskLoopPair`` drives those calls; a harness declares the
checkout's ViT and engine modules, the prompt options and run arguments.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List

import torch

from benchmarks.upstream.harnesses._flygcl import TINY_VIT
from benchmarks.upstream.loading import import_upstream
from benchmarks.upstream.observe import capture_outputs
from benchmarks.upstream.pair import Pair
from benchmarks.upstream.task_stream import CLASSES_PER_TASK, NUM_TASKS

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


class TaskLoopPair(Pair):
    """A prompted ``VisionTransformer`` and a prompt-free ``original_model`` trained by the checkout's
    ``engine.train_one_epoch``, one stream batch per call.

    Declared by a harness: ``pool`` and ``top_k`` (an expert is ``top_k`` consecutive slots),
    ``prompt`` (the prompted model's keywords), ``original_options`` (the prompt-free one's),
    ``run_args`` (overrides of ``base_args``); ``train_options`` / ``evaluate_options`` add keywords to the
    engine's calls.
    """

    schedule = "session"
    pool, top_k = 10, 1
    prompt: Dict[str, Any] = {}
    original_options: Dict[str, Any] = {}
    run_args: Dict[str, Any] = {}

    def __init__(self, checkout: Path, vit_module: str = "vision_transformer", engine_module: str = "engine") -> None:
        self.stubs = import_upstream(checkout, [vit_module, engine_module])
        from timm.optim import create_optimizer

        self.vit = importlib.import_module(vit_module).VisionTransformer
        self.engine = importlib.import_module(engine_module)
        self.create_optimizer = create_optimizer

    def optimizer_for(self, args: SimpleNamespace, model: torch.nn.Module) -> Any:
        return self.create_optimizer(args, model)

    def build(self, seed):
        torch.manual_seed(seed)
        original_model = self.vit(**TINY, **self.original_options)
        model = self.vit(**TINY, **self.prompt)
        freeze(model, original_model)
        args = base_args(**self.run_args)
        return SimpleNamespace(model=model, original_model=original_model, optimizer=self.optimizer_for(args, model),
                               args=args, task_id=0, usage=torch.zeros(self.pool))

    def family_options(self, ctx):
        return dict(num_experts=2)

    def start_task(self, ctx, task, own_advance):
        ctx.task_id = task
        if task > 0 and ctx.args.reinit_optimizer:
            ctx.optimizer = self.optimizer_for(ctx.args, ctx.model)

    def train_options(self, ctx: SimpleNamespace) -> Dict[str, Any]:
        return {}

    def evaluate_options(self, ctx: SimpleNamespace) -> Dict[str, Any]:
        return {}

    def train_batch(self, ctx, x, y, task):
        with capture_outputs(ctx.model) as outputs:
            stats = self.engine.train_one_epoch(
                model=ctx.model, original_model=ctx.original_model, criterion=torch.nn.CrossEntropyLoss(),
                data_loader=[(x, y)], optimizer=ctx.optimizer, device=torch.device("cpu"), epoch=0,
                max_norm=ctx.args.clip_grad, set_training_mode=True, task_id=ctx.task_id,
                class_mask=class_mask(), args=ctx.args, **self.train_options(ctx))
        prompt_usage(ctx, outputs, self.pool)
        return [stats["Loss"]]

    def eval_logits(self, ctx, x, y):
        with capture_outputs(ctx.model) as outputs:
            self.engine.evaluate(model=ctx.model, original_model=ctx.original_model, data_loader=[(x, y)],
                                 device=torch.device("cpu"), task_id=ctx.task_id, class_mask=class_mask(),
                                 args=ctx.args, **self.evaluate_options(ctx))
        return outputs[-1]["logits"].detach(), outputs[-1]["prompt_idx"][:, 0].detach()

    def verify_forward(self, ctx, handle):
        return lambda x: ctx.model(x, task_id=handle.current_expert,
                                   cls_features=ctx.original_model(x)["pre_logits"], train=ctx.model.training)

    def slot_usage(self, ctx):
        return ctx.usage.clone()

    def expert_slots(self, ctx, expert):
        return list(range(expert * self.top_k, (expert + 1) * self.top_k))
