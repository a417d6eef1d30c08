"""Sequential fine-tuning of a timm ViT (docs/methods.md, "Seq FT and Seq FT w/ SL"): every parameter of the
backbone and a linear head on its final-norm class token train on the stream, by plain SGD with weight decay
and two learning rates, the backbone's (the run's) and the head's. ``seq-ft-sl`` is the slow learner: the
backbone's rate 100 times below the head's. One head, no experts: a router has nothing to choose.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Optional

import torch
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError, check_float, check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import MethodOutput, PromptMethod, QueryFeatures, register_method
from .prompting import new_head
from .single_expert import SingleExpert

__all__ = ["SeqFT", "SeqFTSlowLearner", "SEQ_FT_HEAD_LR", "SEQ_FT_WEIGHT_DECAY"]

#: the head's learning rate, whatever the run's (the official ``sgd_sl`` optimiser's constant)
SEQ_FT_HEAD_LR = 0.005
#: SGD's weight decay on every parameter, head included (``sgd_sl``'s)
SEQ_FT_WEIGHT_DECAY = 5e-4


@register_method
class SeqFT(SingleExpert, PromptMethod):
    """Seq FT: the whole ViT and a linear head fine-tuned online, one pass per forward.

    The optimiser (:meth:`make_optimizer`) is SGD without momentum, weight decay ``weight_decay`` on every
    parameter, two groups: the backbone at the run's learning rate (``default_lr``: 0.005 here, 5e-5 for
    the slow learner ``seq-ft-sl``) and the head at ``head_lr``. The backbone stays in eval mode, as every
    method's here: with no dropout or drop-path (FlyGCL builds its ViT with both at 0) the two modes
    compute the same.

    Args:
        backbone: a timm ``VisionTransformer`` with a class token; trained here (``requires_grad`` on).
            Its own classifier is never used.
        num_classes: C, the head's outputs.
        num_experts: 1, the only value.
        head_lr: the head's learning rate (0.005, FlyGCL's ``sgd_sl``).
        weight_decay: SGD's weight decay on every parameter (5e-4, ``sgd_sl``'s).

    Attributes:
        head: ``nn.Linear(D, C)``, trunc-normal(0.02) weights and zero bias, as FlyGCL's ViT initialises its
        ``fc``; embed_dim, router_dim: D.
    """

    name: ClassVar[str] = "seq-ft"
    session_aware: ClassVar[bool] = False
    default_lr: ClassVar[float] = 0.005

    @classmethod
    def protocol_kwargs(cls, protocol: Any, *, seed: int, backbone: nn.Module, num_classes: int) -> Dict[str, Any]:
        """The protocol's ``method_kwargs`` for the method only: one expert whatever ``num_experts`` says."""
        return dict(protocol.method_kwargs.get(cls.name, {}))

    @classmethod
    def protocol_notes(cls, protocol: Any) -> str:
        if protocol.lr is None or protocol.lr == cls.default_lr:
            return ""
        head_lr = protocol.method_kwargs.get(cls.name, {}).get("head_lr", SEQ_FT_HEAD_LR)
        return f"--lr {protocol.lr:g} is the backbone's learning rate (default {cls.default_lr:g}); the head's is {head_lr:g}"

    def __init__(
        self, backbone: nn.Module, num_classes: int, *, num_experts: int = 1, head_lr: float = SEQ_FT_HEAD_LR,
        weight_decay: float = SEQ_FT_WEIGHT_DECAY,
    ) -> None:
        super().__init__()
        caller = type(self).__name__
        self.num_classes = check_int(num_classes, "num_classes", caller=caller, minimum=1)
        if num_experts != 1:
            raise ValueError(f"{caller}: one head, one expert; num_experts must be 1, found {num_experts!r}")
        self.head_lr = check_float(head_lr, "head_lr", caller=caller, above=0.0)
        self.weight_decay = check_float(weight_decay, "weight_decay", caller=caller)
        if self.weight_decay < 0:
            raise InvalidParameterError(f"{caller}: weight_decay must be >= 0, got {weight_decay!r}")
        self.num_experts, self.current_expert = 1, 0
        self.backbone = backbone
        backbone.requires_grad_(True)
        backbone.eval()
        self.embed_dim = self.router_dim = int(getattr(backbone, "embed_dim", None) or backbone.num_features)
        self.head = new_head(self.embed_dim, self.num_classes, like=next(backbone.parameters()))

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, head_lr={self.head_lr}, weight_decay={self.weight_decay}"

    # -------------------------------------------------------------------------------- seams
    def class_token(self, x: Tensor) -> Tensor:
        """The final-norm class token ``(B, D)`` of the (trained) backbone, with gradients as the caller's mode."""
        return self.backbone.forward_features(x)[:, 0]

    @torch.no_grad()
    def compute_query(self, x: Tensor) -> QueryFeatures:
        """The class token of the backbone as it is now, without gradients: the head's input at inference and
        the features a router or ensemble would read. It depends on trained weights, so it is never cached."""
        cls = self.class_token(x)
        return QueryFeatures(query=cls, router=cls)

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        return self.class_token(x)

    def forward(
        self, x: Tensor, *, expert: Optional[Tensor] = None, query: Optional[QueryFeatures] = None,
        parallel: BatchShare = WHOLE_BATCH,
    ) -> MethodOutput:
        """One backbone pass: with gradients in training (its detached class token is the query), else the
        query's class token (``query`` given or computed)."""
        if self.training:
            features = self.class_token(x)
            if query is None:
                query = QueryFeatures(query=features.detach(), router=features.detach())
        else:
            if query is None:
                query = self.compute_query(x)
            features = query.query
        selection = self.select(query.query, train=self.training, expert=expert)
        return MethodOutput(self.head(features), features, query, selection, selection, features.new_zeros(()))

    def backbone_parameters(self) -> List[nn.Parameter]:
        return [p for p in self.backbone.parameters() if p.requires_grad]

    def trainable_parameters(self) -> List[nn.Parameter]:
        """The backbone's parameters, then the head's."""
        return [*self.backbone_parameters(), *self.head.parameters()]

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        """SGD, no momentum, ``weight_decay`` on all: the backbone at ``lr``, the head at ``head_lr``."""
        return torch.optim.SGD(
            [{"params": self.backbone_parameters(), "lr": lr}, {"params": list(self.head.parameters()), "lr": self.head_lr}],
            lr=lr, weight_decay=self.weight_decay,
        )


@register_method
class SeqFTSlowLearner(SeqFT):
    """Seq FT w/ SL: :class:`SeqFT` with the slow learner's backbone learning rate, 5e-5 (FlyGCL's
    ``scripts/run_baselines.sh``, "Seq FT (SL)": ``slca`` with ``sgd_sl`` at 5e-5); the head's stays 0.005."""

    name: ClassVar[str] = "seq-ft-sl"
    default_lr: ClassVar[float] = 5e-5
