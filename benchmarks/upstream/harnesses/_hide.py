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

import importlib
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _task_loop
from benchmarks.upstream.loading import import_upstream
from benchmarks.upstream.observe import capture_outputs
from benchmarks.upstream.pair import Pair

POOL, LENGTH = 10, 5
ENGINES = {"hide": "engines.hide_promtp_wtp_and_tap_engine", "norga": "engines.norga_prompt_engine"}


class HiDeLayout(Pair):
    schedule = "session"
    counter_name = "the loop's task_id (prompt-mask slots)"

    def __init__(self, checkout: Path, variant: str, name: str) -> None:
        self.method, self.name = variant, name
        vit_module = f"vits.{variant}_prompt_vision_transformer"
        self.stubs = import_upstream(checkout, [vit_module, ENGINES[variant]])
        from timm.optim import create_optimizer

        self.vit = importlib.import_module(vit_module).VisionTransformer
        self.engine = importlib.import_module(ENGINES[variant])
        self.engine.cls_mean, self.engine.cls_cov = {}, {}
        self.create_optimizer = create_optimizer
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

    def build(self, seed):
        torch.manual_seed(seed)
        original_model = self.vit(**_task_loop.TINY, mlp_structure=[2])
        model = self.vit(**_task_loop.TINY, **self.prompt)
        _task_loop.freeze(model, original_model)
        args = _task_loop.base_args(prompt_momentum=0.01, reg=0.1, larger_prompt_lr=True, pull_constraint_coeff=1.0)
        return SimpleNamespace(model=model, original_model=original_model, optimizer=self.optimizer_for(args, model),
                               args=args, task_id=0, usage=torch.zeros(POOL))

    def family_options(self, ctx):
        return dict(original_model=ctx.original_model)

    def start_task(self, ctx, task, own_advance):
        ctx.task_id = task
        if task > 0 and ctx.args.reinit_optimizer:
            ctx.optimizer = self.optimizer_for(ctx.args, ctx.model)

    def train_batch(self, ctx, x, y, task):
        with capture_outputs(ctx.model) as outputs:
            stats = self.engine.train_one_epoch(
                model=ctx.model, original_model=ctx.original_model, criterion=torch.nn.CrossEntropyLoss(),
                data_loader=[(x, y)], optimizer=ctx.optimizer, device=torch.device("cpu"), epoch=0,
                max_norm=ctx.args.clip_grad, set_training_mode=True, task_id=ctx.task_id,
                class_mask=_task_loop.class_mask(), target_task_map=_task_loop.target_task_map(), args=ctx.args)
        _task_loop.prompt_usage(ctx, outputs, POOL)
        return [stats["Loss"]]

    def eval_logits(self, ctx, x, y):
        with capture_outputs(ctx.model) as outputs:
            self.engine.evaluate(model=ctx.model, original_model=ctx.original_model, data_loader=[(x, y)],
                                 device=torch.device("cpu"), i=ctx.task_id, task_id=ctx.task_id,
                                 class_mask=_task_loop.class_mask(), target_task_map=_task_loop.target_task_map(),
                                 args=ctx.args)
        return outputs[-1]["logits"].detach(), outputs[-1]["prompt_idx"][:, 0].detach()

    def verify_forward(self, ctx, handle):
        def forward(x):
            ctx.original_model(x)  # the task-identity pass evaluate() runs first
            prompt_id = torch.full((x.shape[0], 1), handle.current_expert, dtype=torch.long)
            return ctx.model(x, task_id=handle.current_expert, prompt_id=prompt_id, train=ctx.model.training)
        return forward

    def counter(self, ctx):
        return int(ctx.task_id)

    def slot_usage(self, ctx):
        return ctx.usage.clone()

    def expert_slots(self, ctx, expert):
        return [expert]


def run_variant(checkout: Path, settings: Settings, variant: str, name: str):
    return run_checks(HiDeLayout(checkout, variant, name), settings)
