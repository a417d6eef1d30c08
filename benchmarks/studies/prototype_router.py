"""Prototype similarity: each expert is the mean of its expanded features; a sample goes to the expert
whose mean is closest in cosine similarity."""

from __future__ import annotations

from typing import Dict

import torch
from torch import Tensor
from torch.nn import functional as F

from .expanded_router import ExpandedRouter

__all__ = ["PrototypeRouter"]


class PrototypeRouter(ExpandedRouter):
    """Cosine similarity to each expert's mean feature; float64 sums, exact across processes."""

    name = "prototype"

    def __init__(self, features: int, num_experts: int, device="cpu") -> None:
        super().__init__(features, num_experts, device)
        self.sums = torch.zeros(self.num_experts, self.features, dtype=torch.float64, device=self.device)

    def prototypes(self) -> Tensor:
        """``(num_experts, features)`` the mean of each expert's features (zero where it has none)."""
        return self.sums / self.counts.clamp(min=1).unsqueeze(1).double()

    def scores(self, phi: Tensor) -> Tensor:
        return F.normalize(phi.double(), dim=1) @ F.normalize(self.prototypes(), dim=1).T

    def _update(self, phi: Tensor, ids: Tensor) -> None:
        self.sums.index_add_(0, ids, phi.double())

    def _merge(self, other: "PrototypeRouter") -> None:
        self.sums += other.sums.to(self.device)

    def _tensors(self) -> Dict[str, Tensor]:
        return {"sums": self.sums}
