"""JH-LEE-KR/l2p-pytorch L2P under ``retrofit(method="l2p", num_experts=2)``.

Real classes: ``vision_transformer.VisionTransformer`` with its ``prompt.Prompt`` pool (model) and a
prompt-free one (original_model), built directly at the harness size (their main.py builds both through
timm registrations that differ only in size). Configuration: the CIFAR-100 L2P defaults (pool 10, top 5,
length 5, prompt key, batch-wise prompt, 'cls' embedding key, 'prompt' head, no prompt mask, pull
constraint 0.1, train mask, clip 1.0, Adam). Per batch: ``engine.train_one_epoch``; evaluation:
``engine.evaluate`` (see ``_task_loop.py``). (f) is N/A: the training selection ignores ``task_id``.
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

POOL, TOP_K = 10, 5
PROMPT = dict(prompt_length=5, embedding_key="cls", prompt_init="uniform", prompt_pool=True, prompt_key=True,
              pool_size=POOL, top_k=TOP_K, batchwise_prompt=True, prompt_key_init="uniform", head_type="prompt",
              use_prompt_mask=False)


class L2PPytorch(Pair):
    name = "l2p-pytorch / L2P"
    method = "l2p"
    schedule = "session"
    counter_name = None
    counter_na = ("L2P's training selection ignores task_id (no prompt mask: top-k key match, batch-wise); the "
                  "loop's task_id only masks classes. Experts are the adapter's key-pool slices")

    def __init__(self, checkout: Path) -> None:
        self.stubs = import_upstream(checkout, ["vision_transformer", "engine"])
        import engine
        from timm.optim import create_optimizer
        from vision_transformer import VisionTransformer

        self.engine, self.create_optimizer, self.vit = engine, create_optimizer, VisionTransformer

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"vision_transformer.VisionTransformer(+prompt.Prompt pool {POOL}, top_k {TOP_K}) + "
                          "original_model; 2 experts = key slices of 5")

    def build(self, seed):
        torch.manual_seed(seed)
        original_model = self.vit(**_task_loop.TINY)
        model = self.vit(**_task_loop.TINY, **PROMPT)
        _task_loop.freeze(model, original_model)
        args = _task_loop.base_args(pull_constraint_coeff=0.1)
        return SimpleNamespace(model=model, original_model=original_model, optimizer=self.create_optimizer(args, model),
                               args=args, task_id=0, usage=torch.zeros(POOL))

    def family_options(self, ctx):
        return dict(num_experts=2)

    def start_task(self, ctx, task, own_advance):
        ctx.task_id = task
        if task > 0 and ctx.args.reinit_optimizer:
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

    def verify_forward(self, ctx, handle):
        return lambda x: ctx.model(x, task_id=handle.current_expert,
                                   cls_features=ctx.original_model(x)["pre_logits"], train=ctx.model.training)

    def slot_usage(self, ctx):
        return ctx.usage.clone()

    def expert_slots(self, ctx, expert):
        return list(range(expert * TOP_K, (expert + 1) * TOP_K))


def run(checkout: Path, settings: Settings):
    return run_checks(L2PPytorch(checkout), settings)
