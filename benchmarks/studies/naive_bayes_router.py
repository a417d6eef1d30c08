"""Gaussian naive Bayes: each expert a diagonal Gaussian over the expanded features, prior its share of
the samples. Means and variances are kept as (count, mean, sum of squared deviations) and combined batch
by batch with the pairwise update of Chan, Golub and LeVeque, which is exact across processes and does
not lose the variance to cancellation as a sum of squares would."""

from __future__ import annotations

import math
from typing import Dict, Tuple

import torch
from torch import Tensor

from .expanded_router import ExpandedRouter

__all__ = ["GaussianNaiveBayesRouter", "combine_moments"]

Moments = Tuple[Tensor, Tensor, Tensor]  # (count (E, 1), mean (E, M), squared deviations (E, M))


def combine_moments(a: Moments, b: Moments) -> Moments:
    """The moments of the union of two sample sets (rows: experts)."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    safe = n.clamp(min=1)
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / safe)
    m2 = m2_a + m2_b + delta.square() * (n_a * n_b / safe)
    return n, mean, m2


class GaussianNaiveBayesRouter(ExpandedRouter):
    """Gaussian naive Bayes over experts, in float64.

    Args:
        var_smoothing: added to every variance, times the largest variance of a feature over all
            samples (scikit-learn's ``GaussianNB`` rule), so that a feature constant within an expert
            (a ReLU that never fires) keeps a finite likelihood.
    """

    name = "naive_bayes"

    def __init__(self, features: int, num_experts: int, device="cpu", *, var_smoothing: float = 1e-9) -> None:
        super().__init__(features, num_experts, device)
        self.var_smoothing = float(var_smoothing)
        zeros = dict(dtype=torch.float64, device=self.device)
        self.means = torch.zeros(self.num_experts, self.features, **zeros)
        self.squares = torch.zeros(self.num_experts, self.features, **zeros)

    def _moments(self) -> Moments:
        return self.counts.double().unsqueeze(1), self.means, self.squares

    def variances(self) -> Tensor:
        """``(num_experts, features)`` smoothed variances (maximum-likelihood, plus the smoothing)."""
        n, means, squares = self._moments()
        total = n.sum().clamp(min=1)
        grand = (n * means).sum(0) / total
        pooled = (squares.sum(0) + (n * (means - grand).square()).sum(0)) / total  # variance of all samples
        epsilon = self.var_smoothing * float(pooled.max())
        return squares / n.clamp(min=1) + epsilon

    def scores(self, phi: Tensor) -> Tensor:
        """Joint log-likelihood ``log P(e) + sum_j log N(phi_j; mu_ej, var_ej)``."""
        x = phi.double()
        var = self.variances()
        inverse = var.reciprocal()
        quadratic = x.square() @ inverse.T - 2 * x @ (self.means * inverse).T + (self.means.square() * inverse).sum(1)
        log_norm = -0.5 * (var.log().sum(1) + self.features * math.log(2 * math.pi))
        prior = (self.counts.double() / self.counts.sum().clamp(min=1)).log()
        return prior + log_norm - 0.5 * quadratic

    def _update(self, phi: Tensor, ids: Tensor) -> None:
        x = phi.double()
        n_b = torch.bincount(ids, minlength=self.num_experts).double().unsqueeze(1)
        mean_b = torch.zeros_like(self.means).index_add_(0, ids, x) / n_b.clamp(min=1)
        m2_b = torch.zeros_like(self.squares).index_add_(0, ids, (x - mean_b[ids]).square())
        n_a = (self.counts.double().unsqueeze(1) - n_b)  # counts already include the batch
        _, self.means, self.squares = combine_moments((n_a, self.means, self.squares), (n_b, mean_b, m2_b))

    def _merge(self, other: "GaussianNaiveBayesRouter") -> None:
        theirs = (other.counts.double().unsqueeze(1), other.means.to(self.device), other.squares.to(self.device))
        _, self.means, self.squares = combine_moments(self._moments(), theirs)

    def _tensors(self) -> Dict[str, Tensor]:
        return {"means": self.means, "squares": self.squares}
