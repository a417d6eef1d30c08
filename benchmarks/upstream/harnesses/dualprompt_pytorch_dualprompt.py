"""JH-LEE-KR/dualprompt-pytorch DualPrompt under ``retrofit(method="dualprompt", num_experts=2)``.

Real classes: ``vision_transformer.VisionTransformer`` with ``prompt.EPrompt`` (model) and a prompt-free
one (original_model), built directly at the harness size. Configuration: the CIFAR-100 DualPrompt
defaults (G-prompt prefix on layers 0-1, E-prompt prefix on 2-4, pool 10, length 5, top 1, prompt key,
prompt mask so task t trains slot t, shared prompt pool, batch-wise prompt, 'token' head, pull
constraint 1.0, Adam). Per batch: ``engine.train_one_epoch``; evaluation: ``engine.evaluate``. At a
task start the loop (inline in ``train_and_evaluate``, no function to call) starts the task's E-prompt
slot from the previous task's values and makes a new optimizer; the harness does both.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _task_loop
from benchmarks.upstream.loading import import_upstream
from benchmarks.upstream.observe import capture_outputs
from benchmarks.upstream.pair import Pair

POOL, TOP_K = 10, 1
PROMPT = dict(prompt_length=5, embedding_key="cls", prompt_init="uniform", prompt_pool=True, prompt_key=True,
              pool_size=POOL, top_k=TOP_K, batchwise_prompt=True, prompt_key_init="uniform", head_type="token",
              use_prompt_mask=True, use_g_prompt=True, g_prompt_length=5, g_prompt_layer_idx=[0, 1],
              use_prefix_tune_for_g_prompt=True, use_e_prompt=True, e_prompt_layer_idx=[2, 3, 4],
              use_prefix_tune_for_e_prompt=True, same_key_value=False)
ARGS = dict(pull_constraint_coeff=1.0, shared_prompt_pool=True, shared_prompt_key=False, prompt_pool=True,
            top_k=TOP_K, size=POOL, use_prefix_tune_for_e_prompt=True)
SLOT_DIM = 2  # prefix-tuned E-prompts: (layers, key/value, slot, length, heads, head_dim)


class DualPromptPytorch(Pair):
    name = "dualprompt-pytorch / DualPrompt"
    method = "dualprompt"
    schedule = "session"
    counter_name = "the loop's task_id (prompt-mask slots)"

    def __init__(self, checkout: Path) -> None:
        self.stubs = import_upstream(checkout, ["vision_transformer", "engine"])
        import engine
        from timm.optim import create_optimizer
        from vision_transformer import VisionTransformer

        self.engine, self.create_optimizer, self.vit = engine, create_optimizer, VisionTransformer

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"vision_transformer.VisionTransformer(+EPrompt pool {POOL}, top_k {TOP_K}, prefix G [0,1] "
                          "/ E [2,3,4], prompt mask) + original_model; 2 experts = slots 0 and 1")

    def build(self, seed):
        torch.manual_seed(seed)
        original_model = self.vit(**_task_loop.TINY)
        model = self.vit(**_task_loop.TINY, **PROMPT)
        _task_loop.freeze(model, original_model)
        args = _task_loop.base_args(**ARGS)
        return SimpleNamespace(model=model, original_model=original_model, optimizer=self.create_optimizer(args, model),
                               args=args, task_id=0, usage=torch.zeros(POOL))

    def family_options(self, ctx):
        return dict(num_experts=2)

    def start_task(self, ctx, task, own_advance):
        ctx.task_id = task
        if task > 0:
            prompts = ctx.model.e_prompt.prompt
            with torch.no_grad():  # the new task's slot starts from the previous task's values
                prompts.narrow(SLOT_DIM, task * TOP_K, TOP_K).copy_(prompts.narrow(SLOT_DIM, (task - 1) * TOP_K, TOP_K))
            ctx.optimizer = self.create_optimizer(ctx.args, ctx.model)

    def train_batch(self, ctx, x, y, task):
        with capture_outputs(ctx.model) as outputs:
            stats = self.engine.train_one_epoch(
                model=ctx.model, original_model=ctx.original_model, criterion=torch.nn.CrossEntropyLoss(),
                data_loader=[(x, y)], optimizer=ctx.optimizer, device=torch.device("cpu"), epoch=0,
                max_norm=ctx.args.clip_grad, set_training_mode=True, task_id=ctx.task_id,
                class_mask=_task_loop.class_mask(), args=ctx.args)
        _task_loop.prompt_usage(ctx, outputs, POOL)
        return [stats["Loss"]]

    def eval_logits(self, ctx, x, y):
        with capture_outputs(ctx.model) as outputs:
            self.engine.evaluate(model=ctx.model, original_model=ctx.original_model, data_loader=[(x, y)],
                                 device=torch.device("cpu"), task_id=ctx.task_id, class_mask=_task_loop.class_mask(),
                                 args=ctx.args)
        return outputs[-1]["logits"].detach(), outputs[-1]["prompt_idx"][:, 0].detach()

    def counter(self, ctx):
        return int(ctx.task_id)

    def verify_forward(self, ctx, handle):
        return lambda x: ctx.model(x, task_id=handle.current_expert,
                                   cls_features=ctx.original_model(x)["pre_logits"], train=ctx.model.training)

    def slot_usage(self, ctx):
        return ctx.usage.clone()

    def expert_slots(self, ctx, expert):
        return list(range(expert * TOP_K, (expert + 1) * TOP_K))


def run(checkout: Path, settings: Settings):
    return run_checks(DualPromptPytorch(checkout), settings)
