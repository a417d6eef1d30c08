"""FlyGCL MVP under ``retrofit(method="mvp")``.

Real classes: ``models.mvp.MVP`` (model) and ``methods.mvp.MVP`` (trainer: ``online_step`` ->
``online_train`` with its per-sample gradient scores, ``online_evaluate``), with the values
``MVP.__init__`` sets (use_afs / use_mcr / use_mask on, alpha 0.5, gamma 2.0, margin 0.5).
(f) is N/A: MVP's training picks prompts by a count-scaled key match; ``model.task_count`` is read
only by the optional RPFC gate at evaluation.
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


class FlyGCLMVP(Pair):
    name = "FlyGCL / MVP"
    method = "mvp"
    schedule = "samples"
    counter_name = None
    counter_na = ("MVP trains the prompt its count-scaled key match picks; model.task_count is moved by "
                  "process_task_count() but read only by the RPFC gate at evaluation")

    def __init__(self, checkout: Path) -> None:
        self.stubs = _flygcl.import_flygcl(checkout, ["models.mvp", "methods.mvp"])
        import methods.mvp as trainers
        import models.mvp as models
        from utils.train_utils import select_optimizer, select_scheduler

        self.trainers, self.models = trainers, models
        self.select_optimizer, self.select_scheduler = select_optimizer, select_scheduler

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model="models.mvp.MVP(task_num=2, num_classes=4): e_pool = task_num = 2, learnable key and mask")

    def build(self, seed):
        torch.manual_seed(seed)
        model = self.models.MVP(backbone_name=_flygcl.BACKBONE, task_num=NUM_TASKS, num_classes=NUM_CLASSES)
        optimizer = self.select_optimizer("adam", 5e-3, model)
        scheduler = self.select_scheduler("default", optimizer, 0.9999)
        trainer = _online_trainer.make_trainer(
            self.trainers.MVP, model, optimizer, scheduler, n_classes=NUM_CLASSES, no_batchmask=False, task_id=0,
            step_num=NUM_TASKS, samples_per_step=TASK_SAMPLES, current_step=0, current_step_seen_samples=0,
            use_afs=True, use_mcr=True, use_mask=True, alpha=0.5, gamma=2.0, margin=0.5)
        losses = _online_trainer.record_losses(trainer)
        return SimpleNamespace(model=model, optimizer=optimizer, trainer=trainer, losses=losses)

    def start_task(self, ctx, task, own_advance):
        ctx.trainer.step_num = NUM_TASKS if own_advance else None
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
        return logits, match_rows(capture.seen[-1], ctx.model.e_prompts)

    def sync_counter(self, ctx):
        return int(ctx.model.task_count)  # FlyGCL advances it inside online_step; the handle follows

    def slot_usage(self, ctx):
        return ctx.model.count.detach().clone()

    def expert_slots(self, ctx, expert):
        return [expert]


def run(checkout: Path, settings: Settings):
    return run_checks(FlyGCLMVP(checkout), settings)
