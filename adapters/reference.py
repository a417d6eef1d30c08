"""Retrofit for methods that expose the fly-modules seam contract (``benchmarks.methods``).

Duck-typed: any model with ``compute_query``, ``select``, ``forward(x, *, expert=None, query=None)``
returning an object with ``query.router``, ``selection`` and ``features``, plus ``bank_of``,
``banks_of_expert``, ``transform_logits``, ``get_classifier``, ``on_expert_start``, ``num_experts``,
``num_banks`` and ``predict(x, logit_mask)``. Nothing from ``benchmarks`` is imported.

What each flag changes (reference-protocol section 4.9):

* ``router=True``: at inference the router's expert restricts the method's own selection
  (DualPrompt: key match inside the routed step's slots; MVP/HiDe: the expert is the prompt / task).
  The router is fed, once per stream batch (:meth:`Retrofit.end_batch`), the router features of the
  batch's first training forward -- the frozen prompt-free pass the method runs anyway -- with the
  current expert as target. Training-time selection is unchanged.
* ``ensemble=True``: a :class:`~fly_modules.TemporalEnsembleHead` shares the method's classifier as its
  online head (training logits are unchanged), keeps EMA copies per bank, moves the banks the batch
  trained after each optimizer step, and ensembles ``[online, copies of each sample's bank]`` at
  inference after the method's logit transform and the logit mask.
"""

from __future__ import annotations

import types
from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

from fly_modules import AnalyticRouter, TemporalEnsembleHead

from ._core import Retrofit, Schedule, missing_seam, set_instance_attribute, undo_on_failure

__all__ = ["retrofit", "REQUIRED"]

REQUIRED = (
    "compute_query", "select", "bank_of", "banks_of_expert", "transform_logits", "get_classifier",
    "on_expert_start", "num_experts", "num_banks", "predict",
)


@undo_on_failure
def retrofit(
    model: nn.Module,
    *,
    router: bool = True,
    ensemble: bool = True,
    optimizer: Optional[torch.optim.Optimizer] = None,
    schedule: Schedule = None,
    expansion_dim: int = 10_000,
    ridge: Any = 1e4,
    seed: int = 0,
    decays: Sequence[float] = (0.9, 0.99),
    aggregate: str = "softmax_max",
) -> Retrofit:
    """Add the analytic router and/or the temporal ensemble to a seam-contract method.

    Args:
        model: the method (e.g. ``benchmarks.methods.create_method("dualprompt", ...)``).
        router, ensemble: which component to add; both ``False`` leaves outputs bit-identical.
        optimizer: the optimizer that trains ``model``; the EMA copies move after each of its steps.
            Without it, call ``handle.update_ensemble()`` after each step.
        schedule: when experts start (``SampleBudgetSchedule`` via ``end_batch``, ``SessionSchedule``
            via ``start_session``); ``None``: only through ``handle.start_expert``.
        expansion_dim, ridge, seed: the router's (paper: 10,000, 1e4).
        decays, aggregate: the ensemble's (paper: (0.9, 0.99), ``"softmax_max"``).
    """
    for name in REQUIRED:
        if not hasattr(model, name):
            raise missing_seam("reference", model, name, "part of the seam contract of benchmarks.methods.base")
    classifier = model.get_classifier()
    added_router = None
    if router:
        device = classifier.weight.device
        added_router = AnalyticRouter(
            int(getattr(model, "router_dim", classifier.in_features)), model.num_experts,
            expansion_dim=expansion_dim, ridge=ridge, seed=seed, device=device,
        )
    added_ensemble = TemporalEnsembleHead(classifier, model.num_banks, decays=decays, aggregate=aggregate) if ensemble else None
    current = int(getattr(model, "current_expert", 0))
    if added_ensemble is not None and model.banks_of_expert(current):
        added_ensemble.active_expert = int(model.banks_of_expert(current)[-1])  # retrofitting mid-run
    handle = Retrofit(
        model,
        router=added_router,
        ensemble=added_ensemble,
        schedule=schedule,
        start_method_expert=model.on_expert_start,
        banks_of_expert=model.banks_of_expert,
        current_expert=current,
        num_experts=int(model.num_experts),
    )
    if not router and not ensemble:
        # Baseline variant: only the schedule is driven; the model is untouched.
        return handle

    def record(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if module.training and not handle.removed:
            handle.record_query(output.query.router)
            handle.record_trained_banks(module.bank_of(output.selection))

    handle.add_handle(model.register_forward_hook(record, with_kwargs=True))

    if router:
        def route_at_inference(module: nn.Module, args: Any, kwargs: Any) -> Any:
            if module.training or kwargs.get("expert") is not None or not handle.routing_active():
                return None
            query = kwargs.get("query")
            if query is None:
                query = module.compute_query(args[0] if args else kwargs["x"])
            return args, {**kwargs, "query": query, "expert": handle.route(query.router)}

        handle.add_handle(model.register_forward_pre_hook(route_at_inference, with_kwargs=True))

    if ensemble:
        handle.attach_optimizer(optimizer)

        @torch.no_grad()
        def predict(self: nn.Module, x: Tensor, logit_mask: Optional[Tensor] = None) -> Tensor:
            output = self(x)  # through the hooks: routed by the pre-hook when the router is on
            banks = self.bank_of(output.selection)
            members = self.transform_logits(added_ensemble.member_logits(output.features, banks), output.selection)
            if logit_mask is not None:
                members = members + (logit_mask.unsqueeze(1) if logit_mask.ndim == 2 else logit_mask)
            return added_ensemble.aggregate_members(members)

        set_instance_attribute(handle, model, "predict", types.MethodType(predict, model))
    return handle
