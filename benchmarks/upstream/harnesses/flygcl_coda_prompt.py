"""FlyGCL CODA-Prompt under ``retrofit(method="coda_prompt")``; see ``_flygcl_tasks.py``.

Real classes: ``models.codaprompt.CodaPrompt`` (component pool of 10, 5 per task, on layers 0-4; key width
set to the harness ViT's) and ``methods.codaprompt.CodaPrompt`` (``online_step`` -> ``online_train``;
``online_evaluate``; ``online_after_task`` -> ``model.process_task_count()``, which re-initialises the next
block). The component window a sample used is observed as the ``task_count`` the model's own
``prompt_tuning`` ran under. FlyGCL has no ``--use_rp_gate`` / ``--use_ema_head`` for CODA-Prompt: no (o).
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._flygcl_tasks import FlyGCLTaskPair, instance_wrapper
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES
from benchmarks.upstream.task_stream import NUM_TASKS


class _WindowCapture:
    """For each ``prompt_tuning`` call: its batch's ``task_count`` (the component window's task)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.calls = []

    def __enter__(self):
        def wrap(inner):
            def call(x, *args, **kwargs):
                self.calls.append(torch.full((x.shape[0],), int(self.model.task_count), dtype=torch.long))
                return inner(x, *args, **kwargs)
            return call

        self.context = instance_wrapper(self.model, "prompt_tuning", wrap)
        self.context.__enter__()
        return self

    def __exit__(self, *exc):
        self.context.__exit__(*exc)


class FlyGCLCodaPrompt(FlyGCLTaskPair):
    name = "FlyGCL / CODA-Prompt"
    method = "coda_prompt"
    counter_name = "model.task_count"
    replaces_own_parameters = ("process_task_count() re-creates every e_p/e_k/e_a Parameter (Gram-Schmidt of the "
                               "next block), in the reference run too")
    modules = ("models.codaprompt", "methods.codaprompt")
    model_class, trainer_class = "models.codaprompt.CodaPrompt", "methods.codaprompt.CodaPrompt"
    model_options = dict(task_num=NUM_TASKS, num_classes=NUM_CLASSES, key_dim=32)
    model_description = ("models.codaprompt.CodaPrompt(task_num=2, num_classes=4, key_dim=32): 10 components, "
                         "5 per task, length 20, layers 0-4")

    def trainer_options(self):
        return dict(no_batchmask=False, task_id=0)

    def expert_capture(self, ctx):
        return _WindowCapture(ctx.model)

    def used_rows(self, ctx, capture):
        # the windows of the evaluation's calls (one per routed task present, in task order)
        return torch.cat(capture.calls).sort().values if capture.calls else None

    def verify_forward(self, ctx, handle):
        return lambda x: ctx.model(x)[0] if ctx.model.training else ctx.model(x)

    def counter(self, ctx):
        return int(ctx.model.task_count)

    def probes(self, ctx, adapters):
        """Informational: which prompt components the trainer's optimizer still steps after the task end."""
        stepped = {id(p) for group in ctx.optimizer.param_groups for p in group["params"]}

        def in_optimizer():
            names = [n for n, _ in ctx.model.named_parameters() if n.startswith("e_")]
            return sum(id(getattr(ctx.model, n)) in stepped for n in names), len(names)

        before = in_optimizer()
        ctx.model.process_task_count()  # what online_after_task calls; the trainer never re-creates its optimizer
        after = in_optimizer()
        return [("opt", "INFO", "prompt components the optimizer steps, before / after process_task_count()",
                 f"{before[0]} of {before[1]} / {after[0]} of {after[1]}: from the second task on, FlyGCL's "
                 "CodaPrompt trains no prompt component (only the classifier)")]


def run(checkout: Path, settings: Settings):
    return run_checks(FlyGCLCodaPrompt(checkout), settings)
