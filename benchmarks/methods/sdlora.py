"""SD-LoRA on a frozen timm ViT: LoRA on the attention's query and value projections, one low-rank
direction per task and a learned magnitude per task, every task so far combined for every sample
(docs/methods.md, "SD-LoRA"). There is no per-sample choice of experts: the router has nothing to pick.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Union

import torch
from fly_modules.adapters.sdlora import ROUTER_REFUSAL
from torch import Tensor, nn

from fly_modules._validation import check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import PromptMethod, QueryFeatures, frozen_cls, register_method
from .prefix_attention import check_prefixable_backbone, class_token_pass, expert_block, resolve_prefix_layers

__all__ = ["SDLoRA", "CombinedDirections", "sdlora_parameter_count"]

#: Added to the product of the Frobenius norms that normalises a finished task's direction.
_NORM_EPS = 1e-6


class _DirectionBank(nn.Module):
    """One task's query and value directions in ``L`` layers: ``down`` ``(L, 2, r, D)`` (index 0 query,
    1 value) uniform in ``±1/sqrt(D)`` (the default ``nn.Linear`` bound), ``up`` ``(L, 2, D, r)`` zeros,
    ``magnitude`` ``(L, 2)`` at ``alpha``."""

    def __init__(self, layers: int, dim: int, rank: int, alpha: float, dd: dict) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(dim)
        self.down = nn.Parameter(torch.empty(layers, 2, rank, dim, **dd).uniform_(-bound, bound))
        self.up = nn.Parameter(torch.zeros(layers, 2, dim, rank, **dd))
        self.magnitude = nn.Parameter(torch.full((layers, 2), float(alpha), **dd))


class CombinedDirections:
    """SD-LoRA's update for one pass: ``down`` ``(L, 2, t r, D)`` and coefficient-scaled ``up`` ``(L, 2, D, t r)``
    of the ``t`` tasks so far (index 0 query, 1 value)."""

    def __init__(self, down: Tensor, scaled_up: Tensor) -> None:
        self.down, self.scaled_up = down, scaled_up

    def qkv_delta(self, slot: int, h: Tensor) -> Tensor:
        """The ``(B, N, 3 * D)`` addition to the ``qkv`` output of the ``slot``-th LoRA block (``h``: ``norm1``'s)."""
        query = (h @ self.down[slot, 0].t()) @ self.scaled_up[slot, 0].t()
        value = (h @ self.down[slot, 1].t()) @ self.scaled_up[slot, 1].t()
        return torch.cat([query, torch.zeros_like(query), value], dim=-1)


@register_method
class SDLoRA(PromptMethod):
    """SD-LoRA, online, on a frozen timm ViT.

    In the listed blocks the query and value projections get ``sum_t m_t B_t A_t h`` over the tasks so
    far: a finished task's direction normalised by ``||A_t||_F ||B_t||_F + 1e-6``, the current task's
    not. Only the current task's ``A, B, m`` train (``requires_grad``); the optimizer holds every task's.

    Args:
        backbone: a timm ``VisionTransformer`` with a class token; frozen here. Its own classifier is
            never used.
        num_classes: C, the head's outputs.
        num_tasks: T, benchmark sessions = experts (banks allocated up front); num_experts: its alias.
        lora_layers: block indices (every block by default) or the first n blocks.
        lora_rank: r (10); lora_alpha: the magnitudes' initial value (0.8; the official run's settings).
        ortho_weight: weight of the squared cosines between the current task's ``A`` and earlier tasks'
            (0.0, the official default: off).

    Attributes:
        banks: ``ModuleList`` of T ``_DirectionBank``; head: ``nn.Linear(D, C)`` on the final-norm CLS.
        lora_layers: the LoRA blocks; embed_dim, router_dim: D.
    """

    name: ClassVar[str] = "sd-lora"
    session_aware: ClassVar[bool] = True
    default_lr: ClassVar[float] = 0.005
    router_refusal: ClassVar[str] = ROUTER_REFUSAL

    def __init__(
        self, backbone: nn.Module, num_classes: int, *, num_tasks: Optional[int] = None,
        num_experts: Optional[int] = None, lora_layers: Optional[Union[int, Sequence[int]]] = None,
        lora_rank: int = 10, lora_alpha: float = 0.8, ortho_weight: float = 0.0,
    ) -> None:
        super().__init__()
        if num_tasks is not None and num_experts is not None and num_tasks != num_experts:
            raise ValueError(f"num_tasks ({num_tasks}) and its alias num_experts ({num_experts}) disagree")
        caller = type(self).__name__
        num_tasks = num_tasks if num_tasks is not None else (num_experts if num_experts is not None else 5)
        self.num_classes = check_int(num_classes, "num_classes", caller=caller, minimum=1)
        self.num_tasks = self.num_experts = check_int(num_tasks, "num_tasks", caller=caller, minimum=1)
        self.rank = check_int(lora_rank, "lora_rank", caller=caller, minimum=1)
        if not ortho_weight >= 0:
            raise ValueError(f"{caller}: ortho_weight must be >= 0, found {ortho_weight!r}")
        self.alpha, self.ortho_weight = float(lora_alpha), float(ortho_weight)
        self.current_expert = 0
        self.backbone = backbone
        backbone.requires_grad_(False)
        backbone.eval()
        depth = len(backbone.blocks)
        self.lora_layers = resolve_prefix_layers(depth if lora_layers is None else lora_layers, depth)
        check_prefixable_backbone(backbone, self.lora_layers)
        self._slot_of_layer: Dict[int, int] = {layer: s for s, layer in enumerate(self.lora_layers)}
        ref = next(backbone.parameters())
        dd = {"device": ref.device, "dtype": ref.dtype}
        self.embed_dim = self.router_dim = int(getattr(backbone, "embed_dim", None) or backbone.num_features)
        self.banks = nn.ModuleList(
            _DirectionBank(len(self.lora_layers), self.embed_dim, self.rank, self.alpha, dd) for _ in range(self.num_tasks)
        )
        self.head = nn.Linear(self.embed_dim, self.num_classes, **dd)
        self._sync_trainable()

    def extra_repr(self) -> str:
        return (f"num_classes={self.num_classes}, num_tasks={self.num_tasks}, lora_layers={self.lora_layers}, "
                f"lora_rank={self.rank}, lora_alpha={self.alpha}, ortho_weight={self.ortho_weight}")

    def get_extra_state(self) -> Any:
        return {"current_expert": int(self.current_expert)}

    def set_extra_state(self, state: Any) -> None:
        self.current_expert = int(state["current_expert"])
        self._sync_trainable()

    # -------------------------------------------------------------------------------- seams
    def frozen_features(self, x: Tensor) -> Tensor:
        """Frozen LoRA-free final-norm CLS (the router's features; SD-LoRA itself needs no query)."""
        return frozen_cls(self.backbone, x)

    def query_from_frozen(self, cls: Tensor) -> QueryFeatures:
        return QueryFeatures(query=cls, router=cls)

    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """``expert`` if given (it picks the ensemble bank only), else the current task for every sample."""
        if expert is not None:
            if expert.shape != (query.shape[0],):
                raise ValueError(f"expert ids must have shape ({query.shape[0]},), found {tuple(expert.shape)}")
            return expert.to(device=query.device, dtype=torch.long)
        return torch.full((query.shape[0],), self.current_expert, dtype=torch.long, device=query.device)

    def expert_of(self, selection: Tensor) -> Tensor:
        return selection

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        """Every task so far combined, whatever ``selection``: final-norm CLS ``(B, D)``."""
        directions = self.combined_directions()
        return class_token_pass(self.backbone, x, self._slot_of_layer, lambda block, tokens, slot: expert_block(
            block, tokens, qkv_delta=partial(directions.qkv_delta, slot)))

    def combined_directions(self) -> "CombinedDirections":
        """Every task so far, each ``up`` scaled by its coefficient (a finished task's ``m_t`` over its norms,
        the current task's ``m_c``), concatenated along the rank: whatever the number of tasks, a block
        costs one ``h down^T`` and one ``up^T`` product per projection."""
        tasks = self.banks[: self.current_expert + 1]
        down = torch.stack([bank.down for bank in tasks])  # (t, L, 2, r, D)
        up = torch.stack([bank.up for bank in tasks])  # (t, L, 2, D, r)
        coefficient = torch.stack([bank.magnitude for bank in tasks])  # (t, L, 2)
        if len(tasks) > 1:  # finished tasks: unit directions
            norms = down[:-1].flatten(-2).norm(dim=-1) * up[:-1].flatten(-2).norm(dim=-1) + _NORM_EPS
            coefficient = torch.cat([coefficient[:-1] / norms, coefficient[-1:]])
        scaled_up = up * coefficient[..., None, None]
        t, layers, _, rank, dim = down.shape
        return CombinedDirections(down.permute(1, 2, 0, 3, 4).reshape(layers, 2, t * rank, dim),
                                  scaled_up.permute(1, 2, 3, 0, 4).reshape(layers, 2, dim, t * rank))

    def auxiliary_loss(
        self, query: QueryFeatures, selection: Tensor, features: Tensor, parallel: BatchShare = WHOLE_BATCH
    ) -> Tensor:
        """``ortho_weight`` times the squared cosines between the current task's ``A`` and each earlier one's
        (per layer and projection, summed)."""
        if self.ortho_weight == 0 or self.current_expert == 0:
            return features.new_zeros(())
        current = self.banks[self.current_expert].down.flatten(-2)  # (L, 2, r D)
        earlier = torch.stack([bank.down for bank in self.banks[: self.current_expert]]).flatten(-2)
        inner = (earlier * current).sum(-1)
        cosine = inner / (earlier.norm(dim=-1) * current.norm(dim=-1) + _NORM_EPS)
        return self.ortho_weight * cosine.square().sum()

    def trainable_parameters(self) -> List[nn.Parameter]:
        """Every task's bank and the head: the optimizer holds them all; only the current task's bank
        has ``requires_grad`` (a parameter without a gradient is skipped by the optimizer)."""
        return [*self.banks.parameters(), *self.head.parameters()]

    # -------------------------------------------------------------------------------- hooks
    def on_expert_start(self, expert: int) -> None:
        expert = int(expert)
        if not 0 <= expert < self.num_tasks:
            raise ValueError(f"{type(self).__name__}: task {expert} out of range [0, {self.num_tasks})")
        self.current_expert = expert
        self._sync_trainable()

    def _sync_trainable(self) -> None:
        for task, bank in enumerate(self.banks):
            bank.requires_grad_(task == self.current_expert)
            if task != self.current_expert:
                for parameter in bank.parameters():
                    parameter.grad = None


def sdlora_parameter_count(layers: int, tasks: int, dim: int, rank: int) -> int:
    """Parameters of SD-LoRA's banks: per layer and task, query and value, ``A`` ``r x D``, ``B`` ``D x r``
    and a magnitude."""
    return layers * tasks * 2 * (2 * rank * dim + 1)
