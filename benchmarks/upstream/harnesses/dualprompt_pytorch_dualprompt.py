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

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._prompt_options import dualprompt_prompt
from benchmarks.upstream.harnesses._task_loop import TaskLoopPair

POOL, TOP_K = 10, 1
SLOT_DIM = 2  # prefix-tuned E-prompts: (layers, key/value, slot, length, heads, head_dim)


class DualPromptPytorch(TaskLoopPair):
    name = "dualprompt-pytorch / DualPrompt"
    method = "dualprompt"
    counter_name = "the loop's task_id (prompt-mask slots)"
    pool, top_k = POOL, TOP_K
    prompt = dualprompt_prompt(POOL, TOP_K)
    run_args = dict(pull_constraint_coeff=1.0, shared_prompt_pool=True, shared_prompt_key=False, prompt_pool=True,
                    top_k=TOP_K, size=POOL, use_prefix_tune_for_e_prompt=True)

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"vision_transformer.VisionTransformer(+EPrompt pool {POOL}, top_k {TOP_K}, prefix G [0,1] "
                          "/ E [2,3,4], prompt mask) + original_model; 2 experts = slots 0 and 1")

    def start_task(self, ctx, task, own_advance):
        if task > 0:
            prompts = ctx.model.e_prompt.prompt
            with torch.no_grad():  # the new task's slot starts from the previous task's values
                prompts.narrow(SLOT_DIM, task * TOP_K, TOP_K).copy_(prompts.narrow(SLOT_DIM, (task - 1) * TOP_K, TOP_K))
        super().start_task(ctx, task, own_advance)

    def counter(self, ctx):
        return int(ctx.task_id)


def run(checkout: Path, settings: Settings):
    return run_checks(DualPromptPytorch(checkout), settings)
