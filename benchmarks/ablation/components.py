"""The analytic router (REAR) and the temporal ensemble (TE2) a run evaluates its variants with.

Three ways to have them behind one interface, :class:`Components`, that the training loop calls at
fixed points (:class:`ScoredComponents` adds what the one-training evaluation reads):

* :class:`AddedComponents` trains both beside a method that has neither, through the handle the
  reference adapter builds for it (``fly_modules.adapters.reference.build_handle``), without its hooks,
  so that every variant is scored on one trained model;
* :class:`BuiltinComponents` reads the ones a method trains itself (FlyPrompt's, through its hooks);
* :class:`RetrofitComponents` adds the requested ones with ``fly_modules.adapters.reference.retrofit``:
  one variant per training, the reference the one-training evaluation is tested against.
"""

from __future__ import annotations

from typing import Any, Dict, Literal, Optional, Protocol, Union

import torch
from fly_modules.adapters import RetrofitOptions
from fly_modules.adapters import reference as reference_adapter
from torch import Tensor

from fly_modules import AnalyticRouter, TemporalEnsembleHead

from ..methods.base import MethodOutput, PromptMethod
from ..parallel import BatchShare

__all__ = ["AddedComponents", "BuiltinComponents", "Components", "RetrofitComponents", "ScoredComponents"]


class Components(Protocol):
    """What ``OnlineTrainer`` calls: at an expert's start, after each optimizer step, after each batch."""

    def start_expert(self, expert: int) -> None:
        """The method's own start of ``expert``, then fresh ensemble copies of its banks."""
        ...

    def after_optimizer_step(self, output: MethodOutput, parallel: BatchShare) -> None:
        """One EMA step of the banks ``output`` trained."""
        ...

    def end_batch(self, router_features: Tensor, parallel: BatchShare) -> None:
        """The batch's router features (this process's rows) into the router, the current expert as target."""
        ...

    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state: Dict[str, Any]) -> None: ...


class ScoredComponents(Components, Protocol):
    """Components that ``VariantEvaluator`` scores every variant with, from one training."""

    ensemble: TemporalEnsembleHead

    def route(self, router_features: Tensor) -> Optional[Tensor]:
        """``(B,)`` REAR's experts; ``None`` where the method's own selection stands for them."""
        ...


class AddedComponents:
    """REAR and TE2 trained beside ``model``: the router on each batch's router features with the
    current expert as target, the ensemble's copies of the banks each optimizer step trained.

    Both are the reference adapter's (:func:`fly_modules.adapters.reference.build_handle`, same sizes,
    same calls); the handle is fed here instead of by hooks, so ``model`` keeps its own inference and
    the evaluation chooses the selection and the head of each variant. Rows are gathered over the
    processes of a data-parallel run before they reach the handle.

    Args:
        model: the method (:class:`~fly_modules.adapters.SeamContract`); its classifier is TE2's online head.
        expansion_dim, ridge, seed: the router's. A method stating a ``router_refusal`` gets none: no variant
            of it is routed, so statistics fed every batch (an ``M x M`` float64 ``G``) would serve nothing.
        decays, aggregate: the ensemble's.
    """

    def __init__(
        self, model: PromptMethod, *, expansion_dim: int, ridge: Union[float, Literal["auto"]], seed: int, decays: Any,
        aggregate: str
    ) -> None:
        self.model = model
        options = RetrofitOptions(
            router=not getattr(model, "router_refusal", ""), optimizer=None, schedule=None,
            expansion_dim=expansion_dim, ridge=ridge, seed=seed, decays=decays, aggregate=aggregate,
            distributed=False,  # the rows and banks arrive gathered (BatchShare), once
        )
        self.handle = reference_adapter.build_handle(model, options)
        self.router: Optional[AnalyticRouter] = self.handle.router
        self.ensemble: TemporalEnsembleHead = self.handle.ensemble

    def start_expert(self, expert: int) -> None:
        self.handle.start_expert(expert)

    def after_optimizer_step(self, output: MethodOutput, parallel: BatchShare) -> None:
        """One EMA step of the banks this step trained (their union over the processes)."""
        banks = self.model.bank_of(output.selection).detach()
        if parallel.group is not None:
            banks = parallel.gather_rows(banks.reshape(-1))
        self.handle.record_trained_banks(banks)
        self.handle.update_ensemble()

    def end_batch(self, router_features: Tensor, parallel: BatchShare) -> None:
        """Add the batch (all processes' rows) to the router, with the current expert as target."""
        self.handle.end_batch(query=parallel.gather_rows(router_features.detach()))

    def route(self, router_features: Tensor) -> Optional[Tensor]:
        """``(B,)`` REAR's experts; ``None`` (the method's own selection) while the router has no sample."""
        return self.handle.route(router_features) if self.handle.routing_active() else None

    def state_dict(self) -> Dict[str, Any]:
        router = {} if self.router is None else {"router": self.router.state_dict()}
        return {**router, "ensemble": self.ensemble.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if self.router is not None:
            self.router.load_state_dict(state["router"])
        self.ensemble.load_state_dict(state["ensemble"])
        # The router's target: the expert the restored method trains (the model is loaded first).
        self.handle.current_expert = int(self.model.current_expert)


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
        self, model: PromptMethod, *, router: bool, ensemble: bool, expansion_dim: int,
        ridge: Union[float, Literal["auto"]], seed: int, decays: Any, aggregate: str, device: torch.device,
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

    def remove(self) -> None:
        self.handle.remove()

    def state_dict(self) -> Dict[str, Any]:
        parts = {"router": self.handle.router, "ensemble": self.handle.ensemble}
        return {name: part.state_dict() for name, part in parts.items() if part is not None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        parts = {"router": self.handle.router, "ensemble": self.handle.ensemble}
        for name, part in parts.items():
            if part is not None:
                part.load_state_dict(state[name])
        self.handle.current_expert = int(self.model.current_expert)
