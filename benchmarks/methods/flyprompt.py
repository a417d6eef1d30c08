"""FlyPrompt on a frozen timm ViT (docs/protocol.md §3), composed from ``fly_modules``: expert prompts,
the analytic router on the query pass's features and the temporal-ensemble head, all trained by the
method's own hooks (``builtin_components``). Decisions on the reference's quirks: docs/methods.md.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Literal, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from fly_modules import AnalyticRouter, TemporalEnsembleHead
from fly_modules._validation import check_int, shared_default

from ..parallel import WHOLE_BATCH, BatchShare
from .base import MethodOutput, register_method
from .prompting import ExpertPromptMethod, resolve_layers

__all__ = ["FlyPrompt"]


@register_method
class FlyPrompt(ExpertPromptMethod):
    """FlyPrompt: expert prompts + analytic router + temporal-ensemble head.

    Args:
        backbone: frozen timm ViT.
        num_classes: classifier outputs.
        num_experts: experts (default 5).
        prompt_layers: block positions (default (0, 1, 2, 3, 4), clamped to the backbone depth).
        prompt_length: tokens per expert and layer (20).
        router_expansion_dim: random expansion width ``M`` of the router (10,000).
        router_ridge: ridge ``lambda`` (1e4; a positive number or ``"auto"``).
        router_seed: seed of the router's random expansion.
        decays: EMA decays of the ensemble copies ((0.9, 0.99)).
        aggregate: ensemble rule (``"softmax_max"``).

    Attributes:
        prompts: ``(len(prompt_layers), num_experts, prompt_length, D)`` parameter.
        router: the ``AnalyticRouter`` (``num_experts`` outputs).
        ensemble: the ``TemporalEnsembleHead`` around ``head`` (``ensemble.online is head``).
    """

    name = "flyprompt"
    session_aware = False
    default_lr = 0.005
    builtin_components = True

    @classmethod
    def protocol_kwargs(cls, protocol: Any, *, seed: int, backbone: nn.Module, num_classes: int) -> Dict[str, Any]:
        kwargs = super().protocol_kwargs(protocol, seed=seed, backbone=backbone, num_classes=num_classes)
        kwargs.setdefault("router_seed", seed)  # the expansion R differs per seed, as in the reference
        kwargs.setdefault("router_expansion_dim", protocol.expansion_dim)
        kwargs.setdefault("router_ridge", protocol.ridge)
        kwargs.setdefault("decays", protocol.decays)
        kwargs.setdefault("aggregate", protocol.aggregate)
        return kwargs

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        *,
        num_experts: int = 5,
        prompt_layers: Optional[Iterable[int]] = None,
        prompt_length: int = 20,
        router_expansion_dim: int = shared_default("expansion_dim"),
        router_ridge: Union[float, Literal["auto"]] = shared_default("ridge"),
        router_seed: int = shared_default("seed"),
        decays: Sequence[float] = shared_default("decays"),
        aggregate: str = shared_default("aggregate"),
    ) -> None:
        super().__init__(backbone, num_classes, num_experts=num_experts)
        prompt_length = check_int(prompt_length, "prompt_length", caller="FlyPrompt", minimum=1)
        self.prompt_layers = resolve_layers(prompt_layers, self.depth, default=(0, 1, 2, 3, 4), what="FlyPrompt prompt")
        self.prompt_length = int(prompt_length)
        factory = self._factory()
        self.prompts = nn.Parameter(
            torch.rand(len(self.prompt_layers), self.num_experts, self.prompt_length, self.embed_dim, **factory)
        )
        self.router = AnalyticRouter(
            self.embed_dim,
            self.num_experts,
            expansion_dim=router_expansion_dim,
            ridge=router_ridge,
            seed=router_seed,
            device=factory["device"],
        )
        self.ensemble = TemporalEnsembleHead(self.head, self.num_experts, decays=decays, aggregate=aggregate)

    # ------------------------------------------------------------------------------- seams
    def route(self, router_features: Tensor) -> Tensor:
        """``(B,)`` routed experts among those with router samples (``current_expert`` before any)."""
        if self.router.num_samples == 0:
            batch, device = router_features.shape[0], router_features.device
            return torch.full((batch,), self.current_expert, dtype=torch.long, device=device)
        return self.router.route(router_features).to(router_features.device)

    def common_features(self, x: Tensor) -> Tensor:
        """The prompt-free final-norm class token: every parameter FlyPrompt's experts share is the frozen
        backbone's (the CKA study's common representation)."""
        return self._prompted_cls(x, {})

    @torch.no_grad()
    def predict(self, x: Tensor, logit_mask: Optional[Tensor] = None) -> Tensor:
        """Routed prompted pass + temporal ensemble of the routed experts' heads, mask on each member."""
        query = self.compute_query(x)
        expert = self.route(query.router)
        features = self.forward_features(x, expert)
        return self.ensemble(features, expert, logit_mask)

    # ------------------------------------------------------------------------------- hooks
    def on_expert_start(self, expert: int) -> None:
        expert = int(expert)
        new = 0 <= expert < self.num_experts and not bool(self.expert_started[expert])
        earlier = self.expert_started[:expert].clone() if new else None
        super().on_expert_start(expert)
        if not new:
            self.ensemble.active_expert = expert
            return
        with torch.no_grad():
            if expert > 0 and bool(earlier.any()):
                self.prompts[:, expert] = self.prompts[:, :expert][:, earlier].mean(dim=1)
        self.ensemble.start_expert(expert)

    def on_optimizer_step(self, output: MethodOutput) -> None:
        self.ensemble.update()

    def on_batch_end(self, x: Tensor, y: Tensor, output: MethodOutput, parallel: BatchShare = WHOLE_BATCH) -> None:
        self.router.update(parallel.gather_rows(output.query.router), self.current_expert)
