"""aimagelab/mammoth DualPrompt under ``retrofit(continual_model.net.model, method="dualprompt", num_experts=2)``.

Real classes: ``models.dualprompt.DualPrompt`` (ContinualModel), its net ``models.dualprompt_utils.model.Model``
(made without ``__init__``) holding two harness-size ``models.dualprompt_utils.vision_transformer.VisionTransformer``.
Configuration: mammoth's DualPrompt defaults (G prefix 0-1, E prefix 2-4, pool 10, top 1, length 5,
batch-wise prompt, pull constraint 1.0, clip 1). ``begin_task`` starts slot t from slot t - 1 and makes a
new ``self.opt``; mammoth passes ``task_id`` to the net (prompt mask: task t trains slot t).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _mammoth
from benchmarks.upstream.harnesses._mammoth_pair import MammothPair
from benchmarks.upstream.harnesses._prompt_options import dualprompt_prompt
from benchmarks.upstream.harnesses._task_loop import TINY

POOL, TOP_K = 10, 1
PROMPT = dualprompt_prompt(POOL, TOP_K)


class MammothDualPrompt(MammothPair):
    name = "mammoth / DualPrompt"
    method = "dualprompt"
    counter_name = "continual_model.current_task (prompt-mask slots)"
    pool, top_k = POOL, TOP_K

    def __init__(self, checkout: Path) -> None:
        self.stubs = _mammoth.import_mammoth(checkout, ["models.dualprompt", "models.dualprompt_utils.model",
                                                        "models.dualprompt_utils.vision_transformer"])
        from models.dualprompt import DualPrompt
        from models.dualprompt_utils.model import Model
        from models.dualprompt_utils.vision_transformer import VisionTransformer

        self.classes = DualPrompt, Model, VisionTransformer

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"models.dualprompt.DualPrompt -> net Model -> net.model VisionTransformer(+EPrompt pool "
                          f"{POOL}, top_k {TOP_K}, prompt mask)")

    def make_continual_model(self, seed):
        model_cls, net_cls, vit_cls = self.classes
        args = _mammoth.base_args(pull_constraint_coeff=1.0, top_k=TOP_K, size=POOL, use_prefix_tune_for_e_prompt=True,
                                  batchwise_prompt=True)
        net = _mammoth.make_net(net_cls, vit_cls, TINY, PROMPT, args, n_classes=TINY["num_classes"])
        return _mammoth.continual_model(model_cls, net, args)

    def verify_forward(self, ctx, handle):
        return lambda x: ctx.cm.net(x, task_id=handle.current_expert, train=ctx.model.training)

    def counter(self, ctx):
        return int(ctx.cm.current_task)


def run(checkout: Path, settings: Settings):
    return run_checks(MammothDualPrompt(checkout), settings)
