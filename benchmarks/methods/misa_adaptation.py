"""MISA's initial session adaptation: the model and the update that pretrain MISA's prompts (docs/methods.md).

The model is DualPrompt as MISA's adaptation run builds it: 10 G-prompt tokens per layer, a pool of 10
E-prompts whose training match ranges over the whole pool, and a residual projector on the selected
E-prompts. The update is forgetting-aware minimisation: the weights move a distance ``rho`` up the
gradient of a batch of held-out classes, the gradient of the training batch is taken there, and the
base optimizer steps from the unmoved weights with it.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import Tensor, nn

from .dualprompt import DualPrompt

__all__ = ["SessionAdaptation", "ForgettingAwareStep"]


class SessionAdaptation(DualPrompt):
    """DualPrompt with one step owning the whole pool and a residual E-prompt projector.

    Args:
        backbone: frozen timm ViT.
        num_classes: outputs of the head (the adaptation's classes, held-out ones included).
        pool_size: E-prompt slots (10, MISA's pool).
        g_prompt_length, e_prompt_length: tokens per layer (10 and 20, MISA's).
        projector_reduction: the projector's hidden width is ``embed_dim // projector_reduction`` (8).

    Attributes:
        e_projector: ``Linear(D, D/r) -> LayerNorm -> ReLU -> Linear(D/r, D)``; the E-prompt tokens a
            block sees are ``e + e_projector(e)``.
    """

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        *,
        pool_size: int = 10,
        g_prompt_length: int = 10,
        e_prompt_length: int = 20,
        projector_reduction: int = 8,
    ) -> None:
        # One step owning every slot: the training match ranges over the whole pool (MISA's --isa).
        super().__init__(backbone, num_classes, num_experts=1, pool_size=pool_size,
                         g_prompt_length=g_prompt_length, e_prompt_length=e_prompt_length)
        width = self.embed_dim
        hidden = max(width // int(projector_reduction), 1)
        factory = self._factory()
        self.e_projector = nn.Sequential(
            nn.Linear(width, hidden, **factory), nn.LayerNorm(hidden, **factory), nn.ReLU(),
            nn.Linear(hidden, width, **factory),
        )

    def selected_e_prompts(self, selection: Tensor) -> Tensor:
        prompts = self.e_prompts[selection]
        return prompts + self.e_projector(prompts)

    @torch.no_grad()
    def adapted_prompts(self) -> Dict[str, Tensor]:
        """What MISA loads downstream, which has no projector: the G-prompt ``(1, Lg, D)`` and the E-prompt
        pool ``(P, Le, D)`` with the projector folded in (the tokens the adapted model fed its blocks)."""
        e_prompts = self.e_prompts + self.e_projector(self.e_prompts)
        return {"g_prompt": self.g_prompts.detach().clone().contiguous(), "e_prompt": e_prompts.contiguous()}


class ForgettingAwareStep:
    """One update of forgetting-aware minimisation over ``parameters`` with the base ``optimizer``.

    ``step(perturbing_loss, loss)``: the gradient of ``perturbing_loss()`` (a batch of held-out classes)
    moves every parameter that has one by ``rho * g / ||g||`` (one norm over all of them); ``loss()`` (the
    training batch) is differentiated at the moved point; the parameters return exactly to where they were
    and the optimizer steps with that gradient. Returns both losses.
    """

    def __init__(self, parameters: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer, *, rho: float = 0.1) -> None:
        if not rho >= 0:
            raise ValueError(f"ForgettingAwareStep: rho must be >= 0, got {rho}")
        self.parameters = [p for p in parameters if p.requires_grad]
        self.optimizer = optimizer
        self.rho = float(rho)

    def step(self, perturbing_loss: Callable[[], Tensor], loss: Callable[[], Tensor]) -> Tuple[float, float]:
        self.optimizer.zero_grad(set_to_none=True)
        perturbing = perturbing_loss()
        perturbing.backward()
        saved = self._move_up()
        self.optimizer.zero_grad(set_to_none=True)
        training = loss()
        training.backward()
        with torch.no_grad():
            for parameter, original in saved:
                parameter.copy_(original)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(perturbing.detach()), float(training.detach())

    @torch.no_grad()
    def _move_up(self) -> List[Tuple[nn.Parameter, Tensor]]:
        moved = [p for p in self.parameters if p.grad is not None]
        if not moved:
            return []
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in moved]))
        scale = self.rho / (norm + 1e-12)
        saved = [(p, p.detach().clone()) for p in moved]
        for p in moved:
            p.add_(p.grad * scale)
        return saved
