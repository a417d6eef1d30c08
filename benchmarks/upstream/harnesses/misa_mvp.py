"""MISA's MVP under ``retrofit(method="mvp")``.

Real classes: ``models.mvp.MVP`` as MISA's ``select_model`` builds it (class_num and selection_size
only: task_num = pool = 10) and ``methods.mvp.MVP`` (trainer: its own ``online_step`` per batch,
``online_evaluate``; replay memory empty). Flags as MISA's MVP script: use_mask, use_contrastiv,
use_afs, use_mcr on, use_last_layer off, gamma 2.0, alpha / margin 0.5 (the trainer copies the
``use_*`` flags onto the model in its setup; the harness sets them on both). Import fixes: ``_misa.py``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _misa
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES, OnlineTrainerPair, replay_settings
from benchmarks.upstream.observe import match_rows

FLAGS = dict(use_mask=True, use_contrastiv=True, use_last_layer=False)


class MISAMVP(OnlineTrainerPair):
    name = "MISA / MVP"
    method = "mvp"
    counter_name = None
    counter_na = "MVP trains the prompt its count-scaled key match picks; MISA's MVP keeps no step counter"
    import_checkout = staticmethod(_misa.import_misa)
    modules = ("methods.mvp",)
    backbone = _misa.BACKBONE
    model_class, trainer_class = "models.mvp.MVP", "methods.mvp.MVP"
    model_options = dict(class_num=NUM_CLASSES, selection_size=1)
    model_flags = FLAGS
    model_description = f"models.mvp.MVP(class_num=4, selection_size=1) {FLAGS}: task_num = e_pool = 10"
    scheduler_gamma = None

    def trainer_options(self):
        return dict(labels=torch.empty(0), mask_viz=torch.empty(0), mask_store=None, use_afs=True, use_mcr=True,
                    alpha=0.5, gamma=2.0, margin=0.5, **FLAGS, **replay_settings())

    def used_rows(self, ctx, capture):
        return match_rows(capture.seen[-1], ctx.model.e_prompts)

    def slot_usage(self, ctx):
        return ctx.model.count.detach().clone()


def run(checkout: Path, settings: Settings):
    return run_checks(MISAMVP(checkout), settings)
