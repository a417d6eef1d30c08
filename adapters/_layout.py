"""What a family's recognise finds and wires: a :class:`Layout` is where one upstream layout keeps its
experts, and the hook points its hooks are written with.

The protocol every layout follows (PoolFamily's prompt pools, HiDe's three layouts, one layout per
single-layout family alike):

* :meth:`Layout.matches` tells whether a model (or module) has this layout; a family with several layouts
  takes the first that matches;
* :meth:`Layout.check` adds the layout's own seam checks to the family's plan, before anything is installed;
* :meth:`Layout.install_hooks` installs the hooks (called only when the router or the ensemble is on);
* :meth:`Layout.swap_head` puts the ensemble in the classifier's place (called only when the ensemble is on;
  default: the plan's head becomes an :class:`~fly_modules.adapters.EnsembleLinear`).

The hook points, all writing to the retrofit's one :class:`~fly_modules.adapters._record.Record`
(:attr:`Layout.record`):

* a query source: :meth:`~Layout.read_query` (a module's output), :meth:`~Layout.query_class_token`
  (the prompt-free class token), or ``record.seen(query=...)`` from a wrapper of the layout's own;
* a route target: :meth:`~Layout.route_keyword` (a module's keyword argument), or a routed call of the
  layout's own that asks ``record.route(features)`` and runs once per expert group (``_groups``);
* the banks a forward used: :meth:`~Layout.read_banks`, or ``record.seen(size, banks=..., trained=...)``.

Hooks and wrappers check nothing about removal: once ``handle.remove()`` ran (a deep copy of the model keeps
them), the installation makes a hook do nothing and a replaced method run the original.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ._handle import Retrofit
from ._head import EnsembleLinear, ensemble_scores
from ._options import RetrofitOptions
from ._query import ClassToken, first_tensor
from ._record import Record
from ._restore import Installation, shared

__all__ = ["Layout"]

QueryFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any]], Optional[Tensor]]
BankFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any], Any], Optional[Tensor]]
RouteValue = Callable[[Tensor, nn.Module, Tuple[Any, ...], Dict[str, Any]], Any]
UsedFromOutput = Callable[[Any], Optional[Tensor]]


class Layout:
    """Where one layout keeps its experts, and its hooks. Built by the family's ``recognise`` (which keeps
    on it what it found: modules, slots, original methods) and carried by the :class:`Plan`; a subclass
    writes :meth:`install_hooks`, and :meth:`matches`, :meth:`check` or :meth:`swap_head` where the
    defaults do not fit.

    Attributes:
        family: the :class:`~fly_modules.adapters.AdapterFamily` retrofitting the model (its ``model``,
            ``options``, name and, once installed, ``handle``; the family imports this module, not the reverse).
    """

    def __init__(self, family: Any) -> None:
        self.family = family

    # ------------------------------------------------------------------------------------ the protocol
    @classmethod
    def matches(cls, owner: Any) -> bool:
        """Whether ``owner`` (the model, or the module the family looks at) has this layout."""
        return True

    def check(self, plan: Any) -> Any:
        """``plan`` with this layout's seam checks done (and the corrections it needs); nothing installed."""
        return plan

    def install_hooks(self) -> None:
        """Install the hooks (called only when the router or the ensemble is on)."""
        raise NotImplementedError(f"{type(self).__name__} must define install_hooks(self)")

    def swap_head(self) -> None:
        """Put the ensemble in the classifier's place (called only when the ensemble is on)."""
        self.replace_head(*self.family.plan.head)

    # ----------------------------------------------------------------------------------- the family's
    @property
    def model(self) -> nn.Module:
        return self.family.model

    @property
    def options(self) -> RetrofitOptions:
        return self.family.options

    @property
    def handle(self) -> Retrofit:
        return self.family.handle

    @property
    def caller(self) -> str:
        """``fly_modules.adapters.<method>``, which starts every message of the family."""
        return self.family.caller

    @property
    def install(self) -> Installation:
        """Where hooks and attribute swaps go (undone by ``handle.remove()``; once removed, a hook does
        nothing and a replaced method runs the original)."""
        return self.family.installation

    @property
    def record(self) -> Record:
        """What the hooks write: the stream batch, the forward in progress, what the model used."""
        return self.handle.record

    # ------------------------------------------------------------------------------ the head swap
    def replace_head(
        self, parent: nn.Module, name: str, scorer: Optional[Callable[[Tensor], Tensor]] = None,
        is_training: Optional[Callable[[], bool]] = None,
    ) -> None:
        """Replace ``parent.name`` by an :class:`EnsembleLinear` (undone by ``remove()``).

        The default scorer ensembles the banks the forward recorded with ``handle.logit_mask``;
        ``is_training`` (default: the model's mode) tells when the online head answers instead.
        """
        handle, ensemble = self.handle, self.handle.ensemble
        if scorer is None:
            def scorer(x: Tensor) -> Tensor:
                return ensemble_scores(ensemble, x, handle.record.pop_banks(x.shape[0]), handle.logit_mask)
        training = is_training or (lambda: handle.record.training)
        # A deep copy keeps the head; once the retrofit is removed its scorer answers None: the online head answers.
        head = EnsembleLinear(ensemble.online, self.install.guarded(scorer, None), shared(training))
        self.install.set_attribute(parent, name, head)

    # ---------------------------------------------------------------------------- query sources
    def query_class_token(self, backbone: nn.Module) -> None:
        """Router features: the prompt-free class token of ``backbone``, run by the retrofit on the model's
        input when the loop did not run it (the query of S-Prompts and CODA-Prompt)."""
        token = ClassToken(backbone)
        self.run_query_when_missing(token)  # registered first: its pre-hook runs before a routing one
        self.read_query(token, lambda features: features)
        self.record.query_source = "the prompt-free class token of model.backbone.forward_features (run by the " \
            "retrofit)"

    def read_query(self, module: nn.Module, query_from_output: Callable[[Any], Tensor], what: str = "") -> None:
        """Router features: ``query_from_output`` of each forward of ``module`` (``what``: the option that
        named it, for messages)."""
        record = self.record

        def seen(mod: nn.Module, args: Any, output: Any) -> None:
            record.seen(query=query_from_output(output))

        self.install.forward_hook(module, seen)
        record.query_source = f"the forward of {type(module).__name__}" + (f" ({what})" if what else "")

    def run_query_when_missing(self, query_module: nn.Module) -> None:
        """Run ``query_module`` on the model's input, under ``no_grad``, when a forward of the model needs a
        query nobody recorded: the first training forward of a stream batch, or a routed inference call
        whose loop did not run it first. A loop that runs it itself pays nothing."""
        record = self.record

        def before(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
            if record.handle.router is None:
                return
            missing = record.query is None if record.training else (
                record.routing_active() and record.eval_query is None
            )
            images = first_tensor(args, kwargs)
            if missing and images is not None:
                with torch.no_grad():
                    query_module(images)

        self.install.forward_pre_hook(self.model, before, with_kwargs=True)

    # ------------------------------------------------------------------------------- route targets
    def route_keyword(
        self, module: nn.Module, keyword: str, *, value: Optional[RouteValue] = None,
        query_from_call: Optional[QueryFromCall] = None, banks_follow_routing: bool = False,
        used_from_output: Optional[UsedFromOutput] = None,
    ) -> None:
        """Inject the routed experts at inference as ``module(..., keyword=value(experts, ...))`` (default
        value: the ``(B,)`` expert ids); ``module.forward`` must name the keyword.

        ``query_from_call`` reads the router features from the call itself (else a query source ran
        first); ``banks_follow_routing``: the ensemble banks are the routed experts; ``used_from_output``
        maps the module's output to the experts it actually used, checked against the routed ones
        (:meth:`Record.used_by_routed`).
        """
        callee = f"{type(module).__name__}.forward"
        self.family.require_keyword(module.forward, keyword, callee=callee)
        injection = _KeywordRoute(self.record, keyword, value, query_from_call, banks_follow_routing)
        self.install.forward_pre_hook(module, injection.before, with_kwargs=True)
        if used_from_output is not None:
            record = self.record

            def after(mod: nn.Module, args: Any, output: Any) -> None:
                injected, record.injected = record.injected, None
                if injected is not None and record.wants_observation:
                    record.used_by_routed(injected, used_from_output(output), callee)

            self.install.forward_hook(module, after)

    # ------------------------------------------------------------------------------------ the banks
    def count_batches(self, module: nn.Module) -> None:
        """Record the size of ``module``'s training calls (first tensor argument) for ``end_batch``."""
        record = self.record

        def before(mod: nn.Module, args: Tuple[Any, ...]) -> None:
            if args and isinstance(args[0], Tensor) and args[0].ndim > 0 and record.training:
                record.seen(args[0].shape[0])

        self.install.forward_pre_hook(module, before)

    def read_banks(self, module: nn.Module, bank_from_call: BankFromCall) -> None:
        """The banks of each call of ``module``: ``bank_from_call(module, args, kwargs, output)`` (and the
        size of its training calls)."""
        record = self.record

        def after(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> None:
            first = args[0] if args and isinstance(args[0], Tensor) and args[0].ndim > 0 else None
            record.seen(None if first is None else first.shape[0], banks=bank_from_call(mod, args, kwargs, output))

        self.install.forward_hook(module, after, with_kwargs=True)


class _KeywordRoute:
    """The pre-hook of :meth:`Layout.route_keyword`: reads the query (from the call, if asked) and
    injects the routed experts as a keyword at inference."""

    def __init__(self, record: Record, keyword: str, value: Optional[RouteValue],
                 query_from_call: Optional[QueryFromCall], banks_follow_routing: bool) -> None:
        self.record, self.keyword, self.value = record, keyword, value
        self.query_from_call, self.banks_follow_routing = query_from_call, banks_follow_routing

    def query(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tensor]:
        """The routed call's router features; ``None`` when this call is not routed (training, or not fitted)."""
        record = self.record
        if self.query_from_call is not None:
            query = self.query_from_call(module, args, kwargs)
            if query is None:
                raise RuntimeError(
                    f"{record.caller}: no query features in the call of "
                    f"{type(module).__name__}; pass query_module=... to read them elsewhere"
                )
            if record.training:
                record.seen(query=query)
                return None
            return query
        if record.training:
            return None
        if not record.routing_active():
            record.eval_query = None
            return None
        first = args[0] if args and isinstance(args[0], Tensor) else None
        return record.pop_query(None if first is None else first.shape[0])

    def before(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        record = self.record
        record.injected = None
        if record.handle.router is None:
            return None
        query = self.query(module, args, kwargs)
        experts = None if query is None else record.route(query)
        if experts is None:
            return None
        if self.banks_follow_routing:
            record.eval_banks = experts
        record.injected = experts
        value = experts if self.value is None else self.value(experts, module, args, kwargs)
        return args, {**kwargs, self.keyword: value}
