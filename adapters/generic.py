"""Retrofit by explicit seams, for any codebase: the user names where the query, the routed keyword and
the classifier are. Each seam is checked before anything is installed (see ``docs/adapters.md``)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import Tensor, nn

from ._handle import Retrofit
from ._options import RetrofitOptions
from ._registry import register_family
from ._wiring import EnsembleLinear, RouteValue, SeamError, Wiring, default_query, ensemble_scores, find_head

__all__ = ["retrofit", "EnsembleLinear", "find_head", "ensemble_scores"]


@register_family("generic", seam_contract=False)
def retrofit(
    model: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: int,
    query_module: Optional[nn.Module] = None,
    query_from_output: Optional[Callable[[Any], Tensor]] = None,
    route_module: Optional[nn.Module] = None,
    route_kwarg: Optional[str] = None,
    route_value: Optional[RouteValue] = None,
    head_owner: Optional[nn.Module] = None,
    head_name: Optional[str] = None,
    bank_from_output: Optional[Callable[[Any], Tensor]] = None,
    start_expert: Optional[Callable[[int], None]] = None,
    router_dim: Optional[int] = None,
) -> Retrofit:
    """Add the analytic router and/or the temporal ensemble to a model through explicit seams.

    Args:
        num_experts: router outputs = ensemble banks (one bank per expert).
        query_module: module whose forward output holds the query features (required with ``router``);
            a forward hook reads them (training: router statistics; inference: routing).
        query_from_output: maps that output to ``(B, D)`` features; default: the output itself, or
            ``output["pre_logits"]`` for dict outputs.
        route_module, route_kwarg: the module whose keyword argument ``route_kwarg`` restricts the
            method's selection (required with ``router``); its ``forward`` must name the argument
            (one taken through ``**kwargs`` is refused). Injected at inference only, by keyword.
        route_value: ``route_value(expert_ids, module, args, kwargs)`` -> the injected value; default
            the ``(B,)`` long expert ids.
        head_owner, head_name: where the ``nn.Linear`` classifier lives; default: the model's
            ``get_classifier()`` / ``head`` / ``fc``. It becomes an :class:`EnsembleLinear` sharing its
            parameters: online logits in training, the ensemble's log-probabilities at inference.
        bank_from_output: ``(B,)`` bank ids from the route module's output; default: the routed expert
            at inference (the active bank when not routed), the current expert in training.
        start_expert: the method's own expert start, called with the expert id; default: nothing.
        router_dim: width of the query features; default the classifier's ``in_features``.
    """
    if head_owner is None:
        head_owner, found = find_head(model)
        head_name = head_name or found
    elif head_name is None:
        head_owner, head_name = find_head(head_owner)
    if not hasattr(head_owner, head_name):
        raise SeamError(
            f"fly_modules.adapters.generic: {type(head_owner).__name__} has no attribute `{head_name}` (head_name)"
        )
    if options.router and (query_module is None or route_module is None or route_kwarg is None):
        missing = [n for n, v in (("query_module", query_module), ("route_module", route_module),
                                  ("route_kwarg", route_kwarg)) if v is None]
        raise SeamError(f"fly_modules.adapters.generic: router=True needs {', '.join(missing)}")
    if bank_from_output is not None and route_module is None:
        raise SeamError("fly_modules.adapters.generic: bank_from_output reads the route module's output; pass route_module")
    wiring = Wiring.create(
        model, "generic", options, classifier=getattr(head_owner, head_name), num_experts=num_experts,
        num_banks=num_experts, banks_of_expert=lambda expert: [int(expert)], start_expert=start_expert,
        router_dim=router_dim,
    )
    if not options.router and not options.ensemble:
        return wiring.handle
    if options.router:
        wiring.handle.query_source = f"the forward of {type(query_module).__name__} (query_module)"
        wiring.hook_route_module(
            route_module, route_kwarg=route_kwarg, route_value=route_value, query_from_call=None,
            banks_follow_routing=bank_from_output is None,
        )
        wiring.hook_query_module(query_module, query_from_output or default_query)
    if options.ensemble:
        if bank_from_output is not None:
            wiring.hook_banks(route_module, lambda mod, args, kwargs, output: bank_from_output(output))
        elif not options.router:
            wiring.hook_batch_size(model)
        wiring.swap_head(head_owner, head_name)
    return wiring.handle
