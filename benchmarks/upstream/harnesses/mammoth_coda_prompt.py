"""aimagelab/mammoth CODA-Prompt: every family must refuse it (see ``_coda.py``).

Real classes: ``models.coda_prompt.CodaPrompt`` (ContinualModel: ``begin_task`` / ``observe`` /
``forward``), ``models.coda_prompt_utils.model.Model`` and ``.CodaPrompt``,
``models.coda_prompt_utils.vit.VisionTransformer``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings
from benchmarks.upstream.harnesses import _coda, _mammoth
from benchmarks.upstream.harnesses._flygcl import TINY_VIT


def run(checkout: Path, settings: Settings):
    stubs = _mammoth.import_mammoth(checkout, ["models.coda_prompt", "models.coda_prompt_utils.model",
                                               "models.coda_prompt_utils.vit"])
    from models.coda_prompt import CodaPrompt as CodaContinualModel
    from models.coda_prompt_utils.model import CodaPrompt, Model
    from models.coda_prompt_utils.vit import VisionTransformer

    torch.manual_seed(settings.seed)
    net = object.__new__(Model)
    torch.nn.Module.__init__(net)
    net.task_id = None
    net.feat = VisionTransformer(**TINY_VIT, drop_path_rate=0)
    net.last = torch.nn.Linear(32, 4)
    net.prompt = CodaPrompt(**_coda.CODA_PROMPT)
    args = _mammoth.base_args(lr=1e-3, mu=0.0, virtual_bs_iterations=1, n_epochs=2, lr_scheduler=None)
    model = _mammoth.continual_model(CodaContinualModel, net, args)
    net.task_id = 0
    model.opt = model.get_optimizer()
    model.begin_task(None)

    def train_step(x, y):
        model.train()
        return f"{model.observe(x, y, x):.4f}"

    def evaluate(x, y):
        model.eval()
        with torch.no_grad():
            return model(x)

    return _coda.run_probe("mammoth / CODA-Prompt", dict(stubbed_modules=stubs or "none"), settings, net,
                           train_step, evaluate, "mammoth's own observe() and forward()")
