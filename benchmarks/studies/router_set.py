"""The routers of the routing study, trained beside the analytic router on its random expanded features.

``ROUTERS`` names every algorithm of the paper's routing table; ``ridge`` is the analytic router the run
already has (REAR), the others are built here. :class:`RouterSet` expands each batch once with the
analytic router's own expansion and feeds every other router the same features and expert.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Union

import torch
from torch import Tensor

from .expanded_router import ExpandedRouter
from .kmeans_router import KMeansRouter
from .mlp_router import MLPRouter
from .naive_bayes_router import GaussianNaiveBayesRouter
from .prototype_router import PrototypeRouter

__all__ = ["ROUTERS", "RIDGE", "RouterSet", "check_router_names"]

RIDGE = "ridge"
#: router name -> class (``ridge``: the run's own AnalyticRouter, not built here)
ROUTERS: Dict[str, Any] = {
    RIDGE: None, PrototypeRouter.name: PrototypeRouter, GaussianNaiveBayesRouter.name: GaussianNaiveBayesRouter,
    MLPRouter.name: MLPRouter, KMeansRouter.name: KMeansRouter,
}


def check_router_names(names: Sequence[str]) -> list:
    """``names`` in the table's order, each once; an unknown name raises."""
    unknown = [name for name in names if name not in ROUTERS]
    if unknown:
        raise ValueError(f"unknown routers {unknown}; expected some of {list(ROUTERS)}")
    return [name for name in ROUTERS if name in names]


class RouterSet:
    """The study's routers other than ``ridge``, on the expansion of the run's analytic router.

    Args:
        expansion: the analytic router's :class:`fly_modules.RandomExpansion` (shared, not copied).
        names: routers of :data:`ROUTERS` (``ridge`` is skipped: the run scores it already).
        num_experts: experts of the method.
        seed: the MLP's initialisation.
    """

    def __init__(self, expansion: Any, names: Sequence[str], num_experts: int, *, seed: int = 0,
                 device: Union[str, torch.device] = "cpu") -> None:
        self.expansion = expansion
        self.routers: Dict[str, ExpandedRouter] = {}
        for name in check_router_names(names):
            if name == RIDGE:
                continue
            extra = {"seed": seed} if name == MLPRouter.name else {}
            self.routers[name] = ROUTERS[name](expansion.output_dim, num_experts, device, **extra)

    @property
    def names(self):
        return list(self.routers)

    def expand(self, features: Tensor) -> Tensor:
        """``phi`` of a batch of router features, in the analytic router's dtype (float64)."""
        with torch.no_grad():
            return self.expansion(features)

    def update(self, features: Tensor, expert: Union[int, Tensor]) -> None:
        """One batch (every process's rows) with its expert, into every router."""
        if not self.routers or len(features) == 0:
            return
        phi = self.expand(features)
        for router in self.routers.values():
            router.update(phi, expert)

    def route(self, features: Tensor) -> Dict[str, Tensor]:
        """``{name: (N,) experts}`` of every router that has a sample."""
        trained = {name: router for name, router in self.routers.items() if bool((router.counts > 0).any())}
        if not trained:
            return {}
        phi = self.expand(features)
        return {name: router.route(phi) for name, router in trained.items()}

    def state_dict(self) -> Dict[str, Any]:
        return {name: router.state_dict() for name, router in self.routers.items()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if set(state) != set(self.routers):
            raise ValueError(f"RouterSet.load_state_dict: the state holds routers {sorted(state)}, "
                             f"this set {sorted(self.routers)}")
        for name, router in self.routers.items():
            router.load_state_dict(state[name])
