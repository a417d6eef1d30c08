"""LAMDA-PILOT L2P under ``retrofit(learner._network.backbone, method="l2p", num_experts=2)``.

Real classes: ``models.l2p.Learner``, ``utils.inc_net.PromptVitNet``, ``backbone.vit_l2p.VisionTransformer``.
Configuration: PILOT's L2P experiment file (pool 10, top 5, length 5, batch-wise prompt, 'prompt' head,
pull constraint 0.1, new optimizer per task). Construction and loop: ``_pilot.py``.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._pilot import PilotPair
from benchmarks.upstream.harnesses._prompt_options import l2p_prompt

POOL, TOP_K = 10, 5
PROMPT = l2p_prompt(POOL, TOP_K, batchwise_prompt=True)
ARGS = dict(size=POOL, top_k=TOP_K, pull_constraint_coeff=0.1, shared_prompt_pool=False, shared_prompt_key=False)


class PilotL2P(PilotPair):
    name = "LAMDA-PILOT / L2P"
    method = "l2p"
    counter_name = None
    counter_na = "PILOT's L2P trains without a prompt mask: the task id never selects slots"
    pool, top_k = POOL, TOP_K

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"models.l2p.Learner -> _network PromptVitNet -> backbone VisionTransformer(+Prompt pool "
                          f"{POOL}, top_k {TOP_K})")


def run(checkout: Path, settings: Settings):
    return run_checks(PilotL2P(checkout, "backbone.vit_l2p", "models.l2p", PROMPT, ARGS), settings)
