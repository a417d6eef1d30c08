"""Retrofit of methods that implement :class:`~fly_modules.adapters.SeamContract`.

The contract (``adapters/contract.py``) declares the seams this family drives: ``compute_query``,
``select``, ``forward(x, *, expert=None, query=None)`` returning an object with ``query.router``,
``selection`` and ``features``, ``bank_of``, ``banks_of_expert``, ``transform_logits``,
``get_classifier``, ``on_expert_start``, ``num_experts``, ``num_banks`` and ``predict(x, logit_mask)``.
:func:`build_handle` sizes the router and the ensemble from them; :func:`retrofit` adds the hooks
(:class:`Reference`).
"""

from __future__ import annotations

import types
from typing import Any, Mapping, Optional

import torch
from torch import Tensor, nn

from ._family import AdapterFamily, Plan
from ._handle import Retrofit
from ._layout import Layout
from ._options import RetrofitOptions
from ._registry import register_family
from ._seams import SeamError
from .contract import SEAM_MEMBERS, SeamContract, missing_seams

__all__ = ["Reference", "build_handle", "retrofit", "REQUIRED"]

#: The attributes the family needs (those of :class:`SeamContract`).
REQUIRED = SEAM_MEMBERS


#: retrofit option -> the method attribute stating why that component cannot serve the method ("" when it can)
REFUSALS = (("router", "router_refusal"), ("ensemble", "ensemble_refusal"))


class Reference(AdapterFamily):
    """Add the analytic router and/or the temporal ensemble to a seam-contract method.

    The seams a :class:`SeamContract` method declares: the router restricts its ``forward(expert=...)``,
    its ``predict`` ensembles the banks of its selection.

    ``router``: at inference the router's expert restricts the method's own selection; it is fed the
    router features of each stream batch's first training forward. ``ensemble``: the method's
    classifier is the online head, ``predict`` ensembles it with the EMA copies of each sample's bank
    after the method's logit transform and the logit mask. Both off: outputs are bit-identical.
    """

    names = ("reference",)
    seam_contract = False

    @classmethod
    def retrofit(cls, model: nn.Module, options: RetrofitOptions, family_options: Mapping[str, Any],
                 method: Optional[str] = None) -> Retrofit:
        """As every family's, but a component is refused for a method stating why it cannot serve it
        (:data:`REFUSALS`: ``router_refusal``, its experts cannot be chosen per sample; ``ensemble_refusal``,
        no prediction reads the head EMA copies would follow). :func:`build_handle` builds what its
        options ask for: a benchmark asks for no router for a method with a ``router_refusal`` and skips
        the refused variants itself."""
        for option, attribute in REFUSALS:
            reason = getattr(model, attribute, "")
            if getattr(options, option) and reason:
                raise SeamError(f"fly_modules.adapters.reference: {option}=True refused for {type(model).__name__}: "
                                f"{reason}; retrofit it with {option}=False")
        return super().retrofit(model, options, family_options, method)

    def recognise(self) -> Plan:
        model = self.model
        missing = missing_seams(model)
        if missing:
            raise self.missing_seam(missing[0], "part of fly_modules.adapters.SeamContract")
        return Plan(
            num_experts=int(model.num_experts), head=model.get_classifier(), layout=_Contract(self),
            num_banks=model.num_banks, banks_of_expert=model.banks_of_expert, start_expert=model.on_expert_start,
            router_dim=getattr(model, "router_dim", None), current_expert=int(getattr(model, "current_expert", 0)),
            inference=lambda x: model.predict(x),
        )


class _Contract(Layout):
    """The declared seams: a hook reading each training forward's output, a pre-hook routing inference, and
    ``predict`` replaced by the ensemble of each sample's bank."""

    def install_hooks(self) -> None:
        self.install.forward_hook(self.model, self.training_forward, with_kwargs=True)
        if self.handle.router is not None:
            self.install.forward_pre_hook(self.model, self.route_at_inference, with_kwargs=True)
        self.record.query_source = f"the forward of {type(self.model).__name__} (its frozen query pass)"

    def training_forward(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if self.record.training:
            self.record.seen(query=output.query.router, banks=module.bank_of(output.selection))

    def route_at_inference(self, module: nn.Module, args: Any, kwargs: Any) -> Any:
        record = self.record
        if record.training or kwargs.get("expert") is not None or not record.routing_active():
            return None
        query = kwargs.get("query")
        if query is None:
            query = module.compute_query(args[0] if args else kwargs["x"])
        experts = record.route(query.router)
        return args, {**kwargs, "query": query, "expert": experts}

    def swap_head(self) -> None:
        """The method's ``predict`` is replaced (the classifier stays): the ensemble of each sample's bank."""
        handle, ensemble = self.handle, self.handle.ensemble

        @torch.no_grad()
        def predict(model: nn.Module, x: Tensor, logit_mask: Optional[Tensor] = None) -> Tensor:
            output = model(x)  # through the hooks: routed by the pre-hook when the router is on
            banks = model.bank_of(output.selection)
            handle.record.ensembled = banks
            members = model.transform_logits(ensemble.member_logits(output.features, banks), output.selection)
            if logit_mask is not None:
                members = members + (logit_mask.unsqueeze(1) if logit_mask.ndim == 2 else logit_mask)
            return ensemble.aggregate_members(members)

        self.install.set_attribute(self.model, "predict", types.MethodType(predict, self.model))


def build_handle(model: SeamContract, options: RetrofitOptions) -> Retrofit:
    """The handle of a reference retrofit before any hook: the router and the ensemble sized from the seams.

    The router reads ``router_dim`` features (the classifier's input when the model declares none) and
    has ``num_experts`` experts; the ensemble wraps ``get_classifier()`` with ``num_banks`` banks, the
    last bank of the current expert active (a retrofit mid-run). :func:`retrofit` adds the hooks that
    feed the handle; a loop that feeds it itself calls ``record_trained_banks`` and ``update_ensemble``
    after each optimizer step and ``end_batch(query=...)`` after each batch.
    """
    family = Reference(model, options)
    return family.create_handle(family.recognise())


retrofit = register_family(Reference)
