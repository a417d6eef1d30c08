"""FlyGCL DualPrompt under ``retrofit(method="dualprompt")``.

Real classes: ``models.dualprompt.DualPrompt`` (model) and ``methods.dualprompt.DualPrompt`` (trainer:
``online_step`` -> ``online_train`` per batch, ``online_evaluate`` at evaluation). FlyGCL's own step
advance (``model.process_task_count()`` from inside ``online_step`` once a step's sample budget is
seen) runs in the reference run, with one task's samples per step.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _flygcl
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES, OnlineTrainerPair
from benchmarks.upstream.observe import match_rows
from benchmarks.upstream.task_stream import NUM_TASKS


class FlyGCLDualPrompt(OnlineTrainerPair):
    name = "FlyGCL / DualPrompt"
    method = "dualprompt"
    counter_name = "model.task_count"
    import_checkout = staticmethod(_flygcl.import_flygcl)
    modules = ("models.dualprompt", "methods.dualprompt")
    backbone = _flygcl.BACKBONE
    model_class, trainer_class = "models.dualprompt.DualPrompt", "methods.dualprompt.DualPrompt"
    model_options = dict(task_num=NUM_TASKS, num_classes=NUM_CLASSES)
    model_description = "models.dualprompt.DualPrompt(task_num=2, num_classes=4): e_pool 10, 5 slots per step"

    def trainer_options(self):
        return _flygcl.step_schedule()

    def start_task(self, ctx, task, own_advance):
        ctx.trainer.step_num = NUM_TASKS if own_advance else None  # no own advance when the schedule drives
        super().start_task(ctx, task, own_advance)

    def used_rows(self, ctx, capture):
        return match_rows(capture.seen[-1][:, 0], ctx.model.e_prompt.prompts)

    def counter(self, ctx):
        return int(ctx.model.task_count)

    def slot_usage(self, ctx):
        return ctx.model.e_prompt.counter.detach().clone()

    def slots_per_expert(self, ctx):
        return ctx.model.num_pt_per_task


def run(checkout: Path, settings: Settings):
    return run_checks(FlyGCLDualPrompt(checkout), settings)
