"""Si-Blurry DualPrompt under ``retrofit(method="dualprompt")``.

Real classes: ``models.dualprompt.DualPrompt`` (one E-prompt slot per task) trained by the ER trainer
``methods.er_baseline.ER`` (Si-Blurry runs DualPrompt with ``--mode er``): its own ``online_step`` per
batch, ``online_evaluate`` at evaluation; the replay memory stays empty. The adapter refuses
``router=True`` (the pool's ``forward`` takes no slot range), so the checks run with the ensemble alone.
Import fixes: ``_siblurry.py``.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _siblurry
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES, OnlineTrainerPair, replay_settings
from benchmarks.upstream.observe import match_rows
from benchmarks.upstream.task_stream import NUM_TASKS


class SiBlurryDualPrompt(OnlineTrainerPair):
    name = "Si-Blurry / DualPrompt"
    method = "dualprompt"
    counter_name = None
    counter_na = ("Si-Blurry's DualPrompt trains whichever slot its key match picks over the whole pool; "
                  "model.task_id is read by no forward")
    import_checkout = staticmethod(_siblurry.import_siblurry)
    modules = ("models.dualprompt", "methods.er_baseline")
    backbone = _siblurry.BACKBONE
    model_class, trainer_class = "models.dualprompt.DualPrompt", "methods.er_baseline.ER"
    model_options = dict(task_num=NUM_TASKS, num_classes=NUM_CLASSES)
    model_description = "models.dualprompt.DualPrompt(task_num=2, num_classes=4): e_pool = task_num = 2"

    def trainer_options(self):
        return dict(cutmix=False, **replay_settings())

    def used_rows(self, ctx, capture):
        return match_rows(capture.seen[-1][:, 0], ctx.model.e_prompt.prompts)

    def slot_usage(self, ctx):
        return ctx.model.e_prompt.counter.detach().clone()


def run(checkout: Path, settings: Settings):
    return run_checks(SiBlurryDualPrompt(checkout), settings)
