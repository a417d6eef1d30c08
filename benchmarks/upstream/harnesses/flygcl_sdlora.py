"""FlyGCL SD-LoRA under ``retrofit(method="sdlora")``; see ``_flygcl_tasks.py``.

Real classes: ``models.sdlora.SDLoRAModel`` (LoRA on the attention ``qkv``, one direction per task, every
task's direction up to ``task_count`` combined for every sample; classifier ``backbone.fc``) and
``methods.sdlora.SDLoRAGCL`` (``online_step`` -> ``online_train``; ``online_after_task`` calls
``process_task_count()``). ``router=True`` is refused (nothing to route): the checks run with the ensemble.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._flygcl_tasks import FlyGCLTaskPair, Seen, instance_wrapper
from benchmarks.upstream.task_stream import BATCH_SIZE


class _TaskCapture(Seen):
    """Every sample of a ``model.forward`` call uses ``task_count``'s directions: that task, per sample."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.stack = contextlib.ExitStack()

    def __enter__(self):
        def forward(inner):
            def call(inputs, **kwargs):
                self.experts.append(torch.full((inputs.shape[0],), int(self.model.task_count), dtype=torch.long))
                return inner(inputs, **kwargs)
            return call

        self.stack.enter_context(instance_wrapper(self.model, "forward", forward))
        return self

    def __exit__(self, *exc):
        self.stack.close()


class FlyGCLSDLoRA(FlyGCLTaskPair):
    name = "FlyGCL / SD-LoRA"
    method = "sdlora"
    counter_name = "model.task_count"
    modules = ("models.sdlora", "methods.sdlora")
    model_class, trainer_class = "models.sdlora.SDLoRAModel", "methods.sdlora.SDLoRAGCL"
    model_description = "models.sdlora.SDLoRAModel(task_num=2, num_classes=4): LoRA directions on every block's qkv"

    def trainer_options(self):
        return dict(no_batchmask=False, task_id=0, sdlora_ortho_weight=0.0, batchsize=BATCH_SIZE)

    def expert_capture(self, ctx):
        return _TaskCapture(ctx.model)

    def counter(self, ctx):
        return int(ctx.model.task_count)

    def slot_usage(self, ctx):
        return None


def run(checkout: Path, settings: Settings):
    return run_checks(FlyGCLSDLoRA(checkout), settings)
