"""FlyGCL S-Prompts under ``retrofit(method="sprompt")``; see ``_flygcl_tasks.py``.

Real classes: ``models.sprompt.SPrompt`` (one prompt set per task, ``forward(inputs, expert_ids=None)``)
and ``methods.sprompt.SPrompt`` (``online_step`` -> ``online_train``, class-token features kept for the
prototypes; ``online_evaluate`` routes by nearest prototype and calls ``model(images, expert_ids=...)``).
The method's own counter is ``model.task_count``, moved by ``process_task_count()`` in ``online_after_task``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings
from benchmarks.upstream.harnesses._flygcl_tasks import FlyGCLTaskPair, Seen, run_with_agreement
from benchmarks.upstream.task_stream import BATCH_SIZE, BATCHES_PER_TASK, NUM_TASKS


class _ExpertCapture(Seen):
    """The ``expert_ids`` of every ``model.experts(backbone, inputs, expert_ids)`` call (a pre-hook)."""

    def __init__(self, experts: torch.nn.Module) -> None:
        super().__init__()
        self.module = experts

    def __enter__(self):
        def before(module, args):
            self.experts.append(args[2].detach().clone())

        self.hook = self.module.register_forward_pre_hook(before)
        return self

    def __exit__(self, *exc):
        self.hook.remove()


class FlyGCLSPrompt(FlyGCLTaskPair):
    name = "FlyGCL / S-Prompts"
    method = "sprompt"
    counter_name = "model.task_count"
    modules = ("models.sprompt", "methods.sprompt")
    model_class, trainer_class = "models.sprompt.SPrompt", "methods.sprompt.SPrompt"
    model_description = "models.sprompt.SPrompt(task_num=2, num_classes=4): one prompt set per task on layers 0-4"
    official_router = "rp_head"

    def trainer_options(self):
        # Every feature a prototype: the trainer's branch for fewer features than prototypes (no k-means).
        stream = NUM_TASKS * BATCHES_PER_TASK * BATCH_SIZE
        return dict(no_batchmask=False, task_id=0, label_to_task={}, task_prototypes={}, _cur_task_features=[],
                    num_prototypes_per_task=stream + 1, max_features_per_task=stream + 1)

    def end_task(self, ctx, task):
        ctx.trainer._build_prototypes_for_task(task)  # what its end-of-task evaluation builds
        super().end_task(ctx, task)

    def expert_capture(self, ctx):
        return _ExpertCapture(ctx.model.experts)

    def counter(self, ctx):
        return int(ctx.model.task_count)

    def slot_usage(self, ctx):
        return None

    def official_routes(self, ctx, official, trainer, x):
        # online_evaluate's RPFC branch: scores of the tasks seen so far, argmax
        return official.forward_with_rp(x)[:, : trainer.task_id + 1].argmax(-1)

    def official_probabilities(self, ctx, official, trainer, x, experts):
        members = [logits + trainer.mask for logits in official.forward_with_ema(x, expert_ids=experts)]
        return trainer._ensemble_logits(members)

    def our_query(self, ctx, x):
        return ctx.model.backbone.forward_features(x)[:, 0]

    def our_forward(self, ctx, x):
        return ctx.model(x)


def run(checkout: Path, settings: Settings):
    return run_with_agreement(FlyGCLSPrompt(checkout), settings)
