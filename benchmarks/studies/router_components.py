"""A run's components with the routing study's routers beside them: :class:`WithRouters` wraps the
components a run already has (``benchmarks.ablation.components``), passes every call through, and feeds
the study's routers (:class:`benchmarks.studies.router_set.RouterSet`) the same router features and
expert the analytic router gets. Neither the method nor REAR nor TE2 sees a difference."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Sequence

import torch
from torch import Tensor

from .router_set import RouterSet

__all__ = ["WithRouters"]


class WithRouters:
    """``inner`` (a ``ScoredComponents``) plus the study's ``routers`` on its analytic router's expansion.

    The target of a batch is the expert the method trains (``model.current_expert``), the analytic
    router's target too. Seconds spent updating and routing are kept per router (``seconds``).
    """

    def __init__(self, inner: Any, model: Any, names: Sequence[str], *, seed: int) -> None:
        self.inner, self.model = inner, model
        expansion = inner.router.expansion
        self.routers = RouterSet(expansion, names, int(model.num_experts), seed=seed, device=expansion.weight.device)
        self.ensemble = inner.ensemble
        self.seconds: Dict[str, Dict[str, float]] = {
            name: {"update": 0.0, "updates": 0, "route": 0.0, "routed_batches": 0} for name in self.routers.names
        }

    @property
    def router(self) -> Any:
        return self.inner.router

    def start_expert(self, expert: int) -> None:
        self.inner.start_expert(expert)

    def after_optimizer_step(self, output: Any, parallel: Any) -> None:
        self.inner.after_optimizer_step(output, parallel)

    def end_batch(self, router_features: Tensor, parallel: Any) -> None:
        self.inner.end_batch(router_features, parallel)
        features = parallel.gather_rows(router_features.detach())
        if not len(features):
            return
        phi = self.routers.expand(features)
        for name, router in self.routers.routers.items():
            started = self._clock()
            router.update(phi, int(self.model.current_expert))
            self._add(name, "update", "updates", started)

    def route(self, router_features: Tensor) -> Optional[Tensor]:
        return self.inner.route(router_features)

    def route_all(self, router_features: Tensor) -> Dict[str, Tensor]:
        """``{router: (N,) experts}`` of every study router that has a sample."""
        phi = self.routers.expand(router_features)
        experts = {}
        for name, router in self.routers.routers.items():
            if bool((router.counts > 0).any()):
                started = self._clock()
                experts[name] = router.route(phi)
                self._add(name, "route", "routed_batches", started)
        return experts

    def _clock(self) -> float:
        if self.routers.expansion.weight.device.type == "cuda":
            torch.cuda.synchronize(self.routers.expansion.weight.device)
        return time.perf_counter()

    def _add(self, name: str, seconds: str, count: str, started: float) -> None:
        self.seconds[name][seconds] += self._clock() - started
        self.seconds[name][count] += 1

    def state_dict(self) -> Dict[str, Any]:
        return {**self.inner.state_dict(), "study_routers": self.routers.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        self.routers.load_state_dict(state.pop("study_routers"))
        self.inner.load_state_dict(state)
