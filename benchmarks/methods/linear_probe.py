"""The linear probe on a frozen timm ViT: a trainable linear head on the frozen backbone's final-norm class
token, trained online with the loop's loss and logit masks (docs/methods.md, "Linear probe"). It has one
head and no experts; its ``ensemble`` variant is the linear probe with EMA heads of the paper's components
table.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, Optional

from torch import Tensor, nn

from fly_modules._validation import check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import MethodOutput, PromptMethod, QueryFeatures, frozen_cls, register_method
from .single_expert import SingleExpert

__all__ = ["LinearProbe"]

@register_method
class LinearProbe(SingleExpert, PromptMethod):
    """A linear head on the frozen final-norm class token: one backbone pass per forward, whose class token
    is both the query (the router's features) and the head's input.

    Args:
        backbone: a timm ``VisionTransformer`` with a class token; frozen here. Its own classifier is never used.
        num_classes: C, the head's outputs.
        num_experts: 1, the only value (the protocol's number of experts is not the probe's).

    Attributes:
        head: ``nn.Linear(D, C)``, the only trained module; embed_dim, router_dim: D.
    """

    name: ClassVar[str] = "linear-probe"
    session_aware: ClassVar[bool] = False
    default_lr: ClassVar[float] = 0.005

    @classmethod
    def protocol_kwargs(cls, protocol: Any, *, seed: int, backbone: nn.Module, num_classes: int) -> Dict[str, Any]:
        """The protocol's ``method_kwargs`` for the probe only: it has one expert whatever ``num_experts`` says."""
        return dict(protocol.method_kwargs.get(cls.name, {}))

    def __init__(self, backbone: nn.Module, num_classes: int, *, num_experts: int = 1) -> None:
        super().__init__()
        caller = type(self).__name__
        self.num_classes = check_int(num_classes, "num_classes", caller=caller, minimum=1)
        if num_experts != 1:
            raise ValueError(f"{caller}: one head, one expert; num_experts must be 1, found {num_experts!r}")
        self.num_experts, self.current_expert = 1, 0
        self.backbone = backbone
        backbone.requires_grad_(False)
        backbone.eval()
        ref = next(backbone.parameters())
        self.embed_dim = self.router_dim = int(getattr(backbone, "embed_dim", None) or backbone.num_features)
        self.head = nn.Linear(self.embed_dim, self.num_classes, device=ref.device, dtype=ref.dtype)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}"

    # -------------------------------------------------------------------------------- seams
    def frozen_features(self, x: Tensor) -> Tensor:
        """The frozen final-norm class token ``(B, D)``: the query, the router's features and the head's input."""
        return frozen_cls(self.backbone, x)

    def query_from_frozen(self, cls: Tensor) -> QueryFeatures:
        return QueryFeatures(query=cls, router=cls)

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        return frozen_cls(self.backbone, x)

    def forward(
        self, x: Tensor, *, expert: Optional[Tensor] = None, query: Optional[QueryFeatures] = None,
        parallel: BatchShare = WHOLE_BATCH,
    ) -> MethodOutput:
        """The head on the query pass's class token: the frozen pass runs once (not again as a prompted pass)."""
        if query is None:
            query = self.compute_query(x)
        selection = self.select(query.query, train=self.training, expert=expert)
        features = query.query
        return MethodOutput(self.head(features), features, query, selection, selection, features.new_zeros(()))
