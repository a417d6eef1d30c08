"""Seq FT's pairing with FlyGCL's ``slca``: the whole ViT's map of tensors, the official model built as
``select_model`` builds it for ``slca`` (the checkout's ViT factory itself, its classifier ``fc`` the head),
and the official optimiser ``sgd_sl`` set up by the trainer's own ``reset_opt``."""

from __future__ import annotations

from typing import Any, Dict

from torch import nn

__all__ = ["OPTIMIZER", "build_official", "setup_trainer", "vit_weights"]

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


def build_official(checkout: Any, backbone_name: str, num_classes: int) -> nn.Module:
    """``select_model``'s ``slca`` branch: the checkout's ViT factory ``backbone_name`` with dropout and
    drop-path 0. Its ``drop_block_rate=None`` is left out: the checkout's ``VisionTransformer`` takes no such
    argument (called with it, as ``select_model`` calls it, the build raises ``TypeError`` under timm 1.0)."""
    factory = getattr(checkout.vit, backbone_name)
    return factory(pretrained=True, num_classes=num_classes, drop_rate=0.0, drop_path_rate=0.0)


def setup_trainer(trainer: Any) -> None:
    """The run's ``--opt_name sgd_sl --sched_name default`` (at the trainer's ``lr``), made by the official
    ``_Trainer.reset_opt``: its ``select_optimizer`` and ``select_scheduler``."""
    trainer.__dict__.update(opt_name=OPTIMIZER, sched_name="default", lr_gamma=0.9999)
    trainer.reset_opt()
