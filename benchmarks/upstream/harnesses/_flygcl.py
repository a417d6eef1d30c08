"""Import of AnAppleCore/FlyGCL for the harnesses.

In memory only: a builder ``fly_harness_tiny`` is added to the checkout's ``models.vit`` (the models
pick ``getattr(models.vit, backbone_name)(pretrained=True, num_classes=...)``); it returns the
checkout's own ``models.vit.VisionTransformer`` at the harness size with random weights. ``pandas``
(imported by the trainer modules, unused here) becomes a stand-in when missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence

from benchmarks.upstream.loading import import_upstream
from benchmarks.upstream.stream import IMAGE_SIZE

BACKBONE = "fly_harness_tiny"
TINY_VIT = dict(img_size=IMAGE_SIZE, patch_size=8, embed_dim=32, depth=5, num_heads=2)


def import_flygcl(checkout: Path, modules: Sequence[str]) -> List[str]:
    stubs = import_upstream(checkout, ["models.vit", *modules, "utils.train_utils"], allowed_stubs=["pandas"])
    import models.vit as vit

    def tiny_vit(pretrained=False, num_classes=1000, **kwargs):
        return vit.VisionTransformer(**TINY_VIT, num_classes=num_classes)

    setattr(vit, BACKBONE, tiny_vit)
    return stubs
