"""MISA (its DualPrompt-based model) under ``retrofit(method="misa")``.

Real classes: ``models.dualprompt.DualPrompt`` as MISA's ``select_model`` builds it (task_num 10, pool
10, one slot per task) and ``methods.dualprompt.DualPrompt`` (trainer: its own ``online_step`` per
batch, its ``online_after_task`` at each task end -- MISA's own step advance, ``model.task_id += 1``
-- and ``online_evaluate``, which adds no seen-class mask). Flags as MISA's scripts without prompt
files: load_pt, learnable_mask, imbalance, isa, e_proj, g_proj off; replay memory empty.
The adapter refuses ``router=True``: the pool's ``forward(query, s, e)`` matches keys in ``[s, e)`` but
gathers prompts with slice-local indices, so routing through ``s, e`` cannot change the prompt. Which
slot a step trains shows in the key gradient (the only per-step part), recorded after each batch.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _misa, _online_trainer
from benchmarks.upstream.observe import PromptFuncCapture, match_rows
from benchmarks.upstream.pair import Pair
from benchmarks.upstream.stream import CLASSES_PER_TASK, NUM_TASKS

NUM_CLASSES = NUM_TASKS * CLASSES_PER_TASK
MODEL_OPTIONS = dict(load_pt=False, learnable_mask=False, imbalance=False, memory_size=0, isa=False, e_proj=False,
                     g_proj=False)


class MISADualPrompt(Pair):
    name = "MISA / MISA (DualPrompt-based)"
    method = "misa"
    schedule = "samples"
    counter_name = "model.task_id"

    def __init__(self, checkout: Path) -> None:
        self.stubs = _misa.import_misa(checkout, ["models.dualprompt", "methods.dualprompt"])
        import methods.dualprompt as trainers
        import models.dualprompt as models
        from utils.train_utils import select_optimizer, select_scheduler

        self.trainers, self.models = trainers, models
        self.select_optimizer, self.select_scheduler = select_optimizer, select_scheduler

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model="models.dualprompt.DualPrompt(class_num=4): task_num 10, e_pool 10, 1 slot per task")

    def build(self, seed):
        torch.manual_seed(seed)
        model = self.models.DualPrompt(backbone_name=_misa.BACKBONE, class_num=NUM_CLASSES, **MODEL_OPTIONS)
        optimizer = self.select_optimizer("adam", 5e-3, model)
        scheduler = self.select_scheduler("default", optimizer)
        trainer = _online_trainer.make_trainer(
            self.trainers.DualPrompt, model, optimizer, scheduler, n_classes=NUM_CLASSES, nobatchmask=False,
            sessionmask=False, task_id=0, dataset="cifar100", n_tasks=NUM_TASKS, **_online_trainer.replay_settings())
        losses = _online_trainer.record_losses(trainer)
        return SimpleNamespace(model=model, optimizer=optimizer, trainer=trainer, losses=losses,
                               key_usage=torch.zeros(model.e_pool))

    def start_task(self, ctx, task, own_advance):
        if task > 0 and own_advance:
            ctx.trainer.online_after_task(task - 1)
        ctx.trainer.online_before_task(task)

    def train_batch(self, ctx, x, y, task):
        losses = _online_trainer.train_batch(ctx, x, y)
        grad = ctx.model.e_prompt.key.grad
        if grad is not None:
            ctx.key_usage += (grad.abs().sum(1) > 0).float()
        return losses

    def eval_logits(self, ctx, x, y):
        ctx.model.eval()
        with PromptFuncCapture(ctx.model) as capture:
            logits = _online_trainer.evaluate(ctx.trainer, ctx.model, x, y)
        return logits, match_rows(capture.seen[-1][:, 0], ctx.model.e_prompt.prompts)

    def counter(self, ctx):
        return int(ctx.model.task_id)

    def slot_usage(self, ctx):
        return ctx.key_usage.clone()

    def expert_slots(self, ctx, expert):
        size = ctx.model.num_pt_per_task
        return list(range(expert * size, (expert + 1) * size))


def run(checkout: Path, settings: Settings):
    return run_checks(MISADualPrompt(checkout), settings)
