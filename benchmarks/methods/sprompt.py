"""S-Prompt++ on a frozen timm ViT (docs/methods.md, "S-Prompt++"): one expert prompt per benchmark task
(FlyPrompt's expert prompts), trained while its task is current; at inference each sample goes to the task
of its nearest k-means prototype of frozen class tokens (``benchmarks.methods.prototypes``).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

import torch
from torch import Tensor, nn

from fly_modules._validation import check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import MethodOutput, register_method
from .prompting import ExpertPromptMethod, resolve_layers
from .prototypes import kmeans_centres, nearest_task, normalise_rows

__all__ = ["SPrompt"]


@register_method
class SPrompt(ExpertPromptMethod):
    """S-Prompt++: task experts and prototype routing.

    Args:
        backbone: frozen timm ViT.
        num_classes: classifier outputs.
        num_experts: tasks (default 5), one expert prompt each.
        prompt_layers: block positions (default (0, 1, 2, 3, 4), clamped to the backbone depth).
        prompt_length: tokens per expert and layer (20).
        prototypes_per_task: k-means centres per task (5).
        max_features: the current task's buffer of class tokens is cut to this many by a random draw
            whenever a batch makes it longer (10,000).
        kmeans_seed: seed of the k-means seeding (0, the official ``random_state``).

    Attributes:
        prompts: ``(len(prompt_layers), num_experts, prompt_length, D)`` parameter.
        prototypes: ``(num_experts, prototypes_per_task, D)`` buffer of normalised centres.
        prototype_count: ``(num_experts,)`` long buffer, how many of a task's prototypes exist.
        features: the current task's buffer of frozen class tokens (checkpointed with the method).
    """

    name = "s-prompt"
    session_aware = True
    default_lr = 0.005

    @classmethod
    def protocol_notes(cls, protocol: Any) -> str:
        return ("prototypes by our k-means (k-means++ seeding, Lloyd iterations, float64), not scikit-learn's KMeans "
                "of the official code: the same objective from other random draws")

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        *,
        num_experts: int = 5,
        prompt_layers: Optional[Iterable[int]] = None,
        prompt_length: int = 20,
        prototypes_per_task: int = 5,
        max_features: int = 10_000,
        kmeans_seed: int = 0,
    ) -> None:
        super().__init__(backbone, num_classes, num_experts=num_experts)
        self.prompt_length = check_int(prompt_length, "prompt_length", caller="SPrompt", minimum=1)
        self.prototypes_per_task = check_int(prototypes_per_task, "prototypes_per_task", caller="SPrompt", minimum=1)
        self.max_features = check_int(max_features, "max_features", caller="SPrompt", minimum=1)
        self.kmeans_seed = int(kmeans_seed)
        self.prompt_layers = resolve_layers(prompt_layers, self.depth, default=(0, 1, 2, 3, 4), what="SPrompt prompt")
        factory = self._factory()
        self.prompts = nn.Parameter(
            torch.rand(len(self.prompt_layers), self.num_experts, self.prompt_length, self.embed_dim, **factory)
        )
        self.register_buffer("prototypes", torch.zeros(self.num_experts, self.prototypes_per_task, self.embed_dim,
                                                       **factory))
        self.register_buffer("prototype_count", torch.zeros(self.num_experts, dtype=torch.long, device=factory["device"]))
        self.features = torch.zeros(0, self.embed_dim, **factory)

    # ------------------------------------------------------------------------------- seams
    def route(self, query: Tensor) -> Tensor:
        """``(B,)`` task of each sample's nearest prototype (the current task before any prototype)."""
        if not bool((self.prototype_count > 0).any()):
            return torch.full((query.shape[0],), self.current_expert, dtype=torch.long, device=query.device)
        return nearest_task(normalise_rows(query), self.prototypes, self.prototype_count)

    # ------------------------------------------------------------------------------- hooks
    def on_expert_start(self, expert: int) -> None:
        """A new task: its prompt starts as the mean of the earlier tasks' prompts, the buffer empties."""
        expert = int(expert)
        new = 0 <= expert < self.num_experts and not bool(self.expert_started[expert])
        super().on_expert_start(expert)
        self.features = self.features[:0]
        if new and expert > 0:
            with torch.no_grad():
                self.prompts[:, expert] = self.prompts[:, :expert].mean(dim=1)

    def on_batch_end(self, x: Tensor, y: Tensor, output: MethodOutput, parallel: BatchShare = WHOLE_BATCH) -> None:
        """The batch's frozen class tokens (the router features: the un-augmented batch by default) join the
        current task's buffer, cut to ``max_features`` by a random draw when longer."""
        rows = parallel.gather_rows(output.query.router).detach().to(self.features)
        features = torch.cat((self.features, rows))
        if len(features) > self.max_features:
            features = features[torch.randperm(len(features))[: self.max_features].to(features.device)]
        self.features = features

    @torch.no_grad()
    def on_evaluate(self) -> None:
        """The current task's prototypes from its buffer (the earlier tasks keep theirs)."""
        if not len(self.features):
            return
        points = normalise_rows(self.features)
        task, k = self.current_expert, self.prototypes_per_task
        if len(points) < k:
            centres = points
        else:
            centres = normalise_rows(kmeans_centres(points, k, seed=self.kmeans_seed))
        self.prototypes[task].zero_()
        self.prototypes[task, : len(centres)] = centres
        self.prototype_count[task] = len(centres)

    # ------------------------------------------------------------------------- extra state
    def get_extra_state(self) -> Dict[str, Any]:
        return {**super().get_extra_state(), "features": self.features.clone()}

    def set_extra_state(self, state: Dict[str, Any]) -> None:
        super().set_extra_state(state)
        self.features = state["features"].to(self.features)
