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

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._prompt_options import l2p_prompt
from benchmarks.upstream.harnesses._task_loop import TaskLoopPair

POOL, TOP_K = 10, 5


class L2PPytorch(TaskLoopPair):
    name = "l2p-pytorch / L2P"
    method = "l2p"
    counter_name = None
    counter_na = ("L2P's training selection ignores task_id (no prompt mask: top-k key match, batch-wise); the "
                  "loop's task_id only masks classes. Experts are the adapter's key-pool slices")
    pool, top_k = POOL, TOP_K
    prompt = l2p_prompt(POOL, TOP_K, batchwise_prompt=True)
    run_args = dict(pull_constraint_coeff=0.1)

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"vision_transformer.VisionTransformer(+prompt.Prompt pool {POOL}, top_k {TOP_K}) + "
                          "original_model; 2 experts = key slices of 5")


def run(checkout: Path, settings: Settings):
    return run_checks(L2PPytorch(checkout), settings)
