"""Si-Blurry DualPrompt under ``retrofit(method="dualprompt")``.

Real classes: ``models.dualprompt.DualPrompt`` (one E-prompt slot per task) trained by the ER trainer
``methods.er_baseline.ER`` (Si-Blurry runs DualPrompt with ``--mode er``): its own ``online_step`` per
batch, ``online_evaluate`` at evaluation; the replay memory stays empty. The adapter refuses
``router=True`` (the pool's ``forward`` takes no slot range), so the checks run with the ensemble alone.
Import fixes: ``_siblurry.py``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _online_trainer, _siblurry
from benchmarks.upstream.observe import PromptFuncCapture, match_rows
from benchmarks.upstream.pair import Pair, active_handle
from benchmarks.upstream.stream import CLASSES_PER_TASK, NUM_TASKS

NUM_CLASSES = NUM_TASKS * CLASSES_PER_TASK


class SiBlurryDualPrompt(Pair):
    name = "Si-Blurry / DualPrompt"
    method = "dualprompt"
    schedule = "samples"
    counter_name = None
    counter_na = ("Si-Blurry's DualPrompt trains whichever slot its key match picks over the whole pool; "
                  "model.task_id is read by no forward")

    def __init__(self, checkout: Path) -> None:
        self.stubs = _siblurry.import_siblurry(checkout, ["models.dualprompt", "methods.er_baseline"])
        import methods.er_baseline as trainers
        import models.dualprompt as models
        from utils.train_utils import select_optimizer, select_scheduler

        self.trainers, self.models = trainers, models
        self.select_optimizer, self.select_scheduler = select_optimizer, select_scheduler

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model="models.dualprompt.DualPrompt(task_num=2, num_classes=4): e_pool = task_num = 2")

    def build(self, seed):
        torch.manual_seed(seed)
        model = self.models.DualPrompt(backbone_name=_siblurry.BACKBONE, task_num=NUM_TASKS, num_classes=NUM_CLASSES)
        optimizer = self.select_optimizer("adam", 5e-3, model)
        scheduler = self.select_scheduler("default", optimizer, 0.9999)
        trainer = _online_trainer.make_trainer(self.trainers.ER, model, optimizer, scheduler, n_classes=NUM_CLASSES,
                                               cutmix=False, **_online_trainer.replay_settings())
        losses = _online_trainer.record_losses(trainer)
        return SimpleNamespace(model=model, optimizer=optimizer, trainer=trainer, losses=losses)

    def start_task(self, ctx, task, own_advance):
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

    def slot_usage(self, ctx):
        return ctx.model.e_prompt.counter.detach().clone()

    def expert_slots(self, ctx, expert):
        return [expert]


def run(checkout: Path, settings: Settings):
    return run_checks(SiBlurryDualPrompt(checkout), settings)
