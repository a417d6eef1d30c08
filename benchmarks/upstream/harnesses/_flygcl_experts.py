"""FlyGCL's HiDe-LoRA and HiDe-Adapter (``models.hide_lora_vit.HiDeLoRAModel``,
``models.hide_adapter_vit.HiDeAdapterModel``), trained by the HiDe trainer
(``methods.hide_norga_trainer.HiDeGCLTrainer``) as the prefix port is (``_flygcl_hide.py``): the same two
branches, per-task LoRA or adapter experts in place of the prefixes. FlyGCL gives these models no RP gate
or EMA heads, so there is no official REAR / TE2 evaluation to agree with: the standard checks only.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._flygcl_hide import FlyGCLPrefix
from benchmarks.upstream.harnesses._flygcl_tasks import FlyGCLTaskPair, Seen, instance_wrapper

#: variant -> (module, model class, expert module attribute, name)
_MODELS = {"lora": ("hide_lora_vit", "HiDeLoRAModel", "lora_expert", "HiDe-LoRA"),
           "adapter": ("hide_adapter_vit", "HiDeAdapterModel", "adapter_expert", "HiDe-Adapter")}


class _ExpertCapture(Seen):
    """The ``expert_ids`` each call of the expert module used, and the outputs of ``forward_prompt``."""

    def __init__(self, model: torch.nn.Module, experts: str) -> None:
        super().__init__()
        self.model, self.experts_name = model, experts
        self.stack = contextlib.ExitStack()

    def __enter__(self):
        def experts(inner):
            def call(backbone, inputs, expert_ids):
                self.experts.append(expert_ids.detach().reshape(-1).long().clone())
                return inner(backbone, inputs, expert_ids)
            return call

        self.stack.enter_context(instance_wrapper(getattr(self.model, self.experts_name), "forward", experts))
        self.stack.enter_context(instance_wrapper(self.model, "forward_prompt", self.keeping_outputs))
        return self

    def __exit__(self, *exc):
        self.stack.close()


class FlyGCLExperts(FlyGCLPrefix):
    def __init__(self, checkout: Path, variant: str) -> None:
        module, model, self.experts_name, name = _MODELS[variant]
        self.modules = (f"models.{module}", "methods.hide_norga_trainer")
        self.method, self.name = "hide", f"FlyGCL / {name}"
        self.model_class = f"models.{module}.{model}"
        self.trainer_class = "methods.hide_norga_trainer.HiDeGCLTrainer"
        self.model_description = (f"models.{module}.{model}(task_num=2, num_classes=4): per-task "
                                  f"{name.split('-')[1]} experts on blocks 0-4; gate g_mlp + g_head")
        FlyGCLTaskPair.__init__(self, checkout)

    def expert_capture(self, ctx):
        return _ExpertCapture(ctx.model, self.experts_name)

    def our_query(self, ctx, x):
        return ctx.model.backbone.forward_features(x)[:, 0]


def run_variant(checkout: Path, settings: Settings, variant: str):
    return run_checks(FlyGCLExperts(checkout, variant), settings)
