"""LAMDA-PILOT CODA-Prompt: every family must refuse it (see ``_coda.py``).

Real classes: ``models.coda_prompt.Learner`` (``_init_train``, ``_eval_cnn``), ``utils.inc_net.CodaPromptVitNet``,
``backbone.prompt.CodaPrompt``, ``backbone.vit_coda_promtpt.VisionTransformer``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings
from benchmarks.upstream.harnesses import _coda, _pilot
from benchmarks.upstream.harnesses._flygcl import TINY_VIT


def run(checkout: Path, settings: Settings):
    stubs = _pilot.import_pilot(checkout, ["backbone.vit_coda_promtpt", "backbone.prompt", "utils.inc_net",
                                           "models.coda_prompt"])
    from backbone.prompt import CodaPrompt
    from backbone.vit_coda_promtpt import VisionTransformer
    from models.base import BaseLearner
    from models.coda_prompt import Learner
    from utils.inc_net import CodaPromptVitNet

    torch.manual_seed(settings.seed)
    net = object.__new__(CodaPromptVitNet)
    torch.nn.Module.__init__(net)
    net.backbone = VisionTransformer(**TINY_VIT)
    net.fc = torch.nn.Linear(32, 4)
    net.prompt = CodaPrompt(**_coda.CODA_PROMPT)
    learner = object.__new__(Learner)
    BaseLearner.__init__(learner, _pilot.base_args(init_lr=1e-3, tuned_epoch=1))
    learner.topk = 1
    learner._network, learner.init_lr, learner.weight_decay = net, 1e-3, 0
    learner._cur_task, learner._known_classes, learner._total_classes = 0, 0, 2
    learner.data_weighting()

    def train_step(x, y):
        learner._init_train([(None, x, y)], None, learner.get_optimizer(), None)
        return "not kept"

    def evaluate(x, y):
        learner._eval_cnn([(None, x, y)])

    return _coda.run_probe("LAMDA-PILOT / CODA-Prompt", dict(stubbed_modules=stubs or "none"), settings, net,
                           train_step, evaluate, "PILOT's own _init_train() and _eval_cnn()")
