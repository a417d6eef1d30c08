"""MVP on a frozen timm ViT (docs/protocol.md §4.5): count-scaled prompt selection, instance-wise
logit masks, and the AFS / MCR / contrastive losses, the MCR gradients in closed form (no per-sample
backward). Decisions on the reference's quirks are in docs/methods.md, "MVP".
"""

from __future__ import annotations

from typing import Callable, ClassVar, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import MethodOutput, QueryFeatures, register_method
from .prompting import (
    ConcatPromptMethod,
    cosine_distance,
    count_selections,
    embed_tokens,
    prompts_by_layer,
    resolve_layers,
)

__all__ = ["MVP", "mcr_gradients"]


def mcr_gradients(
    features: Tensor, probs: Tensor, scale: Tensor, target: Tensor, *, reduce: Optional[Callable[[Tensor], Tensor]] = None
) -> "tuple[Tensor, Tensor]":
    """Per-sample and batch-mean gradients of CE w.r.t. the true-class rows of a linear head.

    For logits ``z_i = (W f_i + b) * m_i + mask`` and ``CE_i = -log softmax(z_i)[y_i]``:
    ``dCE_i/dW_c = (p_ic - [c = y_i]) * m_ic * f_i``.

    Args:
        features: ``(B, D)`` head inputs ``f``.
        probs: ``(B, C)`` softmax of the masked logits ``p``.
        scale: ``(B, C)`` per-sample multiplicative logit mask ``m`` (ones when there is none).
        target: ``(B,)`` true classes ``y``.
        reduce: sums a tensor over data-parallel processes (the batch mean is then the global one).

    Returns:
        ``(sample_grad, batch_grad)``, both ``(B, D)``: ``dCE_i/dW_{y_i}`` and
        ``d mean_j(CE_j)/dW_{y_i}``.
    """
    onehot = F.one_hot(target, probs.shape[1]).to(probs.dtype)
    coeff = (probs - onehot) * scale  # (B, C): dCE_i/dz_ic * dz_ic/d(W f_i)_c
    sample_grad = coeff.gather(1, target.unsqueeze(1)) * features
    class_sum = coeff.transpose(0, 1) @ features  # (C, D) = d sum CE / dW
    count = class_sum.new_tensor(float(features.shape[0]))
    if reduce is not None:
        class_sum, count = reduce(class_sum), reduce(count)
    return sample_grad, (class_sum / count)[target]


