"""CODA-Prompt on a frozen timm ViT (docs/methods.md, "CODA-P"): per prompt layer a pool of components
(prompt, key, attention vector), each task owning a contiguous slice of them; the prompt of a sample is
the components' sum weighted by the cosine of its attended query with their keys.

Expert = task (benchmark session): expert ``e`` is the prompt built from the components of tasks ``0..e``,
the prompt the method trained while task ``e`` was current. The router's and the oracle's expert restrict
each sample to those components; the method's own choice is every component started so far.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch import Tensor, nn

from fly_modules._validation import check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import QueryFeatures, register_method
from .prompting import ConcatPromptMethod, cls_position, embed_tokens, prompts_by_layer, resolve_layers, run_blocks

__all__ = ["CodaPrompt", "gram_schmidt_rows", "orthogonality_penalty"]

#: a row whose squared norm is below this takes no part in a projection (the official routine redraws
#: forever when it meets one; no trained row is ever that small)
_NEGLIGIBLE = 1e-8


@torch.no_grad()
def gram_schmidt_rows(rows: Tensor, start: int, stop: int) -> Tensor:
    """``rows`` ``(P, F)`` with rows ``[start, stop)`` replaced by random orthonormal ones, rows past ``stop``
    by zeros, rows before ``start`` kept (the official initialisation of a task's components).

    Each new row is a fresh ``torch.randn(F)`` draw of the global generator minus its projections onto
    every row before it (classical Gram-Schmidt: the projections of the draw, not of the running
    remainder, added one row at a time in order); the new rows are normalised at the end. The draws,
    their order and the arithmetic are the official routine's, so a seeded generator gives its rows.
    """
    out = torch.zeros_like(rows)
    out[:start] = rows[:start]
    for k in range(start, stop):
        draw = torch.randn(rows.shape[1], dtype=rows.dtype, device=rows.device)
        projection: Any = 0
        for j in range(k):
            earlier = out[j]
            denominator = (earlier * earlier).sum()
            coefficient = torch.where(denominator >= _NEGLIGIBLE, (draw * earlier).sum() / denominator, 0.0)
            projection = projection + coefficient * earlier
        out[k] = draw - projection
    out[start:stop] = out[start:stop] / out[start:stop].norm(dim=1, keepdim=True)
    return out


def orthogonality_penalty(rows: Tensor) -> Tensor:
    """``mean((R R^T - I)^2)`` of ``rows`` ``(P, F)``."""
    eye = torch.eye(rows.shape[0], dtype=rows.dtype, device=rows.device)
    return ((rows @ rows.T - eye) ** 2).mean()


@register_method
class CodaPrompt(ConcatPromptMethod):
    """CODA-Prompt with task-sliced components.

    Args:
        backbone: frozen timm ViT.
        num_classes: classifier outputs.
        num_experts: tasks (default 5); each owns ``pool_size // num_experts`` components.
        pool_size: components per prompt layer (10).
        prompt_layers: block positions (default (0, 1, 2, 3, 4), clamped to the backbone depth).
        prompt_length: tokens per component (20).
        ortho_weight: weight of the orthogonality penalty on the trained components (0, the official
            ``ortho_mu``).
        reference_quirks: freeze the components after the first session, as the official code's
            optimizer does (docs/methods.md); off by default.

    Attributes:
        prompts: ``(layers, pool_size, prompt_length, D)`` parameter.
        keys, attention: ``(layers, pool_size, D)`` parameters.
    """

    name = "coda-prompt"
    session_aware = True
    default_lr = 0.005

    @classmethod
    def protocol_notes(cls, protocol: Any) -> str:
        kwargs = protocol.method_kwargs.get(cls.name, {})
        if kwargs.get("reference_quirks"):
            return ("reference_quirks: the components freeze after the first session (the official optimizer "
                    "keeps the tensors the first session's end replaced); the head trains throughout")
        return ("every task trains its own components (the official code's optimizer trains them in the first "
                "session only: reference_quirks=True reproduces it)")

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        *,
        num_experts: int = 5,
        pool_size: int = 10,
        prompt_layers: Optional[Iterable[int]] = None,
        prompt_length: int = 20,
        ortho_weight: float = 0.0,
        reference_quirks: bool = False,
    ) -> None:
        super().__init__(backbone, num_classes, num_experts=num_experts)
        pool_size = check_int(pool_size, "pool_size", caller="CodaPrompt", minimum=1)
        if pool_size < self.num_experts:
            raise ValueError(
                f"CodaPrompt: pool_size {pool_size} gives no component to each of {self.num_experts} tasks; "
                f"use pool_size >= {self.num_experts}"
            )
        self.prompt_length = check_int(prompt_length, "prompt_length", caller="CodaPrompt", minimum=1)
        self.prompt_layers = resolve_layers(prompt_layers, self.depth, default=(0, 1, 2, 3, 4), what="CodaPrompt prompt")
        self.pool_size = pool_size
        self.per_task = pool_size // self.num_experts
        self.ortho_weight = float(ortho_weight)
        self.reference_quirks = bool(reference_quirks)
        layers, factory = len(self.prompt_layers), self._factory()
        self.prompts = nn.Parameter(torch.rand(layers, pool_size, self.prompt_length, self.embed_dim, **factory))
        self.keys = nn.Parameter(torch.rand(layers, pool_size, self.embed_dim, **factory))
        self.attention = nn.Parameter(torch.rand(layers, pool_size, self.embed_dim, **factory))
        self.start_task_components(0)

    # ---------------------------------------------------------------------------- components
    def components(self, task: int) -> Tuple[int, int]:
        """``(start, stop)``: the components task ``task`` owns."""
        return task * self.per_task, (task + 1) * self.per_task

    @torch.no_grad()
    def start_task_components(self, task: int) -> None:
        """Task ``task``'s components drawn orthonormal to the earlier ones, later ones zeroed, per layer
        keys, attention vectors, then prompts (the official order of the draws)."""
        start, stop = self.components(task)
        for layer in range(len(self.prompt_layers)):
            for tensor in (self.keys, self.attention, self.prompts):
                rows = tensor[layer].reshape(self.pool_size, -1)
                tensor[layer] = gram_schmidt_rows(rows, start, stop).view_as(tensor[layer])

    def _used(self, tensor: Tensor, stop: int, train: bool) -> Tensor:
        """Components ``[0, stop)`` of ``tensor`` (leading layer axis), the earlier tasks' detached in training."""
        used = tensor[:, :stop]
        start = self.current_expert * self.per_task
        if train and start > 0:
            used = torch.cat((used[:, :start].detach(), used[:, start:]), dim=1)
        return used

    def component_weights(self, query: Tensor, keys: Tensor, attention: Tensor) -> Tensor:
        """``(layers, B, K)``: cosine of the attended query ``query * A_k`` with key ``K_k``, per layer."""
        attended = torch.einsum("bd,lkd->lbkd", query, attention)
        return torch.einsum("lbkd,lkd->lbk", nn.functional.normalize(attended, dim=3),
                            nn.functional.normalize(keys, dim=2))

    # ------------------------------------------------------------------------------- seams
    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """``(B,)`` experts: ``expert`` when given, else the current task (its components and the earlier)."""
        if expert is not None:
            return self._check_expert_ids(expert, query.shape[0])
        return torch.full((query.shape[0],), self.current_expert, dtype=torch.long, device=query.device)

    def expert_of(self, selection: Tensor) -> Tensor:
        return selection

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        return self.query_conditioned_features(x, self.compute_query(x), selection)

    def query_conditioned_features(self, x: Tensor, query: QueryFeatures, selection: Tensor) -> Tensor:
        """Each sample's prompt from the components of its expert's tasks, weighted by its query."""
        stop = min(int(selection.max()) + 1, self.num_experts) * self.per_task
        keys, attention, prompts = (self._used(t, stop, self.training) for t in (self.keys, self.attention, self.prompts))
        weights = self.component_weights(query.query, keys, attention)
        allowed = torch.arange(stop, device=selection.device) < ((selection + 1) * self.per_task).unsqueeze(1)
        weights = weights * allowed.to(weights.dtype)
        tokens = torch.einsum("lbk,lktd->bltd", weights, prompts) + cls_position(self.backbone)
        layer_prompts = prompts_by_layer((self.prompt_layers, tokens))
        return self.backbone.norm(run_blocks(self.backbone, embed_tokens(self.backbone, x), layer_prompts))[:, 0]

    def auxiliary_loss(
        self, query: QueryFeatures, selection: Tensor, features: Tensor, parallel: BatchShare = WHOLE_BATCH
    ) -> Tensor:
        """``ortho_weight`` times the orthogonality penalty of the components in use (0 by default)."""
        if self.ortho_weight <= 0:
            return features.new_zeros(())
        stop = (self.current_expert + 1) * self.per_task
        total = features.new_zeros(())
        for tensor in (self.keys, self.attention, self.prompts):
            used = self._used(tensor, stop, train=True)
            for layer in range(used.shape[0]):
                total = total + orthogonality_penalty(used[layer].reshape(stop, -1))
        return self.ortho_weight * total

    # ------------------------------------------------------------------------------- hooks
    def on_session_end(self, session: int) -> None:
        """The next task's components drawn (none after the last task); with ``reference_quirks`` the
        components freeze after the first session."""
        following = int(session) + 1
        if following < self.num_experts:
            self.start_task_components(following)
        if self.reference_quirks:
            for tensor in (self.keys, self.attention, self.prompts):
                tensor.requires_grad_(False)
                tensor.grad = None

    def get_extra_state(self) -> Dict[str, Any]:
        return {**super().get_extra_state(), "components_frozen": not self.prompts.requires_grad}

    def set_extra_state(self, state: Dict[str, Any]) -> None:
        super().set_extra_state(state)
        frozen = bool(state.get("components_frozen", False))
        for tensor in (self.keys, self.attention, self.prompts):
            tensor.requires_grad_(not frozen)

    def trainable_parameters(self) -> List[nn.Parameter]:
        """Every parameter the optimizer holds: the components even when frozen (they stay in the
        optimizer, without gradients, as in the official run) and the head."""
        return [self.prompts, self.keys, self.attention, self.head.weight, self.head.bias]
