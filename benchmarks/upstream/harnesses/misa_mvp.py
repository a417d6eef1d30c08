"""MISA's MVP under ``retrofit(method="mvp")``.

Real classes: ``models.mvp.MVP`` as MISA's ``select_model`` builds it (class_num and selection_size
only: task_num = pool = 10) and ``methods.mvp.MVP`` (trainer: its own ``online_step`` per batch,
``online_evaluate``; replay memory empty). Flags as MISA's MVP script: use_mask, use_contrastiv,
use_afs, use_mcr on, use_last_layer off, gamma 2.0, alpha / margin 0.5 (the trainer copies the
``use_*`` flags onto the model in its setup; the harness sets them on both). Import fixes: ``_misa.py``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _misa, _online_trainer
from benchmarks.upstream.observe import PromptFuncCapture, match_rows
from benchmarks.upstream.pair import Pair, active_handle
from benchmarks.upstream.stream import CLASSES_PER_TASK, NUM_TASKS

NUM_CLASSES = NUM_TASKS * CLASSES_PER_TASK
FLAGS = dict(use_mask=True, use_contrastiv=True, use_last_layer=False)


class MISAMVP(Pair):
    name = "MISA / MVP"
    method = "mvp"
    schedule = "samples"
    counter_name = None
    counter_na = "MVP trains the prompt its count-scaled key match picks; MISA's MVP keeps no step counter"

    def __init__(self, checkout: Path) -> None:
        self.stubs = _misa.import_misa(checkout, ["methods.mvp"])
        import methods.mvp as trainers
        import models.mvp as models
        from utils.train_utils import select_optimizer, select_scheduler

        self.trainers, self.models = trainers, models
        self.select_optimizer, self.select_scheduler = select_optimizer, select_scheduler

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"models.mvp.MVP(class_num=4, selection_size=1) {FLAGS}: task_num = e_pool = 10")

    def build(self, seed):
        torch.manual_seed(seed)
        model = self.models.MVP(backbone_name=_misa.BACKBONE, class_num=NUM_CLASSES, selection_size=1)
        for key, value in FLAGS.items():
            setattr(model, key, value)
        optimizer = self.select_optimizer("adam", 5e-3, model)
        scheduler = self.select_scheduler("default", optimizer)
        trainer = _online_trainer.make_trainer(
            self.trainers.MVP, model, optimizer, scheduler, n_classes=NUM_CLASSES, labels=torch.empty(0),
            mask_viz=torch.empty(0), mask_store=None, use_afs=True, use_mcr=True, alpha=0.5, gamma=2.0, margin=0.5,
            **FLAGS, **_online_trainer.replay_settings())
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
        return logits, match_rows(capture.seen[-1], ctx.model.e_prompts)

    def slot_usage(self, ctx):
        return ctx.model.count.detach().clone()

    def expert_slots(self, ctx, expert):
        return [expert]


def run(checkout: Path, settings: Settings):
    return run_checks(MISAMVP(checkout), settings)
