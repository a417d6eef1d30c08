"""The official side: a checkout's model built on a copy of our backbone's weights, trained by the
checkout's own trainer (``online_step`` per stream batch, ``online_after_task`` per session end)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor, nn

from benchmarks.core import reference_checkout as ref

from .pairs import MethodPair
from .setting import Setting

__all__ = ["BACKBONE_NAME", "CopiedBackbone", "OfficialSide", "official_backbone_state"]

BACKBONE_NAME = "fidelity_vit"  # what the official model asks models.vit for, while it is built


def official_backbone_state(timm_backbone: nn.Module) -> Dict[str, Tensor]:
    """Our timm backbone's weights under the official ViT's names (its classifier is ``fc``, the
    method's head, which is copied separately; timm's is unused and left out)."""
    return {name: tensor for name, tensor in timm_backbone.state_dict().items() if not name.startswith("head.")}


class CopiedBackbone:
    """What ``models.vit.<BACKBONE_NAME>`` is while an official model is built: the checkout's own
    ``VisionTransformer`` in the setting's shape, loaded with our backbone's weights."""

    def __init__(self, checkout: ref.Checkout, setting: Setting, backbone: nn.Module) -> None:
        self.vision_transformer, self.shape = checkout.vit.VisionTransformer, setting.shape
        self.state = official_backbone_state(backbone)

    def __call__(self, pretrained: bool = False, **kwargs: Any) -> nn.Module:
        # select_model's slca branch passes drop_block_rate=None, which the checkout's ViT does not take
        # (its own factories raise TypeError on it; timm's create_model drops None-valued options)
        if kwargs.get("drop_block_rate", 0) is None:
            del kwargs["drop_block_rate"]
        vit = self.vision_transformer(**self.shape, **kwargs)
        missing, unexpected = vit.load_state_dict(self.state, strict=False)
        if unexpected or [name for name in missing if not name.startswith("fc.")]:
            raise ValueError(
                f"the official ViT does not take our backbone's weights: missing {missing}, unexpected {unexpected}"
            )
        return vit


class OfficialSide:
    """One official model and its trainer, set up as ``_Trainer``'s run would set them up for one GPU."""

    def __init__(
        self, checkout: ref.Checkout, pair: MethodPair, setting: Setting, backbone: nn.Module, *,
        num_classes: int, train_samples: int, lr: float,
    ) -> None:
        self.pair = pair
        self.model = self._build(checkout, pair, setting, backbone, num_classes)
        trainer = ref.make_trainer(
            checkout, pair.official, self.model, device=torch.device("cpu"), amp=False, lr=lr,
            num_classes=num_classes, num_experts=setting.num_experts,
            samples_per_step=max(1, train_samples // setting.num_experts),
        )
        # A run starts with no class exposed; online_step exposes them as they stream in.
        trainer.__dict__.update(
            exposed_classes=[], mask=torch.full((num_classes,), float("-inf")), online_iter=setting.online_iter,
            distributed=False,
        )
        if pair.setup_trainer is not None:
            pair.setup_trainer(trainer)
        self.trainer = trainer

    @staticmethod
    def _build(
        checkout: ref.Checkout, pair: MethodPair, setting: Setting, backbone: nn.Module, num_classes: int
    ) -> nn.Module:
        with ref.backbone_factory(checkout, BACKBONE_NAME, CopiedBackbone(checkout, setting, backbone)):
            if pair.build_official is not None:
                return pair.build_official(checkout, BACKBONE_NAME, num_classes)
            return checkout.models[pair.official](
                backbone_name=BACKBONE_NAME, pretrained=True, num_classes=num_classes,
                task_num=setting.num_experts, rp_dim=setting.expansion_dim, rp_ridge=setting.ridge,
                **pair.official_kwargs,
            )

    def trainable(self) -> Dict[str, nn.Parameter]:
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}

    def stream_batch(self, images: Tensor, labels: Tensor) -> None:
        """The trainer's own per-batch entry (exposure, online iterations, router rows, steps)."""
        self.trainer.online_step(images.clone(), labels.clone(), None)

    def session_end(self, session: int) -> None:
        if self.pair.session_end_seed is not None:
            torch.manual_seed(self.pair.session_end_seed + session)
        self.trainer.online_after_task(session)

    @torch.no_grad()
    def predict(self, images: Tensor) -> "tuple[Tensor, Optional[Tensor]]":
        """``(scores, selection)``: the official inference (online head + seen-class mask) and the
        selection of that forward."""
        if self.pair.official_predict is not None:
            return self.pair.official_predict(self.trainer, images)
        self.model.eval()
        saved = {name: getattr(self.model, name) for name in self.pair.selection_attributes}
        self.model.__dict__.update(self.pair.selection_attributes)
        try:
            scores = self.model(images) + self.trainer.mask
            selection = self.pair.official_selection(self.model)
        finally:
            self.model.__dict__.update(saved)
        return scores, None if selection is None else selection.clone()

    def state(self) -> Dict[str, Tensor]:
        return dict(self.model.state_dict(keep_vars=True))
