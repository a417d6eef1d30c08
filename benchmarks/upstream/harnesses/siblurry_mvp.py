"""Si-Blurry MVP under ``retrofit(method="mvp")``.

Real classes: ``models.mvp.MVP`` (loaded with the fix of ``_siblurry.py``) and ``methods.mvp.MVP``
(trainer: its own ``online_step`` per batch, ``online_evaluate``; the replay memory stays empty).
Flags: use_mask on, use_contrastiv off (see ``_siblurry.py``), use_last_layer off, use_afs and use_gsf
on, alpha / gamma / margin at the configuration defaults 0.5 / 2.0 / 0.5 (the trainer copies the
``use_*`` flags onto the model in its setup; the harness sets them on both).
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _siblurry
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES, OnlineTrainerPair, replay_settings
from benchmarks.upstream.observe import match_rows
from benchmarks.upstream.task_stream import NUM_TASKS

FLAGS = dict(use_mask=True, use_contrastiv=False, use_last_layer=False)


class SiBlurryMVP(OnlineTrainerPair):
    name = "Si-Blurry / MVP"
    method = "mvp"
    counter_name = None
    counter_na = "MVP trains the prompt its count-scaled key match picks; Si-Blurry's MVP keeps no step counter"
    import_checkout = staticmethod(_siblurry.import_siblurry)
    modules = ("models.mvp", "methods.mvp")
    backbone = _siblurry.BACKBONE
    model_class, trainer_class = "models.mvp.MVP", "methods.mvp.MVP"
    model_options = dict(task_num=NUM_TASKS, num_classes=NUM_CLASSES)
    model_flags = FLAGS
    model_description = f"models.mvp.MVP(task_num=2, num_classes=4) {FLAGS}: e_pool = 2"

    def trainer_options(self):
        return dict(labels=torch.empty(0), use_afs=True, use_gsf=True, alpha=0.5, gamma=2.0, margin=0.5, **FLAGS,
                    **replay_settings())

    def used_rows(self, ctx, capture):
        return match_rows(capture.seen[-1], ctx.model.e_prompts)

    def slot_usage(self, ctx):
        return ctx.model.count.detach().clone()


def run(checkout: Path, settings: Settings):
    return run_checks(SiBlurryMVP(checkout), settings)
