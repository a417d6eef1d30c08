"""Seq FT's pairing with FlyGCL's ``slca``: the whole ViT's map of tensors, the official model built as
``select_model`` builds it for ``slca`` (the checkout's ViT factory itself, its classifier ``fc`` the head),
and the official optimiser ``sgd_sl`` set up by the trainer's own ``reset_opt``."""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Dict, Iterator

from torch import nn

__all__ = ["OPTIMIZER", "build_official", "official_namespace", "setup_trainer", "vit_importable", "vit_weights"]

#: the official optimiser of both rows (``--opt_name``): Seq FT w/ SL is ``sgd_sl`` at 5e-5, Seq FT the same
#: optimiser at 0.005, where the backbone's rate equals the head's (docs/methods.md)
OPTIMIZER = "sgd_sl"

_BLOCK_TENSORS = ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")


def vit_weights(depth: int) -> Dict[str, str]:
    """Official name -> ours for every parameter of a ViT of ``depth`` blocks: the checkout's ViT has timm's
    names (ours under ``backbone.``), its classifier ``fc`` is our ``head``."""
    names = ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", "norm.weight", "norm.bias"]
    names += [f"blocks.{block}.{module}.{kind}" for block in range(depth) for module in _BLOCK_TENSORS
              for kind in ("weight", "bias")]
    return {**{name: f"backbone.{name}" for name in names}, "fc.weight": "head.weight", "fc.bias": "head.bias"}


@contextlib.contextmanager
def vit_importable(checkout: Any) -> Iterator[None]:
    """While open, ``import models.vit`` gives the checkout's module (``select_model``'s ``slca`` branch
    imports it when it builds the model); ``sys.modules`` as it was afterwards."""
    package = types.ModuleType("models", "the checkout's models package, as far as select_model imports it")
    package.vit = checkout.vit
    saved = {name: sys.modules.get(name) for name in ("models", "models.vit")}
    sys.modules.update({"models": package, "models.vit": checkout.vit})
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def official_namespace(checkout: Any) -> Dict[str, Any]:
    """``methods/_trainer.py``'s globals: the official ``select_model``, ``select_optimizer``, ... it imports."""
    return checkout.base_trainer.update_schedule.__globals__


def build_official(checkout: Any, backbone_name: str, num_classes: int) -> nn.Module:
    """The official ``select_model("slca", backbone_name, num_classes)``: the checkout's ViT factory
    ``backbone_name`` with dropout and drop-path 0 (its ``drop_block_rate=None`` is dropped by
    ``official.CopiedBackbone``: the checkout's ``VisionTransformer`` takes no such argument)."""
    with vit_importable(checkout):
        return official_namespace(checkout)["select_model"]("slca", backbone_name, num_classes)


def setup_trainer(trainer: Any) -> None:
    """The run's ``--opt_name sgd_sl --sched_name default`` (at the trainer's ``lr``), made by the official
    ``_Trainer.reset_opt``: its ``select_optimizer`` and ``select_scheduler``."""
    trainer.__dict__.update(opt_name=OPTIMIZER, sched_name="default", lr_gamma=0.9999)
    trainer.reset_opt()
