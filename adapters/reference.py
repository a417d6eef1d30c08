"""Retrofit of methods that expose the fly-modules seam contract (``benchmarks.methods``), duck-typed.

The contract: ``compute_query``, ``select``, ``forward(x, *, expert=None, query=None)`` returning an
object with ``query.router``, ``selection`` and ``features``, plus ``bank_of``, ``banks_of_expert``,
``transform_logits``, ``get_classifier``, ``on_expert_start``, ``num_experts``, ``num_banks`` and
``predict(x, logit_mask)``. Nothing from ``benchmarks`` is imported.
"""

from __future__ import annotations

import types
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ._errors import missing_seam
from ._handle import Retrofit
from ._options import RetrofitOptions
from ._registry import SEAM_CONTRACT as REQUIRED
from ._registry import register_family

__all__ = ["retrofit", "REQUIRED"]


@register_family("reference", seam_contract=False)
def retrofit(model: nn.Module, options: RetrofitOptions) -> Retrofit:
    """Add the analytic router and/or the temporal ensemble to a seam-contract method.

    ``router``: at inference the router's expert restricts the method's own selection; it is fed the
    router features of each stream batch's first training forward. ``ensemble``: the method's
    classifier is the online head, ``predict`` ensembles it with the EMA copies of each sample's bank
    after the method's logit transform and the logit mask. Both off: outputs are bit-identical.
    """
    for name in REQUIRED:
        if not hasattr(model, name):
            raise missing_seam("reference", model, name, "part of the seam contract of benchmarks.methods.base")
    classifier = model.get_classifier()
    router = options.build_router(
        getattr(model, "router_dim", classifier.in_features), model.num_experts, classifier.weight.device
    )
    ensemble = options.build_ensemble(classifier, model.num_banks)
    current = int(getattr(model, "current_expert", 0))
    if ensemble is not None and model.banks_of_expert(current):
        ensemble.active_expert = int(model.banks_of_expert(current)[-1])  # retrofitting mid-run
    handle = Retrofit(
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
