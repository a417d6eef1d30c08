"""FlyGCL's HiDe-Prompt / NoRGa port: ``models.hide_norga_prefix_vit`` (per-task prefixes; a gate branch
``g_mlp`` + ``g_head`` for task identification) trained by ``methods.hide_norga_trainer`` (``online_train``:
``forward_prompt(x, task_id=self.task_id)`` and ``forward_gate``; ``online_evaluate``: the gate's class ->
first-task mapping, then ``forward_prompt(x, task_id=task_hat)``; ``online_after_task``: classifier
alignment of both heads, ``task_id += 1``). The model has no ``forward``: the loop's calls are the two
branches. The trainer's ``task_id`` is the method's counter; the retrofit's ``start_expert`` runs the
trainer's own ``online_after_task`` up to the expert (what a user passes).
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings
from benchmarks.upstream.harnesses._flygcl_tasks import (
    FlyGCLTaskPair,
    Seen,
    instance_wrapper,
    run_with_agreement,
)
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES
from benchmarks.upstream.task_stream import BATCH_SIZE

_CLASSES = {"hide": ("HiDePrefixModel", "HiDeGCLTrainer"), "norga": ("NoRGaPrefixModel", "NoRGaGCLTrainer")}


class _PrefixCapture(Seen):
    """The task ids the prefixes were built from (``backbone.forward_features(..., use_prefix=True,
    task_id=...)``) and the outputs of ``forward_prompt``, for the block."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.stack = None

    def __enter__(self):
        import contextlib

        def features(inner):
            def call(x, use_prefix, task_id=None):
                if use_prefix:
                    ids = torch.as_tensor(task_id).reshape(-1).long()
                    self.experts.append(ids.expand(x.shape[0]).clone() if ids.numel() == 1 else ids.clone())
                return inner(x, use_prefix, task_id)
            return call

        self.stack = contextlib.ExitStack()
        self.stack.enter_context(instance_wrapper(self.model.backbone, "forward_features", features))
        self.stack.enter_context(instance_wrapper(self.model, "forward_prompt", self.keeping_outputs))
        return self

    def __exit__(self, *exc):
        self.stack.close()


class FlyGCLPrefix(FlyGCLTaskPair):
    counter_name = "trainer.task_id"
    modules = ("models.hide_norga_prefix_vit", "methods.hide_norga_trainer")
    official_router = "rp_gate"

    def __init__(self, checkout: Path, variant: str) -> None:
        model, trainer = _CLASSES[variant]
        self.method, self.name = variant, f"FlyGCL / {'HiDe-Prompt' if variant == 'hide' else 'NoRGa'}"
        self.model_class = f"models.hide_norga_prefix_vit.{model}"
        self.trainer_class = f"methods.hide_norga_trainer.{trainer}"
        self.model_description = (f"models.hide_norga_prefix_vit.{model}(task_num=2, num_classes=4): prefixes "
                                  "of length 5 on layers 0-4, one per task; gate g_mlp + g_head")
        super().__init__(checkout)

    def trainer_options(self):
        return dict(no_batchmask=False, task_id=0, class_to_first_task=[-1] * NUM_CLASSES, lam_orth=1e-3,
                    ca_num_per_class=10, ca_steps=10, batchsize=BATCH_SIZE)

    def family_options(self, ctx):
        def start_expert(expert: int) -> None:  # the trainer's own task end, up to the expert
            while ctx.trainer.task_id < expert:
                ctx.trainer.online_after_task(ctx.trainer.task_id)
        return dict(start_expert=start_expert)

    def expert_capture(self, ctx):
        return _PrefixCapture(ctx.model)

    def eval_logits(self, ctx, x, y):
        from benchmarks.upstream.pair import active_handle

        handle = active_handle(ctx)
        if handle is not None:
            handle.set_logit_mask(ctx.trainer.mask.clone())
        ctx.model.eval()
        with self.expert_capture(ctx) as capture:
            ctx.trainer.online_evaluate([(x, y)])
        return capture.outputs[-1], capture.experts[-1]

    def verify_forward(self, ctx, handle):
        def forward(x):
            ctx.model.forward_gate(x)  # the task-identification pass the loop runs first
            return ctx.model.forward_prompt(x, task_id=handle.current_expert)[0]
        return forward

    def counter(self, ctx):
        return int(ctx.trainer.task_id)

    def official_routes(self, ctx, official, trainer, x):
        return trainer._predict_task_from_gate(x)  # its RPFC branch (use_rp_gate on)

    def official_probabilities(self, ctx, official, trainer, x, experts):
        members = [logits + trainer.mask for logits in official.forward_prompt_with_ema(x, task_id=experts)]
        return trainer._ensemble_logits(members)

    def our_query(self, ctx, x):
        return ctx.model.forward_gate(x)[1]

    def our_forward(self, ctx, x):
        ctx.model.forward_gate(x)
        return ctx.model.forward_prompt(x, task_id=torch.zeros(x.shape[0], dtype=torch.long))[0]


def run_variant(checkout: Path, settings: Settings, variant: str):
    return run_with_agreement(FlyGCLPrefix(checkout, variant), settings)
