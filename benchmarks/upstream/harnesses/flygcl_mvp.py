"""FlyGCL MVP under ``retrofit(method="mvp")``.

Real classes: ``models.mvp.MVP`` (model) and ``methods.mvp.MVP`` (trainer: ``online_step`` ->
``online_train`` with its per-sample gradient scores, ``online_evaluate``), with the values
``MVP.__init__`` sets (use_afs / use_mcr / use_mask on, alpha 0.5, gamma 2.0, margin 0.5).
(f) is N/A: MVP's training picks prompts by a count-scaled key match; ``model.task_count`` is read
only by the optional RPFC gate at evaluation.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _flygcl
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES, OnlineTrainerPair
from benchmarks.upstream.observe import match_rows
from benchmarks.upstream.task_stream import NUM_TASKS


class FlyGCLMVP(OnlineTrainerPair):
    name = "FlyGCL / MVP"
    method = "mvp"
    counter_name = None
    counter_na = ("MVP trains the prompt its count-scaled key match picks; model.task_count is moved by "
                  "process_task_count() but read only by the RPFC gate at evaluation")
    import_checkout = staticmethod(_flygcl.import_flygcl)
    modules = ("models.mvp", "methods.mvp")
    backbone = _flygcl.BACKBONE
    model_class, trainer_class = "models.mvp.MVP", "methods.mvp.MVP"
    model_options = dict(task_num=NUM_TASKS, num_classes=NUM_CLASSES)
    model_description = "models.mvp.MVP(task_num=2, num_classes=4): e_pool = task_num = 2, learnable key and mask"

    def trainer_options(self):
        return dict(_flygcl.step_schedule(), use_afs=True, use_mcr=True, use_mask=True, alpha=0.5, gamma=2.0,
                    margin=0.5)

    def start_task(self, ctx, task, own_advance):
        ctx.trainer.step_num = NUM_TASKS if own_advance else None
        super().start_task(ctx, task, own_advance)

    def used_rows(self, ctx, capture):
        return match_rows(capture.seen[-1], ctx.model.e_prompts)

    def sync_counter(self, ctx):
        return int(ctx.model.task_count)  # FlyGCL advances it inside online_step; the handle follows

    def slot_usage(self, ctx):
        return ctx.model.count.detach().clone()


def run(checkout: Path, settings: Settings):
    return run_checks(FlyGCLMVP(checkout), settings)
