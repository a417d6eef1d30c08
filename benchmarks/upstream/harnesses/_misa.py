"""Import of kangzhiq/MISA for the harnesses (in memory only).

A tiny ViT of the checkout's own ``models.vit.VisionTransformer`` is registered in timm as
``fly_harness_tiny_misa`` (the models call ``timm.create_model(backbone_name, pretrained=True, ...)``;
``pretrained`` is ignored). ``pandas`` and ``sklearn`` (imported by the trainer modules, unused here)
become stand-ins when missing. ``MVP.__init__`` reads a module global ``load`` that the module never
defines (a NameError at the documented commit): it is defined as ``False``. The trainers' per-batch
replay loader is replaced by an empty list (``loading.replay_loader_off``). The models open a
tensorboard writer on import: the harness runs in a temporary working folder.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Sequence

from benchmarks.upstream.harnesses._flygcl import TINY_VIT
from benchmarks.upstream.loading import import_upstream, replay_loader_off

BACKBONE = "fly_harness_tiny_misa"


def import_misa(checkout: Path, modules: Sequence[str]) -> List[str]:
    stubs = import_upstream(checkout, ["models.vit", "models.mvp", *modules, "utils.train_utils", "utils.memory"],
                            allowed_stubs=["pandas", "sklearn"])
    import models.mvp
    import models.vit as vit
    import timm
    from timm.models import register_model

    models.mvp.load = False
    replay_loader_off(*(sys.modules[name] for name in modules if name.startswith("methods.")))
    if not timm.list_models(BACKBONE):
        @register_model
        def fly_harness_tiny_misa(pretrained=False, num_classes=1000, **kwargs):
            return vit.VisionTransformer(**TINY_VIT, num_classes=num_classes)
    return stubs
