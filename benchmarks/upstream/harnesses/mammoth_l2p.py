"""aimagelab/mammoth L2P under ``retrofit(continual_model.net.model, method="l2p", num_experts=2)``.

Real classes: ``models.l2p.L2P`` (ContinualModel), its net ``models.l2p_utils.l2p_model.L2PModel``
(made without ``__init__``, which downloads weights) holding two harness-size
``models.l2p_utils.vit_prompt.VisionTransformer`` (original_model and the prompted model). Configuration:
mammoth's L2P defaults (pool 10, top 5, length 5, prompt key, 'cls' embedding key, 'prompt' head, pull
constraint 0.1, clip 1). ``begin_task`` makes a new ``self.opt`` every task. Probe r2: the net itself
is not a target (it has no prompt pool).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _mammoth
from benchmarks.upstream.harnesses._mammoth_pair import MammothPair
from benchmarks.upstream.harnesses._prompt_options import l2p_prompt
from benchmarks.upstream.harnesses._task_loop import TINY

POOL, TOP_K = 10, 5
PROMPT = l2p_prompt(POOL, TOP_K, batchwise_prompt=False)


class MammothL2P(MammothPair):
    name = "mammoth / L2P"
    method = "l2p"
    counter_name = None
    counter_na = "mammoth's L2P calls the prompted ViT with task_id=-1; no per-step slots"
    pool, top_k = POOL, TOP_K

    def __init__(self, checkout: Path) -> None:
        self.stubs = _mammoth.import_mammoth(checkout, ["models.l2p", "models.l2p_utils.l2p_model",
                                                        "models.l2p_utils.vit_prompt"])
        from models.l2p import L2P
        from models.l2p_utils.l2p_model import L2PModel
        from models.l2p_utils.vit_prompt import VisionTransformer

        self.classes = L2P, L2PModel, VisionTransformer

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"models.l2p.L2P -> net L2PModel -> net.model VisionTransformer(+Prompt pool {POOL}, "
                          f"top_k {TOP_K})")

    def make_continual_model(self, seed):
        model_cls, net_cls, vit_cls = self.classes
        args = _mammoth.base_args(pull_constraint_coeff=0.1)
        return _mammoth.continual_model(model_cls, _mammoth.make_net(net_cls, vit_cls, TINY, PROMPT, args), args)

    def verify_forward(self, ctx, handle):
        return lambda x: ctx.cm.net(x)


def run(checkout: Path, settings: Settings):
    return run_checks(MammothL2P(checkout), settings)
