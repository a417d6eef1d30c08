"""Retrofit by explicit seams: for any codebase, the user names where things happen.

``retrofit(model, num_experts=E, query_module=..., route_module=..., route_kwarg=..., head_owner=...,
head_name=...)`` needs four facts about the user's model and nothing else:

* **query** -- a module whose forward output holds the query features (a frozen, prompt-free pass the
  method runs anyway, e.g. ``original_model`` of the JH-LEE codebases). A forward hook reads them: in
  training they are kept for :meth:`Retrofit.end_batch` (router statistics, the current expert as
  target); at inference they are stashed for routing. No second backbone pass is ever run.
* **route** -- the module whose call decides the method's prompt selection and the keyword argument
  that restricts it. At inference a forward pre-hook (``with_kwargs=True``) injects
  ``route_value(expert_ids, module, args, kwargs)`` (default: the ``(B,)`` routed experts) as that
  keyword, so the routed expert restricts the method's *own* selection. The argument must be passed by
  keyword (or left out) in the user's call. Training-time calls are never changed.
* **head** -- ``getattr(head_owner, head_name)``, an ``nn.Linear`` (default: found through
  ``get_classifier()``, ``head`` or ``fc`` of the model). With ``ensemble=True`` it is replaced by an
  :class:`EnsembleLinear` that shares its parameters (the ``state_dict`` keys do not change): in
  training it returns the online head's logits bit for bit; at inference it ensembles
  ``[online, EMA copies of each sample's bank]`` after adding ``handle.logit_mask`` (set it once per
  evaluation with :meth:`Retrofit.set_logit_mask`) and returns **log-probabilities** for the softmax
  rules (the aggregated scores for ``mean``/``max_prob``/``min_entropy``), so the user's own argmax and
  any extra ``-inf`` masking keep working.
* **banks** -- ``bank_from_output(route_output)`` gives the ``(B,)`` ensemble bank of each sample from
  the route module's output (training: the banks moved after the next optimizer step; inference: the
  banks ensembled). Without it the banks are the experts: the routed expert at inference (the active
  bank when the router is off or not fitted yet), the current expert in training.

``handle.remove()`` restores the head module and removes every hook. The family adapters
(``l2p``, ``dualprompt``, ``mvp``, ``hide``) build on the helpers of this module.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from fly_modules import AnalyticRouter, TemporalEnsembleHead

from ._core import Retrofit, Schedule, SeamError, set_instance_attribute, undo_on_failure

__all__ = ["retrofit", "EnsembleLinear", "find_head", "ensemble_scores", "Wiring", "make_wiring"]

QueryFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any]], Optional[Tensor]]
BankFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any], Any], Optional[Tensor]]
RouteValue = Callable[[Tensor, nn.Module, Tuple[Any, ...], Dict[str, Any]], Any]


# ------------------------------------------------------------------------------------- head
def find_head(owner: nn.Module, family: str = "generic") -> Tuple[nn.Module, str]:
    """``(owner, name)`` of ``owner``'s classifier: the child that ``get_classifier()`` returns, else
    ``head`` or ``fc``. Raises :class:`SeamError` when there is none."""
    getter = getattr(owner, "get_classifier", None)
    if callable(getter):
        classifier = getter()
        for name, child in owner.named_children():
            if child is classifier:
                return owner, name
    for name in ("head", "fc"):
        if isinstance(getattr(owner, name, None), nn.Module):
            return owner, name
    children = sorted(name for name, _ in owner.named_children())
    raise SeamError(
        f"fly_modules.adapters.{family}: {type(owner).__name__} has no classifier `get_classifier()`, `head` or "
        f"`fc` (its submodules are {children}); pass head_owner=... and head_name=... to "
        f"fly_modules.adapters.generic.retrofit"
    )


def ensemble_scores(
    ensemble: TemporalEnsembleHead,
    features: Tensor,
    banks: Union[int, Tensor],
    logit_mask: Optional[Tensor] = None,
    transform: Optional[Callable[[Tensor], Tensor]] = None,
) -> Tensor:
    """Ensemble of ``[online, copies of each sample's bank]`` in the retrofit output convention.

    ``transform`` maps the member logits ``(B, H, C)`` (a method's per-sample class mask); the
    ``logit_mask`` is added next, then the members are aggregated. Softmax rules return the log of
    the aggregated probabilities, the other rules the aggregated logits.
    """
    members = ensemble.member_logits(features, banks)
    if transform is not None:
        members = transform(members)
    if logit_mask is not None:
        mask = logit_mask.to(members.device)
        members = members + (mask.unsqueeze(1) if mask.ndim == 2 else mask)
    scores = ensemble.aggregate_members(members)
    return scores.log() if ensemble.aggregate.startswith("softmax") else scores


class EnsembleLinear(nn.Linear):
    """Stand-in for a retrofitted classifier: the online head in training, the ensemble at inference.

    It registers the online head's own ``weight`` and ``bias`` (the same ``Parameter`` objects), so an
    optimizer built before or after the retrofit trains them and the owner's ``state_dict`` keys are
    unchanged. The online head itself is kept as ``online`` (not a child module).

    Args:
        online: the original ``nn.Linear``.
        scorer: ``scorer(x)`` computes the inference output; ``None`` returns the online logits.
        is_training: tells training from inference (default: this module's ``training`` flag). The
            adapters pass the retrofitted model's flag: some codebases put the module that owns the
            classifier in eval mode inside every forward (MVP calls ``backbone.eval()``).
    """

    def __init__(
        self,
        online: nn.Linear,
        scorer: Optional[Callable[[Tensor], Tensor]],
        is_training: Optional[Callable[[], bool]] = None,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = online.in_features, online.out_features
        self.weight = online.weight
        if online.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = online.bias
        self.training = online.training
        self.__dict__["online"] = online
        self.__dict__["scorer"] = scorer
        self.__dict__["is_training"] = is_training

    def forward(self, x: Tensor) -> Tensor:
        training = self.training if self.is_training is None else self.is_training()
        if training or self.scorer is None:
            return self.online(x)
        return self.scorer(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, online={type(self.online).__name__}"


# ----------------------------------------------------------------------------------- wiring
class Wiring:
    """The per-retrofit plumbing the adapters share: the handle, the stashes of one inference forward,
    and the helpers that install hooks and swap the head.

    Attributes:
        handle: the :class:`Retrofit` returned to the user.
        eval_query: router features of the current inference forward (popped by the routing hook).
        eval_banks: ``(B,)`` banks of the current inference forward (popped by the head).
    """

    def __init__(self, handle: Retrofit, family: str) -> None:
        self.handle = handle
        self.family = family
        self.eval_query: Optional[Tensor] = None
        self.eval_banks: Optional[Tensor] = None

    # ---------------------------------------------------------------------------- stashes
    @property
    def active(self) -> bool:
        return not self.handle.removed

    def query_seen(self, features: Tensor) -> None:
        """Query features of a forward: router statistics in training, routing at inference."""
        if self.handle.router is None:
            return
        if self.handle.training:
            self.handle.record_query(features)
        else:
            self.eval_query = features.detach()

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
            self.eval_banks = banks.detach().reshape(-1).long()

    def pop_query(self, batch: Optional[int]) -> Tensor:
        query, self.eval_query = self.eval_query, None
        if query is None:
            raise RuntimeError(
                f"fly_modules.adapters.{self.family}: the router is on but no query features were recorded before "
                "the routing module ran at inference; the query module must run before the route module in the "
                "same forward (or pass the query through the route module's call)"
            )
        if batch is not None and query.shape[0] != batch:
            raise RuntimeError(
                f"fly_modules.adapters.{self.family}: the recorded query features hold {query.shape[0]} samples but "
                f"the routed call has {batch}; run the query module on the same batch right before the model"
            )
        return query

    def pop_banks(self, batch: int) -> Union[int, Tensor]:
        """Banks of the current inference forward; the active bank when none were recorded."""
        banks, self.eval_banks = self.eval_banks, None
        if banks is None or banks.shape[0] != batch:
            return int(self.handle.ensemble.active_expert)
        return banks

    def route(self, features: Tensor) -> Optional[Tensor]:
        """Routed expert ids at inference, ``None`` when the router is off, not fitted or removed."""
        if self.handle.training or not self.handle.routing_active():
            return None
        return self.handle.route(features).to(features.device)

    # ---------------------------------------------------------------------------- installs
    def swap_head(
        self, owner: nn.Module, name: str, scorer: Optional[Callable[[Tensor], Tensor]] = None
    ) -> EnsembleLinear:
        """Replace ``owner.name`` by an :class:`EnsembleLinear` (undone by ``remove()``).

        The default scorer ensembles the banks the forward recorded with ``handle.logit_mask``.
        """
        ensemble = self.handle.ensemble
        if scorer is None:
            def scorer(x: Tensor) -> Tensor:
                return ensemble_scores(ensemble, x, self.pop_banks(x.shape[0]), self.handle.logit_mask)
        wrapper = EnsembleLinear(ensemble.online, scorer, lambda: self.handle.training)
        set_instance_attribute(self.handle, owner, name, wrapper)
        return wrapper

    def hook_query_module(self, module: nn.Module, query_from_output: Callable[[Any], Tensor]) -> None:
        def record(mod: nn.Module, args: Any, output: Any) -> None:
            if self.active:
                self.query_seen(query_from_output(output))

        self.handle.add_handle(module.register_forward_hook(record))

    def hook_route_module(
        self,
        module: nn.Module,
        *,
        route_kwarg: Optional[str],
        route_value: Optional[RouteValue],
        query_from_call: Optional[QueryFromCall],
        banks_follow_routing: bool,
    ) -> None:
        """Pre-hook on the route module: reads the query from the call (if given) and injects the route."""
        handle = self.handle

        def before(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
            if not self.active or handle.router is None:
                return None
            if query_from_call is not None:
                query = query_from_call(mod, args, kwargs)
                if query is None:
                    raise RuntimeError(
                        f"fly_modules.adapters.{self.family}: no query features in the call of "
                        f"{type(mod).__name__}; pass query_module=... to read them elsewhere"
                    )
                if handle.training:
                    handle.record_query(query)
                    return None
            elif handle.training:
                return None
            elif not handle.routing_active():
                self.eval_query = None
                return None
            else:
                first = args[0] if args and isinstance(args[0], Tensor) else None
                query = self.pop_query(None if first is None else first.shape[0])
            experts = self.route(query)
            if experts is None or route_kwarg is None:
                return None
            if banks_follow_routing:
                self.eval_banks = experts
            value = experts if route_value is None else route_value(experts, mod, args, kwargs)
            return args, {**kwargs, route_kwarg: value}

        handle.add_handle(module.register_forward_pre_hook(before, with_kwargs=True))

    def hook_batch_size(self, module: nn.Module) -> None:
        """Record the size of ``module``'s training calls (first tensor argument) for ``end_batch``."""
        def before(mod: nn.Module, args: Tuple[Any, ...]) -> None:
            if self.active and args and isinstance(args[0], Tensor) and args[0].ndim > 0:
                self.batch_seen(args[0].shape[0])

        self.handle.add_handle(module.register_forward_pre_hook(before))

    def hook_banks(self, module: nn.Module, bank_from_call: BankFromCall) -> None:
        def after(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> None:
            if self.active:
                first = args[0] if args and isinstance(args[0], Tensor) else None
                if first is not None and first.ndim > 0:
                    self.batch_seen(first.shape[0])
                self.banks_seen(bank_from_call(mod, args, kwargs, output))

        self.handle.add_handle(module.register_forward_hook(after, with_kwargs=True))


def make_wiring(
    model: nn.Module,
    family: str,
    *,
    classifier: nn.Module,
    num_experts: int,
    num_banks: int,
    banks_of_expert: Callable[[int], Sequence[int]],
    start_method_expert: Optional[Callable[[int], None]],
    router: bool,
    ensemble: bool,
    optimizer: Optional[torch.optim.Optimizer],
    schedule: Schedule,
    router_dim: Optional[int],
    expansion_dim: int,
    ridge: Any,
    seed: int,
    decays: Sequence[float],
    aggregate: str,
    current_expert: int = 0,
) -> Wiring:
    """The handle with its router (``router_dim`` features, ``num_experts`` outputs) and ensemble
    (``num_banks`` banks around ``classifier``), the optimizer hook attached; no model hook yet."""
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"fly_modules.adapters.{family}: num_experts must be an int >= 1, got {num_experts!r}")
    if not isinstance(classifier, nn.Linear):
        raise SeamError(
            f"fly_modules.adapters.{family}: the classifier must be an nn.Linear, found {type(classifier).__name__}; "
            "pass head_owner=... and head_name=... naming the nn.Linear to fly_modules.adapters.generic.retrofit"
        )
    added_router = None
    if router:
        dim = int(router_dim if router_dim is not None else classifier.in_features)
        added_router = AnalyticRouter(
            dim, num_experts, expansion_dim=expansion_dim, ridge=ridge, seed=seed, device=classifier.weight.device
        )
    added_ensemble = TemporalEnsembleHead(classifier, num_banks, decays=decays, aggregate=aggregate) if ensemble else None
    handle = Retrofit(
        model,
        router=added_router,
        ensemble=added_ensemble,
        schedule=schedule,
        start_method_expert=start_method_expert or (lambda expert: None),
        banks_of_expert=banks_of_expert,
        current_expert=current_expert,
        num_experts=num_experts,
    )
    if added_ensemble is not None:
        banks = list(banks_of_expert(int(current_expert)))
        if banks:
            added_ensemble.active_expert = int(banks[-1])
        handle.attach_optimizer(optimizer)
    return Wiring(handle, family)


def default_query(output: Any) -> Tensor:
    """The query features of a module output: the tensor itself, or ``output["pre_logits"]``."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("pre_logits"), Tensor):
        return output["pre_logits"]
    raise TypeError(
        f"the query module returned a {type(output).__name__}; pass query_from_output=... mapping its output "
        "to the (B, D) query features"
    )


def task_count_starter(model: nn.Module, start_expert: Optional[Callable[[int], None]]) -> Callable[[int], None]:
    """Expert start of the Si-Blurry / MISA / FlyGCL family: the user's ``start_expert`` if given, else
    ``model.process_task_count()`` until ``model.task_count`` reaches the expert (idempotent)."""

    def method_start(expert: int) -> None:
        if start_expert is not None:
            start_expert(expert)
        elif hasattr(model, "process_task_count") and hasattr(model, "task_count"):
            while int(model.task_count) < expert:
                model.process_task_count()

    return method_start


def reference_or_none(
    model: Any, family: str, num_experts: Optional[int], upstream_only: Dict[str, Any], **common: Any
) -> Optional[Retrofit]:
    """``reference.retrofit(model, **common)`` when ``model`` implements the seam contract of
    ``benchmarks.methods`` (``reference.REQUIRED``); ``None`` otherwise.

    ``upstream_only`` holds the family options that only make sense for upstream codebases; any that
    is not ``None`` is an error for a seam-contract model.
    """
    from . import reference

    if not all(hasattr(model, name) for name in reference.REQUIRED):
        return None
    if num_experts is not None and int(num_experts) != int(model.num_experts):
        raise ValueError(
            f"fly_modules.adapters.{family}: num_experts={num_experts} disagrees with the method's "
            f"num_experts={model.num_experts}"
        )
    given = sorted(name for name, value in upstream_only.items() if value is not None)
    if given:
        raise TypeError(
            f"fly_modules.adapters.{family}: {type(model).__name__} implements the fly-modules seam contract "
            f"(handled by the reference adapter); the options {given} apply to upstream codebases only"
        )
    return reference.retrofit(model, **common)


# ------------------------------------------------------------------------------------ public
@undo_on_failure
def retrofit(
    model: nn.Module,
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
    router: bool = True,
    ensemble: bool = True,
    optimizer: Optional[torch.optim.Optimizer] = None,
    schedule: Schedule = None,
    router_dim: Optional[int] = None,
    expansion_dim: int = 10_000,
    ridge: Any = 1e4,
    seed: int = 0,
    decays: Sequence[float] = (0.9, 0.99),
    aggregate: str = "softmax_max",
) -> Retrofit:
    """Add the analytic router and/or the temporal ensemble to a model through explicit seams.

    Args:
        model: the user's model (its ``training`` flag tells training from inference).
        num_experts: router outputs = ensemble banks (one bank per expert).
        query_module: module whose forward output holds the query features (required with ``router``).
        query_from_output: maps that output to ``(B, D)`` features; default: the output itself, or
            ``output["pre_logits"]`` for dict outputs.
        route_module, route_kwarg: the module whose keyword argument ``route_kwarg`` restricts the
            method's selection (required with ``router``).
        route_value: ``route_value(expert_ids, module, args, kwargs)`` -> the injected value; default
            the ``(B,)`` long expert ids.
        head_owner, head_name: where the ``nn.Linear`` classifier lives; default: the model's
            ``get_classifier()`` / ``head`` / ``fc``.
        bank_from_output: ``(B,)`` bank ids from the route module's output (see the module docstring).
        start_expert: the method's own expert start, called with the expert id by
            ``handle.start_expert`` (and the schedule); default: nothing.
        router, ensemble: which component to add; both ``False`` leaves the model untouched.
        optimizer: the EMA copies move after each of its steps (else call ``handle.update_ensemble()``).
        schedule: ``SampleBudgetSchedule`` (driven by ``end_batch``) or ``SessionSchedule``
            (``start_session``); ``None``: experts start only through ``handle.start_expert``.
        router_dim: width of the query features; default the classifier's ``in_features``.
        expansion_dim, ridge, seed: the router's (paper: 10,000, 1e4).
        decays, aggregate: the ensemble's (paper: (0.9, 0.99), ``"softmax_max"``).

    Returns:
        the :class:`Retrofit` handle (``end_batch``, ``start_session``, ``start_expert``,
        ``set_logit_mask``, ``remove``).
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
    if router and (query_module is None or route_module is None or route_kwarg is None):
        missing = [n for n, v in (("query_module", query_module), ("route_module", route_module),
                                  ("route_kwarg", route_kwarg)) if v is None]
        raise SeamError(f"fly_modules.adapters.generic: router=True needs {', '.join(missing)}")
    if bank_from_output is not None and route_module is None:
        raise SeamError("fly_modules.adapters.generic: bank_from_output reads the route module's output; pass route_module")
    wiring = make_wiring(
        model, "generic", classifier=getattr(head_owner, head_name), num_experts=num_experts,
        num_banks=num_experts, banks_of_expert=lambda expert: [int(expert)], start_method_expert=start_expert,
        router=router, ensemble=ensemble, optimizer=optimizer, schedule=schedule, router_dim=router_dim,
        expansion_dim=expansion_dim, ridge=ridge, seed=seed, decays=decays, aggregate=aggregate,
    )
    if not router and not ensemble:
        return wiring.handle
    if router:
        wiring.hook_query_module(query_module, query_from_output or default_query)
        wiring.hook_route_module(
            route_module, route_kwarg=route_kwarg, route_value=route_value, query_from_call=None,
            banks_follow_routing=bank_from_output is None,
        )
    if ensemble:
        if bank_from_output is not None:
            wiring.hook_banks(route_module, lambda mod, args, kwargs, output: bank_from_output(output))
        elif not router:
            wiring.hook_batch_size(model)
        wiring.swap_head(head_owner, head_name)
    return wiring.handle
