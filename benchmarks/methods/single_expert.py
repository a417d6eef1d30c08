"""What the methods with one expert and no selection share (the linear probe, RanPAC†): every sample uses
expert 0, forced ids must say so, and a router has nothing to choose (the routed variants are refused)."""

from __future__ import annotations

from typing import ClassVar, Optional

import torch
from torch import Tensor

__all__ = ["SingleExpert", "SINGLE_EXPERT_ROUTER_REFUSAL", "single_expert_ids"]

#: Why the routed variants of a method with one expert are skipped.
SINGLE_EXPERT_ROUTER_REFUSAL = "it has one expert: a router has nothing to choose between"


def single_expert_ids(expert: Optional[Tensor], batch: int, device: torch.device, caller: str) -> Tensor:
    """``(batch,)`` zeros, the one expert of every sample; ``expert`` (forced ids) is checked to be that."""
    if expert is None:
        return torch.zeros(batch, dtype=torch.long, device=device)
    if expert.shape != (batch,):
        raise ValueError(f"{caller}: expert ids must have shape ({batch},), found {tuple(expert.shape)}")
    others = expert[expert != 0]
    if others.numel():
        raise ValueError(f"{caller}: there is one expert, 0; found the expert ids {sorted(set(others.tolist()))}; "
                         "pass expert=None or zeros")
    return expert.to(device=device, dtype=torch.long)


class SingleExpert:
    """Mixin before ``PromptMethod``: the selection and expert seams of a method with one expert."""

    router_refusal: ClassVar[str] = SINGLE_EXPERT_ROUTER_REFUSAL

    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """Expert 0 for every sample (``expert``, when given, must say so)."""
        return single_expert_ids(expert, query.shape[0], query.device, type(self).__name__)

    def expert_of(self, selection: Tensor) -> Tensor:
        return selection
