"""The base every family is a class on: :class:`AdapterFamily` recognises a model's layout (its
:meth:`~AdapterFamily.recognise` returns a :class:`Plan`), and the base runs the one skeleton of every
retrofit: the handle with its router and ensemble, the assembly corrections, then (unless both are off)
the family's hooks and the head swap.

The hook points a family installs through, all writing to the handle's per-batch state
(``handle.batch``) and observation (``handle.observed``):

* a query source: :meth:`~AdapterFamily.read_query` (a module's output), :meth:`~AdapterFamily.query_class_token`
  (the prompt-free class token), or :meth:`~AdapterFamily.query_seen` from a wrapper of the family's own;
* a route target: :meth:`~AdapterFamily.route_keyword` (a module's keyword argument), or a routed call of
  the family's own that asks :meth:`~AdapterFamily.route` and runs once per expert group (``_groups``);
* the banks a forward used: :meth:`~AdapterFamily.read_banks`, :meth:`~AdapterFamily.banks_seen`;
* the head swap: :meth:`~AdapterFamily.swap_head` (default: the plan's head becomes an
  :class:`~fly_modules.adapters.EnsembleLinear` answering the ensemble of the recorded banks).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from fly_modules._validation import check_int

from ._handle import BatchState, Retrofit, StepCounter
from ._head import EnsembleLinear, ensemble_scores
from ._options import RetrofitOptions
from ._query import ClassToken, first_tensor
from ._restore import Installation, shared
from ._seams import GENERIC_CALL, SeamError, missing_seam, require_keyword

__all__ = ["AdapterFamily", "Plan"]

QueryFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any]], Optional[Tensor]]
BankFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any], Any], Optional[Tensor]]
RouteValue = Callable[[Tensor, nn.Module, Tuple[Any, ...], Dict[str, Any]], Any]
UsedFromOutput = Callable[[Any], Optional[Tensor]]
Correction = Callable[[Installation], None]


@dataclasses.dataclass
class Plan:
    """What a family found on a model, before anything is installed.

    Attributes:
        num_experts: router outputs.
        head: ``(parent, name)`` of the ``nn.Linear`` classifier, the ensemble's online head (swapped for an
            :class:`~fly_modules.adapters.EnsembleLinear` by the default :meth:`AdapterFamily.swap_head`).
        classifier: the online head itself, for a family that swaps none (default ``getattr(*head)``).
        num_banks: ensemble banks (default ``num_experts``).
        banks_of_expert: banks re-cloned from the online head when an expert starts (default ``[expert]``).
        start_expert: the method's own expert start (default: advancing ``counter``, else nothing).
        counter: the method's own step counter (its value is the current expert).
        router_dim: width of the router features (default the classifier's ``in_features``).
        current_expert: the expert trained now (default the counter's value, else 0).
        corrections: upstream fixes installed on the model for every variant (``correct_assembly``);
            ``verify()`` compares the retrofit with the model carrying these alone.
        inference: how ``verify()`` evaluates when the model's inference is not its forward.
    """

    num_experts: int
    head: Optional[Tuple[nn.Module, str]] = None
    classifier: Optional[nn.Module] = None
    num_banks: Optional[int] = None
    banks_of_expert: Optional[Callable[[int], Sequence[int]]] = None
    start_expert: Optional[Callable[[int], None]] = None
    counter: Optional[StepCounter] = None
    router_dim: Optional[int] = None
    current_expert: Optional[int] = None
    corrections: Sequence[Correction] = ()
    inference: Optional[Callable[[Any], Any]] = None

    def __post_init__(self) -> None:
        if (self.head is None) == (self.classifier is None):
            raise TypeError("Plan: give the classifier's place, head=(parent, name), or the classifier itself")
        if self.classifier is None:
            parent, name = self.head
            self.classifier = getattr(parent, name)


def _one_bank(expert: int) -> Sequence[int]:
    return [int(expert)]


class AdapterFamily:
    """One retrofit of one model by a family. Subclasses set :attr:`names`, write :meth:`recognise`
    (whose keyword-only parameters are the family's options) and :meth:`install_hooks`, and register
    with ``@register_family``.

    Attributes:
        names: the method names the family serves (the first names it in messages and checkpoints).
        seam_contract: the family recognises upstream code, so a model implementing
            :class:`~fly_modules.adapters.SeamContract` is refused (``False``: it wires any model).
        model, options: what :meth:`retrofit` was given.
        plan: what :meth:`recognise` found.
        handle: the :class:`~fly_modules.adapters.Retrofit` returned to the user.
    """

    names: ClassVar[Tuple[str, ...]] = ()
    seam_contract: ClassVar[bool] = True

    def __init__(self, model: nn.Module, options: RetrofitOptions) -> None:
        self.model, self.options = model, options
        self.family = self.names[0] if self.names else type(self).__name__
        self.plan: Optional[Plan] = None
        self.handle: Retrofit = None  # type: ignore[assignment]  (set by retrofit)

    # ---------------------------------------------------------------------------- what a family writes
    def recognise(self, **family_options: Any) -> Plan:
        """Check the model's seams (nothing installed yet) and return what to build."""
        raise NotImplementedError(f"{type(self).__name__} must define recognise(self, *, <family options>)")

    def install_hooks(self) -> None:
        """Install the family's hooks (called only when the router or the ensemble is on)."""
        raise NotImplementedError(f"{type(self).__name__} must define install_hooks(self)")

    def swap_head(self) -> None:
        """Put the ensemble in the classifier's place (called only when the ensemble is on)."""
        self.replace_head(*self.plan.head)

    # ------------------------------------------------------------------------------------- skeleton
    @classmethod
    def retrofit(cls, model: nn.Module, options: RetrofitOptions, **family_options: Any) -> Retrofit:
        """Recognise ``model``, create the handle, then install the corrections, the hooks and the head."""
        family = cls(model, options)
        family.plan = family.recognise(**family_options)
        family.handle = handle = family.create_handle(family.plan)
        for correct in family.plan.corrections:
            correct(handle.install)
            handle.corrections.append(correct)
        handle.inference = family.plan.inference
        if not options.router and not options.ensemble:
            return handle  # the baseline variant: only the schedule is driven, the model is untouched
        family.install_hooks()
        if options.ensemble:
            family.swap_head()
        return handle

    def create_handle(self, plan: Plan) -> Retrofit:
        """The handle with its router and ensemble sized by ``plan``, the optimizer hook attached."""
        caller = f"fly_modules.adapters.{self.family}"
        num_experts = check_int(plan.num_experts, "num_experts", caller=caller, minimum=1)
        classifier = plan.classifier
        if not isinstance(classifier, nn.Linear):
            raise SeamError(
                f"{caller}: the classifier must be an nn.Linear, found {type(classifier).__name__}; pass "
                f"head_owner=... and head_name=... naming the nn.Linear: {GENERIC_CALL}"
            )
        dim = classifier.in_features if plan.router_dim is None else \
            check_int(plan.router_dim, "router_dim", caller=caller, minimum=1)
        counter = plan.counter
        current = plan.current_expert if plan.current_expert is not None else \
            counter.read() if counter is not None else 0
        banks_of_expert = plan.banks_of_expert or _one_bank
        handle = Retrofit(
            self.model, family=self.family,
            router=self.options.build_router(dim, num_experts, classifier.weight.device),
            ensemble=self.options.build_ensemble(classifier, num_experts if plan.num_banks is None else plan.num_banks),
            schedule=self.options.schedule, start_method_expert=self._method_start(plan),
            banks_of_expert=banks_of_expert, current_expert=current, num_experts=num_experts, step_counter=counter,
        )
        if handle.ensemble is not None:
            banks = list(banks_of_expert(current))
            if banks:
                handle.ensemble.active_expert = int(banks[-1])  # a retrofit mid-run
            handle.attach_optimizer(self.options.optimizer)
        return handle

    @staticmethod
    def _method_start(plan: Plan) -> Callable[[int], None]:
        if plan.start_expert is not None:
            return plan.start_expert
        if plan.counter is not None:
            return plan.counter.advance
        return lambda expert: None

    # ------------------------------------------------------------------------------------ seam checks
    def missing_seam(self, path: str, what: str) -> SeamError:
        """The :class:`SeamError` for a model without ``path`` (``what`` it should be)."""
        return missing_seam(self.model, path, what, family=self.family)

    # ---------------------------------------------------------------------------------- batch state
    @property
    def install(self) -> Installation:
        """Where hooks and attribute swaps go (undone by ``handle.remove()``)."""
        return self.handle.install

    @property
    def active(self) -> bool:
        return not self.handle.removed

    @property
    def batch(self) -> BatchState:
        """The handle's per-batch state, which the hooks fill and the head and ``end_batch`` read."""
        return self.handle.batch

    def query_seen(self, features: Tensor) -> None:
        """Query features of a forward: router statistics in training, routing at inference."""
        if self.handle.router is None:
            return
        if self.handle.training:
            self.handle.record_query(features)
        else:
            self.batch.eval_query = features.detach()

    def batch_seen(self, size: int) -> None:
        """A training forward of ``size`` samples (the default batch size of ``end_batch``)."""
        if self.handle.training:
            self.handle.record_batch_size(size)

    def banks_seen(self, banks: Optional[Tensor]) -> None:
        """Ensemble banks of a forward: moved after the optimizer step (training), ensembled (inference)."""
        if banks is None or self.handle.ensemble is None:
            return
        if self.handle.training:
            self.handle.record_trained_banks(banks.reshape(-1).long())
        else:
            self.batch.eval_banks = banks.detach().reshape(-1).long()

    def pop_query(self, size: Optional[int]) -> Tensor:
        """Router features of the current inference forward (``size``: the routed call's samples, checked)."""
        query, self.batch.eval_query = self.batch.eval_query, None
        if query is None:
            raise RuntimeError(
                f"fly_modules.adapters.{self.family}: the router is on but no query features were recorded before "
                f"the routing module ran at inference ({self.handle.query_source} did not run first in this "
                "forward); run it before the model (or pass the query through the route module's call)"
            )
        if size is not None and query.shape[0] != size:
            raise RuntimeError(
                f"fly_modules.adapters.{self.family}: the recorded query features hold {query.shape[0]} samples but "
                f"the routed call has {size}; run the query module on the same batch right before the model"
            )
        return query

    def pop_banks(self, size: int) -> Union[int, Tensor]:
        """Banks of the current inference forward; the active bank when none were recorded."""
        banks, self.batch.eval_banks = self.batch.eval_banks, None
        if banks is None or banks.shape[0] != size:
            banks = int(self.handle.ensemble.active_expert)
        self.handle.observed.banks = banks
        return banks

    def route(self, features: Tensor) -> Optional[Tensor]:
        """Routed expert ids at inference, ``None`` when the router is off, not fitted or removed."""
        if self.handle.training or not self.handle.routing_active():
            return None
        return self.handle.route(features).to(features.device)

    # ------------------------------------------------------------------------------ the head swap
    def replace_head(
        self, parent: nn.Module, name: str, scorer: Optional[Callable[[Tensor], Tensor]] = None,
        is_training: Optional[Callable[[], bool]] = None,
    ) -> EnsembleLinear:
        """Replace ``parent.name`` by an :class:`EnsembleLinear` (undone by ``remove()``).

        The default scorer ensembles the banks the forward recorded with ``handle.logit_mask``;
        ``is_training`` (default: the model's mode) tells when the online head answers instead.
        """
        ensemble = self.handle.ensemble
        if scorer is None:
            def scorer(x: Tensor) -> Tensor:
                return ensemble_scores(ensemble, x, self.pop_banks(x.shape[0]), self.handle.logit_mask)
        wrapper = EnsembleLinear(ensemble.online, shared(scorer), shared(is_training) or (lambda: self.handle.training))
        self.install.set_attribute(parent, name, wrapper)
        return wrapper

    # ---------------------------------------------------------------------------- query sources
    def query_class_token(self, backbone: nn.Module) -> None:
        """Router features: the prompt-free class token of ``backbone``, run by the retrofit on the model's
        input when the loop did not run it (the query of S-Prompts and CODA-Prompt)."""
        token = ClassToken(backbone)
        self.handle.query_source = "the prompt-free class token of model.backbone.forward_features (run by the retrofit)"
        self.run_query_when_missing(token)  # registered first: its pre-hook runs before a routing one
        self.read_query(token, lambda features: features)

    def read_query(self, module: nn.Module, query_from_output: Callable[[Any], Tensor]) -> None:
        """Router features: ``query_from_output`` of each forward of ``module``."""
        def record(mod: nn.Module, args: Any, output: Any) -> None:
            if self.active:
                self.query_seen(query_from_output(output))

        self.install.forward_hook(module, record)

    def run_query_when_missing(self, query_module: nn.Module) -> None:
        """Run ``query_module`` on the model's input, under ``no_grad``, when a forward of the model needs a
        query nobody recorded: the first training forward of a stream batch, or a routed inference call
        whose loop did not run it first. A loop that runs it itself pays nothing."""
        handle = self.handle

        def before(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
            if not self.active or handle.router is None:
                return
            missing = handle.batch.query is None if handle.training else (
                handle.routing_active() and self.batch.eval_query is None
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
        (:meth:`Retrofit.note_routed`).
        """
        callee = f"{type(module).__name__}.forward"
        require_keyword(module.forward, keyword, family=self.family, callee=callee)
        injection = _KeywordRoute(self, keyword, value, query_from_call, banks_follow_routing)
        self.install.forward_pre_hook(module, injection.before, with_kwargs=True)
        if used_from_output is not None:
            def after(mod: nn.Module, args: Any, output: Any) -> None:
                injected, self.batch.injected = self.batch.injected, None
                if injected is not None and self.active and self.handle.wants_observation:
                    self.handle.note_routed(injected, used_from_output(output), callee)

            self.install.forward_hook(module, after)

    # ------------------------------------------------------------------------------------ the banks
    def count_batches(self, module: nn.Module) -> None:
        """Record the size of ``module``'s training calls (first tensor argument) for ``end_batch``."""
        def before(mod: nn.Module, args: Tuple[Any, ...]) -> None:
            if self.active and args and isinstance(args[0], Tensor) and args[0].ndim > 0:
                self.batch_seen(args[0].shape[0])

        self.install.forward_pre_hook(module, before)

    def read_banks(self, module: nn.Module, bank_from_call: BankFromCall) -> None:
        """The banks of each call of ``module``: ``bank_from_call(module, args, kwargs, output)`` (and the
        size of its training calls)."""
        def after(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> None:
            if self.active:
                first = args[0] if args and isinstance(args[0], Tensor) else None
                if first is not None and first.ndim > 0:
                    self.batch_seen(first.shape[0])
                self.banks_seen(bank_from_call(mod, args, kwargs, output))

        self.install.forward_hook(module, after, with_kwargs=True)


class _KeywordRoute:
    """The pre-hook of :meth:`AdapterFamily.route_keyword`: reads the query (from the call, if asked) and
    injects the routed experts as a keyword at inference."""

    def __init__(self, family: AdapterFamily, keyword: str, value: Optional[RouteValue],
                 query_from_call: Optional[QueryFromCall], banks_follow_routing: bool) -> None:
        self.family, self.keyword, self.value = family, keyword, value
        self.query_from_call, self.banks_follow_routing = query_from_call, banks_follow_routing

    def query(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tensor]:
        """The routed call's router features; ``None`` when this call is not routed (training, or not fitted)."""
        family, handle = self.family, self.family.handle
        if self.query_from_call is not None:
            query = self.query_from_call(module, args, kwargs)
            if query is None:
                raise RuntimeError(
                    f"fly_modules.adapters.{family.family}: no query features in the call of "
                    f"{type(module).__name__}; pass query_module=... to read them elsewhere"
                )
            if handle.training:
                handle.record_query(query)
                return None
            return query
        if handle.training:
            return None
        if not handle.routing_active():
            family.batch.eval_query = None
            return None
        first = args[0] if args and isinstance(args[0], Tensor) else None
        return family.pop_query(None if first is None else first.shape[0])

    def before(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        family = self.family
        family.batch.injected = None
        if not family.active or family.handle.router is None:
            return None
        query = self.query(module, args, kwargs)
        experts = None if query is None else family.route(query)
        if experts is None:
            return None
        if self.banks_follow_routing:
            family.batch.eval_banks = experts
        family.batch.injected = experts
        family.handle.observed.routed = experts
        value = experts if self.value is None else self.value(experts, module, args, kwargs)
        return args, {**kwargs, self.keyword: value}
