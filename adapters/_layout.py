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

import functools
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError

from ._handle import Retrofit
from ._head import EnsembleLinear, ensemble_scores
from ._options import RetrofitOptions
from ._query import ClassToken, first_tensor
from ._record import Record
from ._restore import Installation, shared
from ._routed_call import QueryFromCall, QueryWhen, RoutedArgument, RoutedCall, RouteValue

__all__ = ["Layout", "QueryWhen", "RouteValue"]

BankFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any], Any], Optional[Tensor]]
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
        self._scoped = False  # the model's forward scopes the inference query (scope_queries_to_forward)

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

    def read_query(self, module: nn.Module, query_from_output: Callable[[Any], Tensor], what: str = "",
                   when: Optional[QueryWhen] = None) -> None:
        """Router features: ``query_from_output`` of each forward of ``module`` (``what``: the option that
        named it, for messages); with ``when``, only of the calls for which ``when(args, kwargs)`` is true
        (the call the user means when the module runs several times per step, e.g. its prompt-free pass)."""
        record = self.record
        if when is not None and not callable(when):
            raise InvalidParameterError(
                f"{self.caller}: query_when must be a function (args, kwargs) -> bool telling which call of "
                f"{type(module).__name__} is the router's query, got {type(when).__name__}"
            )

        def seen(mod: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
            record.seen(query=query_from_output(output))

        def seen_when(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> None:
            if when(args, kwargs):
                record.seen(query=query_from_output(output))

        if when is None:
            self.install.forward_hook(module, seen)
        else:
            self.install.forward_hook(module, seen_when, with_kwargs=True)
        record.query_source = f"the forward of {type(module).__name__}" + (f" ({what})" if what else "") + (
            " (the calls query_when accepts)" if when is not None else "")

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
        self, module: nn.Module, keyword: str, *, method: Optional[str] = None, value: Optional[RouteValue] = None,
        query_from_call: Optional[QueryFromCall] = None, banks_follow_routing: bool = False,
        used_from_output: Optional[UsedFromOutput] = None,
    ) -> None:
        """Pass the routed experts at inference as the argument ``keyword`` of ``module``'s forward, or of its
        method ``method`` (patched on the instance), as ``value(experts, module, args, kwargs)`` (default the
        ``(B,)`` expert ids). The value is bound to the callee's signature: it replaces the argument however
        the call passes it (positionally or by keyword); the callee must name the parameter.

        ``query_from_call`` reads the router features from the call itself (else a query source ran first:
        its features serve every routed call of the model's forward); ``banks_follow_routing``: the ensemble
        banks are the routed experts; ``used_from_output`` maps the callee's output to the experts it
        actually used, checked against the routed ones (:meth:`Record.used_by_routed`).
        """
        callee = f"{type(module).__name__}.{method or 'forward'}"
        function = module.forward if method is None else getattr(module, method)
        why = "route_module=<module>, route_method=<name> routes a method of the module that names it" \
            if method is None else "route_method must name a method whose signature names it"
        self.family.require_keyword(function, keyword, callee=callee, why=why)
        after = None if used_from_output is None else _Observed(self.record, used_from_output, callee)
        routing = RoutedCall(self.record, RoutedArgument(function, keyword), value, query_from_call,
                             banks_follow_routing, after)
        self.scope_queries_to_forward()
        if method is None:
            self.install.forward_pre_hook(module, routing.before, with_kwargs=True)
            if after is not None:
                self.install.forward_hook(module, after)
            if module is not self.model:
                self.install.forward_hook(module, routing.returned)
        else:
            self.install.set_attribute(module, method, functools.partial(routing.call, module, function))

    def scope_queries_to_forward(self) -> None:
        """Decide once per forward of the model whether it trains (:meth:`Record.start_forward`), keep an
        inference query for every routed call of the forward, and forget it when the forward returns (hooks
        on the model, installed once)."""
        if getattr(self, "_scoped", False):  # a layout of the user's may skip Layout.__init__
            return
        self._scoped, record = True, self.record

        def started(mod: nn.Module, args: Tuple[Any, ...]) -> None:
            record.start_forward()

        def ended(mod: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
            record.in_forward = False
            record.end_forward()

        self.install.forward_pre_hook(self.model, started)
        self.install.forward_hook(self.model, ended)

    # ---------------------------------------------------------------------------- training or not
    def guard_inference(self) -> None:
        """Make :attr:`Record.training` follow the ``train_in_eval`` option, and make a backward through an
        output the retrofit computed as inference (an eval-mode forward with autograd on) raise one line
        naming the fix: a loop that trains in eval mode never trains on the ensemble's output silently."""
        record, guard = self.record, _InferenceOnly(self.caller, type(self.model).__name__)
        record.train_in_eval = self.options.train_in_eval
        self.scope_queries_to_forward()

        def after(mod: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
            if not record.training and torch.is_grad_enabled():
                guard.attach(output)

        self.install.forward_hook(self.model, after)

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


class _Observed:
    """The forward hook (or, for a routed method, the call's epilogue) comparing the experts a routed call
    used, as its output shows, with those it was given."""

    def __init__(self, record: Record, used_from_output: UsedFromOutput, callee: str) -> None:
        self.record, self.used_from_output, self.callee = record, used_from_output, callee

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        record = self.record
        injected, record.injected = record.injected, None
        if injected is not None and record.wants_observation:
            record.used_by_routed(injected, self.used_from_output(output), self.callee)


class _InferenceOnly:
    """Tensor hooks on the outputs of an eval-mode forward with autograd on: a backward reaching one raises."""

    def __init__(self, caller: str, model: str) -> None:
        self.message = (
            f"{caller}: a backward reached an output of {model} computed in eval mode, which the retrofit treats "
            "as inference (routed prompts, the ensemble's log-probabilities); a loop that trains in eval mode "
            "passes train_in_eval=True to retrofit (every forward with autograd on is then a training forward: "
            "run inference under torch.no_grad()), or calls model.train() before its training steps"
        )

    def attach(self, output: Any) -> None:
        if isinstance(output, Tensor):
            if output.requires_grad:
                output.register_hook(self.refuse)
        elif isinstance(output, Mapping):
            for value in output.values():
                self.attach(value)
        elif isinstance(output, (tuple, list)):
            for value in output:
                self.attach(value)

    def refuse(self, grad: Tensor) -> None:
        raise RuntimeError(self.message)
