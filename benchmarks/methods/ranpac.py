"""RanPAC† on a frozen timm ViT, online (docs/methods.md, "RanPAC†"): in the first session, bottleneck
adapters beside the MLP of the first blocks and a linear head train on the stream; at the first session's
end both freeze, and a ridge classifier on a fixed random expansion of the adapted class token replaces the
head. The classifier is ``fly_modules.AnalyticRouter`` with one output per class: float64 statistics of
every later batch, added forward-only (no sample stored, none of the first session's), solved when an
evaluation reads them.
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Dict, List, Literal, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from fly_modules import AnalyticRouter
from fly_modules._validation import check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import MethodOutput, PromptMethod, QueryFeatures, register_method
from .prefix_attention import check_prefixable_backbone, class_token_pass, expert_block, resolve_prefix_layers
from .single_expert import SingleExpert
from .task_experts import TaskAdapter

__all__ = ["RanPAC", "RANPAC_ENSEMBLE_REFUSAL"]

#: Why the ensemble variants are skipped.
RANPAC_ENSEMBLE_REFUSAL = ("its head trains in the first session only and a ridge classifier replaces it after: "
                           "EMA copies would follow a frozen head that no prediction uses")


@register_method
class RanPAC(SingleExpert, PromptMethod):
    """RanPAC†: a first-session adaptation, then an analytic classifier on random expanded features.

    First session (``adapting``): every forward is the adapted pass (adapters in ``adapter_layers``) and the
    head on its final-norm class token; the adapters and the head train. At its end (``on_session_end``)
    both freeze for good and :meth:`trains_online` turns false: the loop runs one forward without gradients
    per batch, whose class token (of the batch the router's features come from, ``Protocol.router_query``)
    ``on_batch_end`` adds to ``classifier`` with the batch's labels as targets. At inference after the first
    session the scores are ``relu(h R^T) (G + ridge I)^-1 Q`` (computed in float64), the head's until the
    classifier has a sample.

    Args:
        backbone: a timm ``VisionTransformer`` with a class token; frozen here. Its own classifier is never used.
        num_classes: C.
        num_experts: 1, the only value.
        adapter_layers: the first n blocks (5, clamped to the depth) or explicit block indices.
        adapter_width: the adapters' bottleneck (64, the reference's).
        expansion_dim: M, the random expansion's width (the protocol's, 10,000 in the paper).
        ridge: the classifier's ridge (1e5, the reference's fixed value; a positive number or ``"auto"``).
        seed: seed of the random expansion.
        first_session_statistics: also add each first-session batch to the classifier, its class token
            computed after the batch's training steps, as FlyGCL's ``ranpac`` does (it collects them
            while the adapters still train). Off by default: the paper describes RanPAC† as keeping
            no feature of the first session.

    Attributes:
        adapter: ``TaskAdapter`` with one bank; head: ``nn.Linear(D, C, bias=False)``;
        classifier: ``AnalyticRouter(D, C)``; first_session_done: whether the adaptation is frozen.
    """

    name: ClassVar[str] = "ranpac"
    session_aware: ClassVar[bool] = True
    default_lr: ClassVar[float] = 0.005
    ensemble_refusal: ClassVar[str] = RANPAC_ENSEMBLE_REFUSAL

    @classmethod
    def protocol_kwargs(cls, protocol: Any, *, seed: int, backbone: nn.Module, num_classes: int) -> Dict[str, Any]:
        """The protocol's expansion width and the run's seed; one expert whatever ``num_experts`` says."""
        kwargs = dict(protocol.method_kwargs.get(cls.name, {}))
        kwargs.setdefault("expansion_dim", protocol.expansion_dim)
        kwargs.setdefault("seed", seed)
        return kwargs

    def __init__(
        self, backbone: nn.Module, num_classes: int, *, num_experts: int = 1,
        adapter_layers: Union[int, Sequence[int]] = 5, adapter_width: int = 64, expansion_dim: int = 10_000,
        ridge: Union[float, Literal["auto"]] = 1e5, seed: int = 0, first_session_statistics: bool = False,
    ) -> None:
        super().__init__()
        caller = type(self).__name__
        self.num_classes = check_int(num_classes, "num_classes", caller=caller, minimum=1)
        if num_experts != 1:
            raise ValueError(f"{caller}: one classifier, one expert; num_experts must be 1, found {num_experts!r}")
        self.num_experts, self.current_expert = 1, 0
        self.first_session_done = False
        if not isinstance(first_session_statistics, bool):
            raise TypeError(f"{caller}: first_session_statistics must be True or False, found {first_session_statistics!r}")
        self.first_session_statistics = first_session_statistics
        self.backbone = backbone
        backbone.requires_grad_(False)
        backbone.eval()
        self.adapter_layers = resolve_prefix_layers(adapter_layers, len(backbone.blocks))
        check_prefixable_backbone(backbone, self.adapter_layers)
        self._slot_of_layer: Dict[int, int] = {layer: s for s, layer in enumerate(self.adapter_layers)}
        ref = next(backbone.parameters())
        dd = {"device": ref.device, "dtype": ref.dtype}
        self.embed_dim = self.router_dim = int(getattr(backbone, "embed_dim", None) or backbone.num_features)
        width = check_int(adapter_width, "adapter_width", caller=caller, minimum=1)
        self.adapter = TaskAdapter(self.adapter_layers, 1, self.embed_dim, width, dd)
        self.head = nn.Linear(self.embed_dim, self.num_classes, bias=False, **dd)
        self.classifier = AnalyticRouter(self.embed_dim, self.num_classes, expansion_dim=expansion_dim, ridge=ridge,
                                         seed=seed, device=dd["device"])

    def extra_repr(self) -> str:
        return (f"num_classes={self.num_classes}, adapter_layers={self.adapter_layers}, "
                f"adapter_width={self.adapter.width}, first_session_done={self.first_session_done}, "
                f"first_session_statistics={self.first_session_statistics}")

    def get_extra_state(self) -> Any:
        return {"first_session_done": bool(self.first_session_done)}

    def set_extra_state(self, state: Any) -> None:
        self.first_session_done = bool(state["first_session_done"])
        self._sync_trainable()

    # -------------------------------------------------------------------------------- seams
    def adapted_cls(self, x: Tensor) -> Tensor:
        """The final-norm class token ``(B, D)`` of the pass with the adapters (gradients as the caller's mode)."""
        adapters = self.adapter.gathered(0)
        return class_token_pass(self.backbone, x, self._slot_of_layer, lambda block, tokens, slot: expert_block(
            block, tokens, beside_mlp=partial(adapters.output, slot)))

    @torch.no_grad()
    def compute_query(self, x: Tensor) -> QueryFeatures:
        """The adapted class token, without gradients: the classifier's and the router's features."""
        cls = self.adapted_cls(x)
        return QueryFeatures(query=cls, router=cls)

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        return self.adapted_cls(x)

    def forward(
        self, x: Tensor, *, expert: Optional[Tensor] = None, query: Optional[QueryFeatures] = None,
        parallel: BatchShare = WHOLE_BATCH,
    ) -> MethodOutput:
        """One adapted pass: with gradients while the first session trains, else the query's class token."""
        if self.training and not self.first_session_done:
            features = self.adapted_cls(x)
            if query is None:
                query = QueryFeatures(query=features.detach(), router=features.detach())
        else:
            if query is None:
                query = self.compute_query(x)
            features = query.query
        selection = self.select(query.query, train=self.training, expert=expert)
        return MethodOutput(self.scores(features), features, query, selection, selection, features.new_zeros(()))

    def scores(self, features: Tensor) -> Tensor:
        """``(B, C)`` class scores: at inference after the first session the ridge classifier's (solved in float64
        if its statistics changed, in the features' dtype, whose precision they have), else the head's. A
        training forward never solves: after the first session its scores are only reported."""
        if self.training or not self.first_session_done or self.classifier.num_samples == 0:
            return self.head(features)
        return self.classifier(features).to(features.dtype)

    def trainable_parameters(self) -> List[nn.Parameter]:
        """The adapters and the head (frozen, without gradients, after the first session)."""
        return [*self.adapter.parameters(), *self.head.parameters()]

    # -------------------------------------------------------------------------------- hooks
    def trains_online(self) -> bool:
        return not self.first_session_done

    def on_session_end(self, session: int) -> None:
        """The first session's end freezes the adapters and the head."""
        self.first_session_done = True
        self._sync_trainable()

    def on_batch_end(self, x: Tensor, y: Tensor, output: MethodOutput, parallel: BatchShare = WHOLE_BATCH) -> None:
        """After the first session (and in it with ``first_session_statistics``, from a pass after the batch's
        training steps): the batch's class tokens (all processes' rows) and labels into the classifier."""
        if self.first_session_done:
            self.classifier.update(parallel.gather_rows(output.query.router), parallel.gather_rows(y))
        elif self.first_session_statistics:
            self.classifier.update(parallel.gather_rows(self.compute_query(x).router), parallel.gather_rows(y))

    def _sync_trainable(self) -> None:
        for parameter in self.trainable_parameters():
            parameter.requires_grad_(not self.first_session_done)
            if self.first_session_done:
                parameter.grad = None
