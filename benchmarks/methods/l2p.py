"""L2P on a frozen timm ViT (docs/protocol.md §4.1): a key-matched pool of shallow prompts, with the
key pool sliced into experts for the router and the ensemble (docs/methods.md, "L2P").
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from fly_modules._validation import check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import QueryFeatures, register_method
from .prompting import ConcatPromptMethod, cls_position, cosine_distance, count_selections, embed_tokens

__all__ = ["L2P"]


@register_method
class L2P(ConcatPromptMethod):
    """L2P with a shallow prompt pool.

    Args:
        backbone: frozen timm ViT.
        num_classes: classifier outputs.
        num_experts: key-pool slices exposed as experts (default 5).
        pool_size: prompts (and keys) in the pool (30).
        prompt_length: tokens per prompt (5).
        top_k: prompts selected per sample (5).
        key_pull_weight: weight of the key-pull term (0.5).
        diversified: real diversified selection (see the module docstring; off by default).

    Attributes:
        prompts: ``(pool_size, prompt_length, D)`` parameter.
        keys: ``(pool_size, D)`` parameter.
        key_expert: ``(pool_size,)`` long buffer, the slice (expert) of each key.
        frequency: ``(pool_size,)`` float buffer, ``1 +`` selections of past sessions.
        selection_count: ``(pool_size,)`` long buffer, training selections in the current session.
    """

    name = "l2p"
    session_aware = True
    default_lr = 0.005

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        *,
        num_experts: int = 5,
        pool_size: int = 30,
        prompt_length: int = 5,
        top_k: int = 5,
        key_pull_weight: float = 0.5,
        diversified: bool = False,
    ) -> None:
        super().__init__(backbone, num_classes, num_experts=num_experts)
        prompt_length = check_int(prompt_length, "prompt_length", caller="L2P", minimum=1)
        top_k = check_int(top_k, "top_k", caller="L2P", minimum=1)
        slice_size = pool_size // self.num_experts
        if slice_size < top_k:
            raise ValueError(
                f"L2P: pool_size {pool_size} split into {self.num_experts} expert slices gives {slice_size} keys "
                f"per slice, fewer than top_k={top_k}; use pool_size >= {top_k * self.num_experts}"
            )
        self.pool_size = int(pool_size)
        self.prompt_length = int(prompt_length)
        self.top_k = int(top_k)
        self.key_pull_weight = float(key_pull_weight)
        self.diversified = bool(diversified)
        factory = self._factory()
        self.prompts = nn.Parameter(torch.empty(pool_size, prompt_length, self.embed_dim, **factory).uniform_(-1, 1))
        self.keys = nn.Parameter(torch.empty(pool_size, self.embed_dim, **factory).uniform_(-1, 1))
        key_expert = (torch.arange(pool_size) // slice_size).clamp_(max=self.num_experts - 1)
        self.register_buffer("key_expert", key_expert.to(factory["device"]))
        self.register_buffer("frequency", torch.ones(pool_size, device=factory["device"]))
        self.register_buffer("selection_count", torch.zeros(pool_size, dtype=torch.long, device=factory["device"]))

    # ------------------------------------------------------------------------------- seams
    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """``(B, top_k)`` key ids, lowest distance first; inside slice ``expert[b]`` when given."""
        scores = cosine_distance(query, self.keys).detach()
        if train and self.diversified:
            scores = scores * (self.frequency / self.frequency.sum())
        if expert is not None:
            expert = self._check_expert_ids(expert, query.shape[0])
            outside = self.key_expert.unsqueeze(0) != expert.unsqueeze(1)
            scores = scores.masked_fill(outside, float("inf"))
        return scores.topk(self.top_k, dim=1, largest=False, sorted=True).indices

    def expert_of(self, selection: Tensor) -> Tensor:
        return self.key_expert[selection[:, 0]]

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        tokens = embed_tokens(self.backbone, x)
        batch, num_prompt = selection.shape[0], self.top_k * self.prompt_length
        prompts = self.prompts[selection].reshape(batch, num_prompt, self.embed_dim) + cls_position(self.backbone)
        prefix = self.backbone.num_prefix_tokens if hasattr(self.backbone, "num_prefix_tokens") else 1
        tokens = torch.cat((tokens[:, :prefix], prompts, tokens[:, prefix:]), dim=1)
        tokens = self.backbone.norm(self.backbone.blocks(tokens))
        return tokens[:, prefix : prefix + num_prompt].mean(dim=1)

    def auxiliary_loss(
        self, query: QueryFeatures, selection: Tensor, features: Tensor, parallel: BatchShare = WHOLE_BATCH
    ) -> Tensor:
        """Key pull: ``key_pull_weight * mean(1 - cos(query, selected keys))``."""
        keys = self.keys[selection]  # (B, k, D)
        cos = torch.nn.functional.cosine_similarity(query.query.unsqueeze(1), keys, dim=-1)
        return self.key_pull_weight * (1.0 - cos).mean()

    def record_selection(self, selection: Tensor, parallel: BatchShare = WHOLE_BATCH) -> None:
        count_selections(self.selection_count, selection, parallel)

    def on_session_end(self, session: int) -> None:
        """Fold this session's selections into the diversification frequency."""
        self.frequency += self.selection_count.to(self.frequency.dtype)
        self.selection_count.zero_()
