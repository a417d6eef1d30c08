"""Retrofit by explicit seams, for any codebase: the user names where the query, the routed keyword and
the classifier are. Each seam is checked before anything is installed (see ``docs/adapters.md``)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from torch import Tensor, nn

from ._family import AdapterFamily, Plan
from ._head import EnsembleLinear, ensemble_scores
from ._layout import Layout, QueryWhen, RouteValue
from ._query import default_query
from ._registry import register_family
from ._routed_call import route_target
from ._seams import SeamError, find_head

__all__ = ["Generic", "retrofit", "EnsembleLinear", "find_head", "ensemble_scores"]


def _head_seat(model: nn.Module, head_owner: Optional[nn.Module], head_name: Optional[str],
               ensemble: bool) -> Optional[Tuple[nn.Module, str]]:
    """``(parent, name)`` of the classifier the user named, or found on ``model`` / ``head_owner``; ``None``
    when none is named or found and the ensemble is off (the router needs no classifier)."""
    if head_owner is not None and head_name is not None:
        parent = head_owner
    else:
        try:
            parent, found = find_head(model if head_owner is None else head_owner)
        except SeamError:
            if ensemble or head_name is not None:
                raise
            return None
        head_name = head_name or found
    if not hasattr(parent, head_name):
        raise SeamError(
            f"fly_modules.adapters.generic: {type(parent).__name__} has no attribute `{head_name}` (head_name)"
        )
    return parent, head_name


class Generic(AdapterFamily):
    """Add the analytic router and/or the temporal ensemble to a model through explicit seams.

    The seams the user names: a query module, a routed keyword, the classifier, one bank per expert.

    Args:
        num_experts: router outputs = ensemble banks (one bank per expert).
        query_module: module whose forward output holds the query features (required with ``router``);
            a forward hook reads them (training: router statistics; inference: routing).
        query_from_output: maps that output to ``(B, D)`` features; default: the output itself, or
            ``output["pre_logits"]`` for dict outputs.
        query_when: ``query_when(args, kwargs)`` -> whether a call of ``query_module`` is the router's query
            (a module run several times per step, with and without prompts); default: every call.
        route_module, route_kwarg: the module whose argument ``route_kwarg`` restricts the method's
            selection (required with ``router``); its ``forward`` (or ``route_method``) must name the
            argument (one taken through ``**kwargs`` is refused). Passed at inference only, bound as Python
            binds the call: it replaces the argument whether the call passes it by position or keyword.
        route_method: route this method of ``route_module`` (default the model) instead of its forward
            (``route_method="interface"``); patched on the instance, restored by ``remove()``.
        route_value: ``route_value(expert_ids, module, args, kwargs)`` -> the injected value; default
            the ``(B,)`` long expert ids.
        head_owner, head_name: where the classifier lives; default: the model's ``get_classifier()`` /
            ``head`` / ``fc``. An ``nn.Linear`` (or a small module holding exactly one) becomes an
            :class:`EnsembleLinear` sharing its parameters: online logits in training, the ensemble's
            log-probabilities at inference. A pool of per-expert classifiers (an ``nn.ModuleList``, or a
            module holding one, grown by the method's own add-a-task call) gives each expert EMA copies of
            its own classifier; each classifier answers its ensemble on its logits' scale. Not needed with
            ``ensemble=False``.
        bank_from_output: ``(B,)`` bank ids from the output of ``route_module`` (which it then needs, with
            ``router=False`` too: it is the module hooked, nothing is routed); default: the routed expert
            at inference (the active bank when not routed), the current expert in training. It also shows
            ``verify`` which expert's prompts a forward used (training and routed inference).
        start_expert: the method's own expert start, called with the expert id; default: nothing.
        router_dim: width of the query features; default the classifier's ``in_features`` (required when no
            ``nn.Linear`` classifier gives it).
    """

    names = ("generic",)
    seam_contract = False

    def recognise(
        self,
        *,
        num_experts: int,
        query_module: Optional[nn.Module] = None,
        query_from_output: Optional[Callable[[Any], Tensor]] = None,
        query_when: Optional[QueryWhen] = None,
        route_module: Optional[nn.Module] = None,
        route_kwarg: Optional[str] = None,
        route_method: Optional[str] = None,
        route_value: Optional[RouteValue] = None,
        head_owner: Optional[nn.Module] = None,
        head_name: Optional[str] = None,
        bank_from_output: Optional[Callable[[Any], Tensor]] = None,
        start_expert: Optional[Callable[[int], None]] = None,
        router_dim: Optional[int] = None,
    ) -> Plan:
        head = _head_seat(self.model, head_owner, head_name, self.options.ensemble)
        if route_method is not None and route_module is None:
            route_module = self.model
        if route_module is not None:
            route_module, route_method = route_target(route_module, route_method, caller=self.caller)
        if self.options.router and (query_module is None or route_module is None or route_kwarg is None):
            missing = [n for n, v in (("query_module", query_module), ("route_module", route_module),
                                      ("route_kwarg", route_kwarg)) if v is None]
            raise SeamError(f"{self.caller}: router=True needs {', '.join(missing)}")
        if bank_from_output is not None and route_module is None:
            raise SeamError(
                f"{self.caller}: bank_from_output reads the bank ids from the output of route_module, the module it "
                "hooks (router=False too: nothing is routed); pass route_module=<the module whose output names the "
                "banks>, or drop bank_from_output for the default banks"
            )
        layout = _Seams(self, query_module, query_from_output or default_query, route_module, route_kwarg, route_value,
                        bank_from_output)
        layout.query_when, layout.route_method = query_when, route_method
        return Plan(head=head, num_experts=num_experts, layout=layout, start_expert=start_expert, router_dim=router_dim)


class _Seams(Layout):
    """The seams the user named."""

    def __init__(self, family: Generic, query_module: Optional[nn.Module], query_from_output: Callable[[Any], Tensor],
                 route_module: Optional[nn.Module], route_kwarg: Optional[str], route_value: Optional[RouteValue],
                 bank_from_output: Optional[Callable[[Any], Tensor]]) -> None:
        super().__init__(family)
        self.query_module, self.query_from_output = query_module, query_from_output
        self.route_module, self.route_kwarg, self.route_value = route_module, route_kwarg, route_value
        self.bank_from_output = bank_from_output

    def install_hooks(self) -> None:
        bank_from_output = self.bank_from_output
        if self.options.router:
            self.route_keyword(self.route_module, self.route_kwarg, method=self.route_method, value=self.route_value,
                               banks_follow_routing=bank_from_output is None, used_from_output=bank_from_output)
            self.read_query(self.query_module, self.query_from_output, "query_module", when=self.query_when)
        if bank_from_output is not None:
            self.read_banks(self.route_module, _BanksOfCall(self, bank_from_output))
        elif self.options.ensemble and not self.options.router:
            self.count_batches(self.model)


class _BanksOfCall:
    """The banks of each call of the route module; in training, also the expert whose prompts it trained."""

    def __init__(self, layout: _Seams, bank_from_output: Callable[[Any], Tensor]) -> None:
        self.layout, self.bank_from_output = layout, bank_from_output

    def __call__(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> Optional[Tensor]:
        banks = self.bank_from_output(output)
        record = self.layout.record
        if banks is not None and record.training:
            record.seen(trained=banks)
        return banks if self.layout.options.ensemble else None


retrofit = register_family(Generic)
