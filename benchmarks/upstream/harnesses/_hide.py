"""The HiDe-Prompt layout shared by thu-ml/HiDe-Prompt (HiDe) and Minhchuyentoancbn/MoE_PromptCL (NoRGa,
and its copy of HiDe).

Model: ``vits/<hide|norga>_prompt_vision_transformer.VisionTransformer`` with E-prompts, at the
second-stage settings of their CIFAR-100 scripts: prefix E-prompts on layers 0-4, length 5, pool 10,
top 1, prompt mask (task t trains slot t), no G-prompt, 'token' head, no prompt key, pull constraint 1.0,
two learning rates (prompts at lr, the rest at lr / 10), train mask, clip 1.0, new optimizer per task,
NoRGa's sigmoid gate. original_model: the same class without prompts and ``mlp_structure=[2]`` (the
task-identity model; random here, their scripts load a first-stage checkpoint). Per batch:
``engine.train_one_epoch`` -- HiDe's runs original_model first (task identity -> prompt id), NoRGa's
passes ``prompt_id = task_id`` and never runs it. Evaluation: ``engine.evaluate``. The engine's module
globals ``cls_mean`` / ``cls_cov`` start empty, as ``train_and_evaluate`` makes them. Not run: class
statistics, classifier alignment and the end-of-task prompt momentum of ``train_and_evaluate``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._task_loop import TaskLoopPair, target_task_map

POOL, LENGTH = 10, 5
ENGINES = {"hide": "engines.hide_promtp_wtp_and_tap_engine", "norga": "engines.norga_prompt_engine"}


class HiDeLayout(TaskLoopPair):
    counter_name = "the loop's task_id (prompt-mask slots)"
    pool, top_k = POOL, 1
    original_options = dict(mlp_structure=[2])
    run_args = dict(prompt_momentum=0.01, reg=0.1, larger_prompt_lr=True, pull_constraint_coeff=1.0)

    def __init__(self, checkout: Path, variant: str, name: str) -> None:
        self.method, self.name = variant, name
        super().__init__(checkout, f"vits.{variant}_prompt_vision_transformer", ENGINES[variant])
        self.engine.cls_mean, self.engine.cls_cov = {}, {}
        self.prompt = dict(
            prompt_length=LENGTH, embedding_key="cls", prompt_init="uniform", prompt_pool=True, prompt_key=False,
            pool_size=POOL, top_k=1, batchwise_prompt=False, prompt_key_init="uniform", head_type="token",
            use_prompt_mask=True, use_g_prompt=False, g_prompt_length=5, g_prompt_layer_idx=[],
            use_prefix_tune_for_g_prompt=False, use_e_prompt=True, e_prompt_layer_idx=[0, 1, 2, 3, 4],
            use_prefix_tune_for_e_prompt=True, same_key_value=False)
        if variant == "norga":
            self.prompt["gate_act"] = "sigmoid"

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"vits.{self.method}_prompt_vision_transformer.VisionTransformer(+EPrompt pool {POOL}, "
                          "top_k 1, prefix E [0..4], prompt mask) + original_model(mlp_structure=[2]); experts = slots")

    def optimizer_for(self, args, model):
        """Two parameter groups: the prompts at ``lr``, every other trainable parameter at ``lr / 10``."""
        trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        groups = [dict(params=[p for name, p in trainable if ("prompt" in name) == is_prompt], lr=args.lr * scale,
                       weight_decay=args.weight_decay) for is_prompt, scale in ((True, 1.0), (False, 0.1))]
        return self.create_optimizer(args, groups)

    def family_options(self, ctx):
        return dict(original_model=ctx.original_model)

    def train_options(self, ctx):
        return dict(target_task_map=target_task_map())

    def evaluate_options(self, ctx):
        return dict(i=ctx.task_id, target_task_map=target_task_map())

    def verify_forward(self, ctx, handle):
        def forward(x):
            ctx.original_model(x)  # the task-identity pass evaluate() runs first
            prompt_id = torch.full((x.shape[0], 1), handle.current_expert, dtype=torch.long)
            return ctx.model(x, task_id=handle.current_expert, prompt_id=prompt_id, train=ctx.model.training)
        return forward

    def counter(self, ctx):
        return int(ctx.task_id)


def run_variant(checkout: Path, settings: Settings, variant: str, name: str):
    return run_checks(HiDeLayout(checkout, variant, name), settings)
