"""The shared setting of a fidelity comparison: one tiny ViT, one short Si-Blurry stream, one seed, and
the training settings of the official launch scripts that a CPU can afford (docs/verification.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from benchmarks.core.protocol import Protocol
from benchmarks.core.reference_checkout import VIT_PRESETS
from benchmarks.data import make_synthetic_train_test

__all__ = ["Setting", "TIMM_MODEL"]

#: the timm architecture both sides' backbones take their shape from (the official code's ViT)
TIMM_MODEL = "vit_tiny_patch16_224"


@dataclass(frozen=True)
class Setting:
    """What both sides train on.

    ``vit`` is the shape of the backbone (``benchmarks.core.reference_checkout.VIT_PRESETS``); the
    generated data set has ``classes`` classes of ``train_per_class`` / ``test_per_class`` images, the
    stream ``num_sessions`` sessions of batches of ``batch_size``, each trained ``online_iter`` times.
    No augmentation and no mixed precision: both sides see bit-identical batches in fp32.
    ``explicit_attention=False`` keeps timm's fused attention kernel on our side.
    """

    vit: str = "micro"
    classes: int = 6
    train_per_class: int = 40
    test_per_class: int = 8
    batch_size: int = 16
    online_iter: int = 3
    num_sessions: int = 3
    num_experts: int = 3
    eval_period: int = 32
    seed: int = 1
    expansion_dim: int = 64   # the router's M (FlyPrompt; both sides)
    ridge: float = 1e2
    lr: Optional[float] = None  # ours; None: the method's default (the official side's is the pair's)
    # timm's attention as the official ViT computes it (softmax(q k^T) v, no fused kernel): the frozen
    # backbone's arithmetic is then the same on both sides, and what differs is the methods'.
    explicit_attention: bool = True
    method_kwargs: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    @property
    def shape(self) -> Dict[str, int]:
        return dict(VIT_PRESETS[self.vit])

    def protocol(self) -> Protocol:
        """The cross-ablation protocol of our side (fp32, no augmentation, default learning rates)."""
        return Protocol(
            model=TIMM_MODEL, model_kwargs=self.shape, pretrained=False, image_size=self.shape["img_size"],
            batch_size=self.batch_size, online_iter=self.online_iter, eval_period=self.eval_period,
            test_batch_size=64, num_sessions=self.num_sessions, num_experts=self.num_experts,
            expansion_dim=self.expansion_dim, ridge=self.ridge, lr=self.lr, amp=False, augment=False, method_kwargs=dict(self.method_kwargs),
        )

    def data(self) -> Tuple[Any, Any]:
        """``(train, test)``: generated images at the backbone's input size."""
        return make_synthetic_train_test(
            self.classes, train_per_class=self.train_per_class, test_per_class=self.test_per_class, seed=0,
            image_size=self.shape["img_size"],
        )
