"""K-Means per expert: ``K`` centres summarise each expert's expanded features; a sample goes to the
expert of its nearest centre. Online (mini-batch k-means with per-centre rates ``1 / count``): an
expert's first ``K`` samples seed its centres, every later sample joins its nearest centre, and each
centre stays the mean of the samples assigned to it."""

from __future__ import annotations

from typing import Dict

import torch
from torch import Tensor

from .expanded_router import ExpandedRouter

__all__ = ["KMeansRouter", "squared_distances"]


def squared_distances(x: Tensor, centres: Tensor) -> Tensor:
    """``(N, C)`` squared Euclidean distances in float64."""
    x, centres = x.double(), centres.double()
    return (x.square().sum(1, keepdim=True) - 2 * x @ centres.T + centres.square().sum(1)).clamp_(min=0)


class KMeansRouter(ExpandedRouter):
    """``centres_per_expert`` centres per expert, float64. Order-dependent: not mergeable."""

    name = "kmeans"
    mergeable = False

    def __init__(self, features: int, num_experts: int, device="cpu", *, centres_per_expert: int = 10) -> None:
        super().__init__(features, num_experts, device)
        self.k = int(centres_per_expert)
        if self.k < 1:
            raise ValueError(f"KMeansRouter: centres_per_expert must be >= 1, got {centres_per_expert}")
        self.centres = torch.zeros(self.num_experts, self.k, self.features, dtype=torch.float64, device=self.device)
        self.sizes = torch.zeros(self.num_experts, self.k, dtype=torch.long, device=self.device)

    def scores(self, phi: Tensor) -> Tensor:
        """Minus the squared distance to each expert's nearest centre (seeded centres only)."""
        distances = squared_distances(phi, self.centres.reshape(-1, self.features))
        distances = distances.masked_fill(self.sizes.reshape(-1) == 0, float("inf"))
        return -distances.view(len(phi), self.num_experts, self.k).min(dim=2).values

    def _update(self, phi: Tensor, ids: Tensor) -> None:
        for expert in torch.unique(ids).tolist():  # the experts of one batch: one or two
            self._update_expert(expert, phi[ids == expert].double())

    def _update_expert(self, expert: int, rows: Tensor) -> None:
        seeded = int((self.sizes[expert] > 0).sum())
        take = min(self.k - seeded, len(rows))
        if take:  # the expert's first samples seed its centres
            self.centres[expert, seeded:seeded + take] = rows[:take]
            self.sizes[expert, seeded:seeded + take] = 1
            rows = rows[take:]
        if not len(rows):
            return
        seeded += take
        centres, sizes = self.centres[expert, :seeded], self.sizes[expert, :seeded]
        nearest = squared_distances(rows, centres).argmin(dim=1)
        added = torch.bincount(nearest, minlength=seeded)
        sums = torch.zeros_like(centres).index_add_(0, nearest, rows)
        new_sizes = sizes + added
        centres += (sums - added.unsqueeze(1).double() * centres) / new_sizes.clamp(min=1).unsqueeze(1).double()
        sizes.copy_(new_sizes)

    def _tensors(self) -> Dict[str, Tensor]:
        return {"centres": self.centres, "sizes": self.sizes}
