"""Retrofit of methods that implement :class:`~fly_modules.adapters.SeamContract`.

The contract (``adapters/contract.py``) declares the seams this family drives: ``compute_query``,
``select``, ``forward(x, *, expert=None, query=None)`` returning an object with ``query.router``,
``selection`` and ``features``, ``bank_of``, ``banks_of_expert``, ``transform_logits``,
``get_classifier``, ``on_expert_start``, ``num_experts``, ``num_banks`` and ``predict(x, logit_mask)``.
:func:`build_handle` sizes the router and the ensemble from them; :func:`retrofit` adds the hooks.
"""

from __future__ import annotations

import types
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ._handle import Retrofit
from ._options import RetrofitOptions
from ._registry import register_family
from ._wiring import missing_seam
from .contract import SEAM_MEMBERS, SeamContract, missing_seams

__all__ = ["build_handle", "retrofit", "REQUIRED"]

#: The attributes the family needs (those of :class:`SeamContract`).
REQUIRED = SEAM_MEMBERS


def build_handle(model: SeamContract, options: RetrofitOptions) -> Retrofit:
    """The handle of a reference retrofit before any hook: the router and the ensemble sized from the seams.

    The router reads ``router_dim`` features (the classifier's input when the model declares none) and
    has ``num_experts`` experts; the ensemble wraps ``get_classifier()`` with ``num_banks`` banks, the
    last bank of the current expert active (a retrofit mid-run). :func:`retrofit` adds the hooks that
    feed the handle; a loop that feeds it itself calls ``record_trained_banks`` and ``update_ensemble``
    after each optimizer step and ``end_batch(query=...)`` after each batch.
    """
    missing = missing_seams(model)
    if missing:
        raise missing_seam("reference", model, missing[0], "part of fly_modules.adapters.SeamContract")
    classifier = model.get_classifier()
    router = options.build_router(
        getattr(model, "router_dim", classifier.in_features), model.num_experts, classifier.weight.device
    )
    ensemble = options.build_ensemble(classifier, model.num_banks)
    current = int(getattr(model, "current_expert", 0))
    if ensemble is not None and model.banks_of_expert(current):
        ensemble.active_expert = int(model.banks_of_expert(current)[-1])  # retrofitting mid-run
    return Retrofit(
        model,
        family="reference",
        router=router,
        ensemble=ensemble,
        schedule=options.schedule,
        start_method_expert=model.on_expert_start,
        banks_of_expert=model.banks_of_expert,
        current_expert=current,
        num_experts=int(model.num_experts),
    )


@register_family("reference", seam_contract=False)
def retrofit(model: nn.Module, options: RetrofitOptions) -> Retrofit:
    """Add the analytic router and/or the temporal ensemble to a seam-contract method.

    ``router``: at inference the router's expert restricts the method's own selection; it is fed the
    router features of each stream batch's first training forward. ``ensemble``: the method's
    classifier is the online head, ``predict`` ensembles it with the EMA copies of each sample's bank
    after the method's logit transform and the logit mask. Both off: outputs are bit-identical.
    """
    handle = build_handle(model, options)
    router, ensemble = handle.router, handle.ensemble
    handle.query_source = f"the forward of {type(model).__name__} (its frozen query pass)"
    handle._predict = lambda x: model.predict(x)
    if router is None and ensemble is None:
        return handle  # baseline variant: only the schedule is driven; the model is untouched

    def record(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if module.training and not handle.removed:
            handle.record_query(output.query.router)
            handle.record_trained_banks(module.bank_of(output.selection))

    handle.install.forward_hook(model, record, with_kwargs=True)

    if router is not None:
        def route_at_inference(module: nn.Module, args: Any, kwargs: Any) -> Any:
            if module.training or kwargs.get("expert") is not None or not handle.routing_active():
                return None
            query = kwargs.get("query")
            if query is None:
                query = module.compute_query(args[0] if args else kwargs["x"])
            experts = handle.route(query.router)
            handle.observed["routed"] = experts
            return args, {**kwargs, "query": query, "expert": experts}

        handle.install.forward_pre_hook(model, route_at_inference, with_kwargs=True)

    if ensemble is not None:
        handle.attach_optimizer(options.optimizer)

        @torch.no_grad()
        def predict(self: nn.Module, x: Tensor, logit_mask: Optional[Tensor] = None) -> Tensor:
            output = self(x)  # through the hooks: routed by the pre-hook when the router is on
            banks = self.bank_of(output.selection)
            handle.observed["banks"] = banks
            members = self.transform_logits(ensemble.member_logits(output.features, banks), output.selection)
            if logit_mask is not None:
                members = members + (logit_mask.unsqueeze(1) if logit_mask.ndim == 2 else logit_mask)
            return ensemble.aggregate_members(members)

        handle.install.set_attribute(model, "predict", types.MethodType(predict, model))
    return handle