@register_method
class MVP(ConcatPromptMethod):
    """MVP with count-scaled prompt selection, instance-wise logit masks, AFS and MCR.

    Args:
        backbone: frozen timm ViT (at least 2 blocks: the query skips the last one).
        num_classes: classifier outputs.
        num_experts: E-prompt pool size = number of steps (default 5).
        g_prompt_layers, e_prompt_layers: block positions (default (0, 1) and (2, 3, 4), clamped).
        g_prompt_length, e_prompt_length: tokens per layer (5 and 20).
        alpha, gamma: MCR weight ``(1 - alpha) + alpha * ign ** gamma`` (0.5, 2.0).
        margin: AFS margin (0.5).
        reference_quirks: batch-global focal weight and pair-broadcast contrastive term, as in the
            reference.

    Attributes:
        g_prompts: ``(1, len(g_prompt_layers) * g_prompt_length, D)`` parameter.
        e_prompts: ``(num_experts, len(e_prompt_layers) * e_prompt_length, D)`` parameter.
        keys: ``(num_experts, D)`` parameter.
        logit_mask: ``(num_experts, num_classes)`` parameter, initialised to -1.
        count: ``(num_experts,)`` long buffer, training selections per prompt.
    """

    name = "mvp"
    session_aware = False
    default_lr = 0.005
    train_logit_mask: ClassVar[str] = "seen"

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        *,
        num_experts: int = 5,
        g_prompt_layers: Optional[Iterable[int]] = None,
        g_prompt_length: int = 5,
        e_prompt_layers: Optional[Iterable[int]] = None,
        e_prompt_length: int = 20,
        alpha: float = 0.5,
        gamma: float = 2.0,
        margin: float = 0.5,
        reference_quirks: bool = False,
    ) -> None:
        super().__init__(backbone, num_classes, num_experts=num_experts)
        if self.depth < 2:
            raise ValueError(
                f"MVP: the query skips the last block, so the backbone needs >= 2 blocks, has {self.depth}"
            )
        g_prompt_length = check_int(g_prompt_length, "g_prompt_length", caller="MVP", minimum=1)
        e_prompt_length = check_int(e_prompt_length, "e_prompt_length", caller="MVP", minimum=1)
        self.g_layers = resolve_layers(g_prompt_layers, self.depth, default=(0, 1), what="MVP G-prompt")
        self.e_layers = resolve_layers(e_prompt_layers, self.depth, default=(2, 3, 4), what="MVP E-prompt")
        self.g_prompt_length = int(g_prompt_length)
        self.e_prompt_length = int(e_prompt_length)
        self.alpha, self.gamma, self.margin = float(alpha), float(gamma), float(margin)
        self.reference_quirks = bool(reference_quirks)
        factory = self._factory()
        g_tokens = len(self.g_layers) * self.g_prompt_length
        e_tokens = len(self.e_layers) * self.e_prompt_length
        self.g_prompts = nn.Parameter(torch.randn(1, g_tokens, self.embed_dim, **factory))
        self.e_prompts = nn.Parameter(torch.randn(self.num_experts, e_tokens, self.embed_dim, **factory))
        self.keys = nn.Parameter(torch.randn(self.num_experts, self.embed_dim, **factory))
        self.logit_mask = nn.Parameter(torch.full((self.num_experts, self.num_classes), -1.0, **factory))
        self.register_buffer("count", torch.zeros(self.num_experts, dtype=torch.long, device=factory["device"]))

    # ------------------------------------------------------------------------------- seams
    @torch.no_grad()
    def frozen_features(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """One frozen pass: class token before the last block (no norm) and final-norm class token."""
        tokens = self.backbone.blocks[:-1](embed_tokens(self.backbone, x))
        return tokens[:, 0], self.backbone.norm(self.backbone.blocks[-1](tokens))[:, 0]

    def query_from_frozen(self, frozen: Tuple[Tensor, Tensor]) -> QueryFeatures:
        return QueryFeatures(query=frozen[0], router=frozen[1])

    def _mass(self) -> Tensor:
        return (self.count + 1).to(self.keys.dtype)

    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """``(B,)`` prompt ids: count-scaled top-1 key match, or ``expert`` itself when given."""
        if expert is not None:
            return self._check_expert_ids(expert, query.shape[0])
        scaled = cosine_distance(query, self.keys).detach() * self._mass()
        return scaled.argmin(dim=1)

    def banks_of_expert(self, expert: int) -> List[int]:
        # The reference's TE2 copies every prompt's bank from the online head at construction and never
        # re-clones it: MVP prompts are not tied to steps.
        return []

    def expert_of(self, selection: Tensor) -> Tensor:
        return selection

    def _g_tokens(self, batch: int) -> Tensor:
        """``(B, G layers, G length, D)``: the shared G-prompt of every sample."""
        return self.g_prompts.view(1, len(self.g_layers), self.g_prompt_length, self.embed_dim).expand(batch, -1, -1, -1)

    def _layer_prompts(self, selection: Tensor) -> Dict[int, List[Tensor]]:
        batch, dim = selection.shape[0], self.embed_dim
        e = self.e_prompts[selection].view(batch, len(self.e_layers), self.e_prompt_length, dim)
        return prompts_by_layer((self.g_layers, self._g_tokens(batch)), (self.e_layers, e))

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        return self._prompted_cls(x, self._layer_prompts(selection))

    def common_features(self, x: Tensor) -> Tensor:
        """The class token with the G-prompt alone, shared by every prompt (the CKA study's common representation)."""
        return self._prompted_cls(x, prompts_by_layer((self.g_layers, self._g_tokens(x.shape[0]))))

    def mask_scale(self, selection: Tensor) -> Tensor:
        """``(B, C)`` multiplicative class mask ``2 * sigmoid(logit_mask[selection])``."""
        return 2.0 * torch.sigmoid(self.logit_mask[selection])

    def transform_logits(self, logits: Tensor, selection: Tensor) -> Tensor:
        scale = self.mask_scale(selection)
        return logits * (scale if logits.dim() == 2 else scale.unsqueeze(1))

    def auxiliary_loss(
        self, query: QueryFeatures, selection: Tensor, features: Tensor, parallel: BatchShare = WHOLE_BATCH
    ) -> Tensor:
        """Contrastive prompt term ``-log(A / (A + Bq) + 1e-6)``.

        ``A`` averages ``exp(key_distance[sel, p] / mass)`` over the pool, ``Bq`` averages
        ``exp((1 - cos(query, key[sel])) / mass)``, with ``mass = count[sel] + 1``.
        """
        key_distance = cosine_distance(self.keys, self.keys)[selection]  # (B, P)
        query_distance = 1.0 - F.cosine_similarity(query.query, self.keys[selection], dim=-1)  # (B,)
        mass = self._mass()[selection]  # (B,)
        if self.reference_quirks:
            # Reference broadcasting: every sample's distances divided by every sample's mass.
            a = (key_distance.unsqueeze(1) / mass.view(1, -1, 1)).exp().mean()
            b = (query_distance.unsqueeze(1) / mass.view(1, -1)).exp().mean()
        else:
            # Means over the global batch in a data-parallel run (one process: plain means).
            a = parallel.global_mean((key_distance / mass.unsqueeze(1)).exp().mean(dim=1))
            b = parallel.global_mean((query_distance / mass).exp())
            return -(a / (b + a) + 1e-6).log() / parallel.fraction
        return -(a / (b + a) + 1e-6).log()

    def record_selection(self, selection: Tensor, parallel: BatchShare = WHOLE_BATCH) -> None:
        count_selections(self.count, selection, parallel)

    def loss(
        self, output: MethodOutput, target: Tensor, logit_mask: Optional[Tensor] = None,
        parallel: BatchShare = WHOLE_BATCH,
    ) -> Tensor:
        """AFS + MCR-weighted cross-entropy on the masked logits, plus the contrastive term."""
        features, selection = output.features, output.selection
        scale = self.mask_scale(selection)
        weight = self.head.weight
        with torch.no_grad():
            f = features.detach()
            afs = 1.0 - F.cosine_similarity(weight[target], f, dim=1) + self.margin  # (B,)
            plain = output.logits.detach() if logit_mask is None else output.logits.detach() + logit_mask
            sample_grad, batch_grad = mcr_gradients(
                f, plain.softmax(dim=1), scale.detach(), target, reduce=parallel.sum if parallel.group is not None else None
            )
            ign = 1.0 - F.cosine_similarity(sample_grad, batch_grad, dim=1)
            focal = (1.0 - self.alpha) + self.alpha * ign.pow(self.gamma)  # (B,)
        logits = self.head(features / afs.unsqueeze(1)) * scale
        if logit_mask is not None:
            logits = logits + logit_mask
        if self.reference_quirks:
            ce = F.cross_entropy(logits, target) * focal.mean()
        else:
            ce = (F.cross_entropy(logits, target, reduction="none") * focal).mean()
        return ce + output.aux_loss
