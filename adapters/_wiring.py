"""Plumbing the families share: the handle with its router and ensemble, and the hooks that feed it.

A :class:`Wiring` reads query features where the model computes them, injects the routed expert as a
keyword of the module whose call selects the prompts (after checking that module names the keyword),
records which ensemble banks a forward used, and swaps the classifier for an :class:`EnsembleLinear`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from fly_modules._validation import check_int

from ._errors import GENERIC_CALL, SeamError
from ._handle import Retrofit, StepCounter
from ._head import EnsembleLinear, ensemble_scores
from ._options import RetrofitOptions
from ._signatures import require_keyword

__all__ = ["Wiring", "default_query", "first_tensor"]

QueryFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any]], Optional[Tensor]]
BankFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any], Any], Optional[Tensor]]
RouteValue = Callable[[Tensor, nn.Module, Tuple[Any, ...], Dict[str, Any]], Any]
UsedFromOutput = Callable[[Any], Optional[Tensor]]


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


def first_tensor(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tensor]:
    """The call's first tensor argument (positional first, then keyword), ``None`` if there is none."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            return value
    return None


class Wiring:
    """The per-retrofit plumbing: the handle, the stashes of one inference forward, the hook installers.

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
        self._injected: Optional[Tensor] = None
        handle.wiring = self  # verify() snapshots its stashes

    @classmethod
    def create(
        cls,
        model: nn.Module,
        family: str,
        options: RetrofitOptions,
        *,
        classifier: nn.Module,
        num_experts: int,
        num_banks: int,
        banks_of_expert: Callable[[int], Sequence[int]],
        start_method_expert: Optional[Callable[[int], None]] = None,
        router_dim: Optional[int] = None,
        current_expert: int = 0,
        step_counter: Optional[StepCounter] = None,
    ) -> "Wiring":
        """The handle with its router (``router_dim`` features, ``num_experts`` outputs) and ensemble
        (``num_banks`` banks around ``classifier``), the optimizer hook attached; no model hook yet."""
        owner = f"fly_modules.adapters.{family}"
        num_experts = check_int(num_experts, "num_experts", owner=owner, minimum=1)
        if not isinstance(classifier, nn.Linear):
            raise SeamError(
                f"{owner}: the classifier must be an nn.Linear, found {type(classifier).__name__}; pass "
                f"head_owner=... and head_name=... naming the nn.Linear: {GENERIC_CALL}"
            )
        dim = check_int(router_dim, "router_dim", owner=owner, minimum=1) if router_dim is not None \
            else classifier.in_features
        handle = Retrofit(
            model,
            family=family,
            router=options.build_router(dim, num_experts, classifier.weight.device),
            ensemble=options.build_ensemble(classifier, num_banks),
            schedule=options.schedule,
            start_method_expert=start_method_expert or (lambda expert: None),
            banks_of_expert=banks_of_expert,
            current_expert=current_expert,
            num_experts=num_experts,
            step_counter=step_counter,
        )
        if handle.ensemble is not None:
            banks = list(banks_of_expert(int(current_expert)))
            if banks:
                handle.ensemble.active_expert = int(banks[-1])
            handle.attach_optimizer(options.optimizer)
        return cls(handle, family)

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
                f"the routing module ran at inference ({self.handle.query_source} did not run first in this forward); "
                "run it before the model (or pass the query through the route module's call)"
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
            banks = int(self.handle.ensemble.active_expert)
        self.handle.observed["banks"] = banks
        return banks

    def route(self, features: Tensor) -> Optional[Tensor]:
        """Routed expert ids at inference, ``None`` when the router is off, not fitted or removed."""
        if self.handle.training or not self.handle.routing_active():
            return None
        return self.handle.route(features).to(features.device)

    # ---------------------------------------------------------------------------- installs
    def swap_head(
        self, owner: nn.Module, name: str, scorer: Optional[Callable[[Tensor], Tensor]] = None,
        is_training: Optional[Callable[[], bool]] = None,
    ) -> EnsembleLinear:
        """Replace ``owner.name`` by an :class:`EnsembleLinear` (undone by ``remove()``).

        The default scorer ensembles the banks the forward recorded with ``handle.logit_mask``;
        ``is_training`` (default: the model's mode) tells when the online head answers instead.
        """
        ensemble = self.handle.ensemble
        if scorer is None:
            def scorer(x: Tensor) -> Tensor:
                return ensemble_scores(ensemble, x, self.pop_banks(x.shape[0]), self.handle.logit_mask)
        wrapper = EnsembleLinear(ensemble.online, scorer, is_training or (lambda: self.handle.training))
        self.handle.install.set_attribute(owner, name, wrapper)
        return wrapper

    def hook_query_module(self, module: nn.Module, query_from_output: Callable[[Any], Tensor]) -> None:
        def record(mod: nn.Module, args: Any, output: Any) -> None:
            if self.active:
                self.query_seen(query_from_output(output))

        self.handle.install.forward_hook(module, record)

    def run_query_when_missing(self, model: nn.Module, query_module: nn.Module) -> None:
        """Run ``query_module`` on ``model``'s input, under ``no_grad``, when a forward of ``model`` needs a
        query nobody recorded: the first training forward of a stream batch, or a routed inference call
        whose loop did not run it first. A loop that runs it itself pays nothing."""
        handle = self.handle

        def before(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
            if not self.active or handle.router is None:
                return
            missing = handle._pending_query is None if handle.training else (
                handle.routing_active() and self.eval_query is None
            )
            images = first_tensor(args, kwargs)
            if missing and images is not None:
                with torch.no_grad():
                    query_module(images)

        handle.install.forward_pre_hook(model, before, with_kwargs=True)

    def hook_route_module(
        self,
        module: nn.Module,
        *,
        route_kwarg: Optional[str],
        route_value: Optional[RouteValue],
        query_from_call: Optional[QueryFromCall],
        banks_follow_routing: bool,
        used_from_output: Optional[UsedFromOutput] = None,
    ) -> None:
        """Pre-hook on the route module: reads the query from the call (if given) and injects the route.

        ``used_from_output`` maps the module's output to the experts it actually used: the first routed
        call is checked against them (:meth:`Retrofit.note_routed`).
        """
        handle = self.handle
        callee = f"{type(module).__name__}.forward"
        if route_kwarg is not None:
            require_keyword(module.forward, route_kwarg, family=self.family, callee=callee)

        def before(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
            self._injected = None
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
            self._injected = experts
            handle.observed["routed"] = experts
            value = experts if route_value is None else route_value(experts, mod, args, kwargs)
            return args, {**kwargs, route_kwarg: value}

        handle.install.forward_pre_hook(module, before, with_kwargs=True)
        if used_from_output is not None:
            def after(mod: nn.Module, args: Any, output: Any) -> None:
                injected, self._injected = self._injected, None
                if injected is not None and self.active and handle.wants_observation:
                    handle.note_routed(injected, used_from_output(output), callee)

            handle.install.forward_hook(module, after)

    def hook_batch_size(self, module: nn.Module) -> None:
        """Record the size of ``module``'s training calls (first tensor argument) for ``end_batch``."""
        def before(mod: nn.Module, args: Tuple[Any, ...]) -> None:
            if self.active and args and isinstance(args[0], Tensor) and args[0].ndim > 0:
                self.batch_seen(args[0].shape[0])

        self.handle.install.forward_pre_hook(module, before)

    def hook_banks(self, module: nn.Module, bank_from_call: BankFromCall) -> None:
        def after(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> None:
            if self.active:
                first = args[0] if args and isinstance(args[0], Tensor) else None
                if first is not None and first.ndim > 0:
                    self.batch_seen(first.shape[0])
                self.banks_seen(bank_from_call(mod, args, kwargs, output))

        self.handle.install.forward_hook(module, after, with_kwargs=True)
