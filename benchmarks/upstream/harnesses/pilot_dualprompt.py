"""LAMDA-PILOT DualPrompt under ``retrofit(learner._network.backbone, method="dualprompt", num_experts=2)``.

Real classes: ``models.dualprompt.Learner``, ``utils.inc_net.PromptVitNet``,
``backbone.vit_dualprompt.VisionTransformer``. Configuration: PILOT's DualPrompt experiment file (G prefix
0-1, E prefix 2-4, pool 10, top 1, length 5, prompt mask, shared prompt pool, batch-wise prompt, pull
constraint 0.1, new optimizer per task). Construction and loop: ``_pilot.py``.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._pilot import PilotPair
from benchmarks.upstream.harnesses._prompt_options import dualprompt_prompt

POOL, TOP_K = 10, 1
PROMPT = dualprompt_prompt(POOL, TOP_K)
ARGS = dict(size=POOL, top_k=TOP_K, pull_constraint_coeff=0.1, shared_prompt_pool=True, shared_prompt_key=False,
            use_prefix_tune_for_e_prompt=True)


class PilotDualPrompt(PilotPair):
    name = "LAMDA-PILOT / DualPrompt"
    method = "dualprompt"
    counter_name = "learner._cur_task (prompt-mask slots)"
    pool, top_k = POOL, TOP_K

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"models.dualprompt.Learner -> _network PromptVitNet -> backbone VisionTransformer(+EPrompt "
                          f"pool {POOL}, top_k {TOP_K}, prompt mask)")

    def counter(self, ctx):
        return int(ctx.learner._cur_task)


def run(checkout: Path, settings: Settings):
    return run_checks(PilotDualPrompt(checkout, "backbone.vit_dualprompt", "models.dualprompt", PROMPT, ARGS), settings)
