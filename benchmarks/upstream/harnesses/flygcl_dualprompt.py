"""FlyGCL DualPrompt under ``retrofit(method="dualprompt")``.

Real classes: ``models.dualprompt.DualPrompt`` (model) and ``methods.dualprompt.DualPrompt`` (trainer:
``online_step`` -> ``online_train`` per batch, ``online_evaluate`` at evaluation). FlyGCL's own step
advance (``model.process_task_count()`` from inside ``online_step`` once a step's sample budget is
seen) runs in the reference run, with one task's samples per step.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _flygcl, _online_trainer
from benchmarks.upstream.observe import PromptFuncCapture, match_rows
from benchmarks.upstream.pair import Pair, active_handle
from benchmarks.upstream.stream import BATCH_SIZE, BATCHES_PER_TASK, CLASSES_PER_TASK, NUM_TASKS

NUM_CLASSES, TASK_SAMPLES = NUM_TASKS * CLASSES_PER_TASK, BATCHES_PER_TASK * BATCH_SIZE


class FlyGCLDualPrompt(Pair):
    name = "FlyGCL / DualPrompt"
    method = "dualprompt"
    schedule = "samples"
    counter_name = "model.task_count"

    def __init__(self, checkout: Path) -> None:
        self.stubs = _flygcl.import_flygcl(checkout, ["models.dualprompt", "methods.dualprompt"])
        import methods.dualprompt as trainers
        import models.dualprompt as models
        from utils.train_utils import select_optimizer, select_scheduler

        self.trainers, self.models = trainers, models
        self.select_optimizer, self.select_scheduler = select_optimizer, select_scheduler

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model="models.dualprompt.DualPrompt(task_num=2, num_classes=4): e_pool 10, 5 slots per step")

    def build(self, seed):
        torch.manual_seed(seed)
        model = self.models.DualPrompt(backbone_name=_flygcl.BACKBONE, task_num=NUM_TASKS, num_classes=NUM_CLASSES)
        optimizer = self.select_optimizer("adam", 5e-3, model)
        scheduler = self.select_scheduler("default", optimizer, 0.9999)
        trainer = _online_trainer.make_trainer(
            self.trainers.DualPrompt, model, optimizer, scheduler, n_classes=NUM_CLASSES, no_batchmask=False,
            task_id=0, step_num=NUM_TASKS, samples_per_step=TASK_SAMPLES, current_step=0, current_step_seen_samples=0)
        losses = _online_trainer.record_losses(trainer)
        return SimpleNamespace(model=model, optimizer=optimizer, trainer=trainer, losses=losses)

    def start_task(self, ctx, task, own_advance):
        ctx.trainer.step_num = NUM_TASKS if own_advance else None  # no own advance when the schedule drives
        ctx.trainer.online_before_task(task)

    def train_batch(self, ctx, x, y, task):
        return _online_trainer.train_batch(ctx, x, y)

    def eval_logits(self, ctx, x, y):
        handle = active_handle(ctx)
        if handle is not None:
            handle.set_logit_mask(ctx.trainer.mask.clone())
        ctx.model.eval()
        with PromptFuncCapture(ctx.model) as capture:
            logits = _online_trainer.evaluate(ctx.trainer, ctx.model, x, y)
        return logits, match_rows(capture.seen[-1][:, 0], ctx.model.e_prompt.prompts)

    def counter(self, ctx):
        return int(ctx.model.task_count)

    def slot_usage(self, ctx):
        return ctx.model.e_prompt.counter.detach().clone()

    def expert_slots(self, ctx, expert):
        size = ctx.model.num_pt_per_task
        return list(range(expert * size, (expert + 1) * size))


def run(checkout: Path, settings: Settings):
    return run_checks(FlyGCLDualPrompt(checkout), settings)
