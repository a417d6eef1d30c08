"""The analytic router (REAR) and the temporal ensemble (TE2) a run evaluates its variants with.

Three ways to have them, one interface (``start_expert``, ``after_optimizer_step``, ``end_batch``,
``route``, ``ensemble``) that the training loop calls at fixed points:

* :class:`AddedComponents` trains both beside a method that has neither, making the calls
  ``fly_modules.adapters.reference`` makes, so that every variant is scored on one trained model;
* :class:`BuiltinComponents` reads the ones a method trains itself (FlyPrompt's, through its hooks);
* :class:`RetrofitComponents` adds the requested ones with ``fly_modules.adapters.reference`` itself:
  one variant per training, the reference the one-training evaluation is tested against.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from fly_modules.adapters import reference as reference_adapter
from torch import Tensor

from fly_modules import AnalyticRouter, TemporalEnsembleHead

from ..methods.base import MethodOutput, PromptMethod
from ..parallel import BatchShare

__all__ = ["AddedComponents", "BuiltinComponents", "RetrofitComponents"]


class AddedComponents:
    """REAR and TE2 trained beside ``model``: the router on each batch's router features with the
    current expert as target, the ensemble's copies of the banks each optimizer step trained.

    Args:
        model: the method (seam contract of ``benchmarks.methods.base``); its classifier is TE2's online head.
        expansion_dim, ridge, seed: the router's.
        decays, aggregate: the ensemble's.
    """

    def __init__(
        self, model: PromptMethod, *, expansion_dim: int, ridge: Any, seed: int, decays: Any, aggregate: str
    ) -> None:
        self.model = model
        classifier = model.get_classifier()
        # The reference adapter's sizes: the method's router_dim if it declares one, else the head's input.
        self.router = AnalyticRouter(
            int(getattr(model, "router_dim", classifier.in_features)), model.num_experts,
            expansion_dim=expansion_dim, ridge=ridge, seed=seed, device=classifier.weight.device,
        )
        self.ensemble = TemporalEnsembleHead(classifier, model.num_banks, decays=decays, aggregate=aggregate)
        banks = model.banks_of_expert(int(model.current_expert))
        if banks:
            self.ensemble.active_expert = int(banks[-1])

    def start_expert(self, expert: int) -> None:
        """The method's own start, then fresh copies of the expert's banks (the adapter's order)."""
        self.model.on_expert_start(expert)
        for bank in self.model.banks_of_expert(expert):
            self.ensemble.start_expert(int(bank))

    def after_optimizer_step(self, output: MethodOutput, parallel: BatchShare) -> None:
        """One EMA step of the banks this step trained (their union over the processes)."""
        banks = self.model.bank_of(output.selection).detach()
        if parallel.group is not None:
            banks = parallel.gather_rows(banks.reshape(-1))
        self.ensemble.update(banks)

    def end_batch(self, router_features: Tensor, parallel: BatchShare) -> None:
        """Add the batch (all processes' rows) to the router, with the current expert as target."""
        features = parallel.gather_rows(router_features.detach())
        self.router.update(features.to(self.router.device), int(self.model.current_expert))

    def route(self, router_features: Tensor) -> Optional[Tensor]:
        """``(B,)`` REAR's experts; ``None`` (the method's own selection) while the router has no sample."""
        if self.router.num_samples == 0:
            return None
        return self.router.route(router_features.to(self.router.device))

    def state_dict(self) -> Dict[str, Any]:
        return {"router": self.router.state_dict(), "ensemble": self.ensemble.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.router.load_state_dict(state["router"])
        self.ensemble.load_state_dict(state["ensemble"])


class BuiltinComponents:
    """The router and ensemble a method trains itself (``builtin_components``): read, never driven.

    The method's own selection is its router's, so :meth:`route` defers to it.
    """

    def __init__(self, model: PromptMethod) -> None:
        self.model = model
        self.router: AnalyticRouter = model.router
        self.ensemble: TemporalEnsembleHead = model.ensemble

    def start_expert(self, expert: int) -> None:
        self.model.on_expert_start(expert)

    def after_optimizer_step(self, output: MethodOutput, parallel: BatchShare) -> None:
        """Nothing: the method's ``on_optimizer_step`` moves its ensemble."""

    def end_batch(self, router_features: Tensor, parallel: BatchShare) -> None:
        """Nothing: the method's ``on_batch_end`` feeds its router."""

    def route(self, router_features: Tensor) -> Optional[Tensor]:
        return None

    def state_dict(self) -> Dict[str, Any]:
        return {}  # in the method's own state dict

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        pass


class RetrofitComponents:
    """One variant's components added by ``fly_modules.adapters.reference.retrofit`` (one process).

    Evaluation goes through the retrofitted ``model.predict``; :meth:`remove` undoes the retrofit.
    """

    def __init__(
        self, model: PromptMethod, *, router: bool, ensemble: bool, expansion_dim: int, ridge: Any, seed: int,
        decays: Any, aggregate: str, device: torch.device,
    ) -> None:
        self.model = model
        self.handle = reference_adapter.retrofit(
            model, router=router, ensemble=ensemble, optimizer=None, schedule=None, expansion_dim=expansion_dim,
            ridge=ridge, seed=seed, decays=decays, aggregate=aggregate,
        )
        if self.handle.router is not None:
            self.handle.router.to(device)
        self.ensemble = self.handle.ensemble

    def start_expert(self, expert: int) -> None:
        self.handle.start_expert(expert)

    def after_optimizer_step(self, output: MethodOutput, parallel: BatchShare) -> None:
        self.handle.update_ensemble()

    def end_batch(self, router_features: Tensor, parallel: BatchShare) -> None:
        self.handle.end_batch(query=router_features)

    def route(self, router_features: Tensor) -> Optional[Tensor]:
        return None  # the retrofit routes inside model.predict

    def remove(self) -> None:
        self.handle.remove()

    def state_dict(self) -> Dict[str, Any]:
        parts = {"router": self.handle.router, "ensemble": self.handle.ensemble}
        return {name: part.state_dict() for name, part in parts.items() if part is not None}
