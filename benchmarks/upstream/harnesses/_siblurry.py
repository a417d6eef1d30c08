"""Import of KHU-AGI/Si-Blurry for the harnesses (in memory only; nothing of the checkout is reproduced).

At the documented commit ``models/mvp.py`` repeats an ``if`` header on two consecutive lines (the first
has no body), an IndentationError; ``models/__init__.py`` imports it, so nothing under ``models/`` or
``methods/`` imports. The module is loaded with the first of the two lines blanked (line numbers kept).
With that fix the MVP model's contrastive branch still reads a trainer attribute the model lacks, so
the harnesses run it with ``use_contrastiv=False``.
Third-party modules imported but unused here become stand-ins when missing: ``torch_optimizer``,
``randaugment``, ``pandas``. A tiny timm ViT is registered as ``fly_harness_tiny_timm`` (the models call
``timm.create_model(backbone_name, pretrained=True, ...)``; ``pretrained`` is ignored). The trainers'
per-batch replay loader is replaced by an empty list (``loading.replay_loader_off``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Sequence

from benchmarks.upstream.harnesses._flygcl import TINY_VIT
from benchmarks.upstream.loading import import_upstream, load_edited_module, replay_loader_off

BACKBONE = "fly_harness_tiny_timm"


def drop_repeated_header(lines: List[str]) -> List[str]:
    """Blank the first of two identical consecutive block headers (an ``if`` without a body)."""
    repeated = [i for i in range(len(lines) - 1) if lines[i].strip().endswith(":") and lines[i] == lines[i + 1]]
    if len(repeated) != 1:
        raise RuntimeError(f"models/mvp.py: expected one repeated block header, found {len(repeated)}; "
                           "is the checkout at the documented commit?")
    lines[repeated[0]] = "\n"
    return lines


def import_siblurry(checkout: Path, modules: Sequence[str]) -> List[str]:
    sys.path.insert(0, str(checkout))
    load_edited_module("models.mvp", checkout / "models" / "mvp.py", drop_repeated_header)
    stubs = import_upstream(checkout, ["models", *modules, "utils.train_utils", "utils.memory"],
                            allowed_stubs=["torch_optimizer", "randaugment", "pandas"])
    import timm
    from timm.models import register_model
    from timm.models.vision_transformer import VisionTransformer

    replay_loader_off(*(sys.modules[name] for name in modules if name.startswith("methods.")))
    if not timm.list_models(BACKBONE):
        @register_model
        def fly_harness_tiny_timm(pretrained=False, num_classes=1000, **kwargs):
            kwargs = {k: v for k, v in kwargs.items() if k in ("drop_rate", "drop_path_rate")}
            return VisionTransformer(**TINY_VIT, num_classes=num_classes, **kwargs)
    return stubs
