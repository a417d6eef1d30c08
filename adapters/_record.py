"""The record of one retrofit's forward passes: what its hooks write, and the only object they write to.

The handle (:class:`~fly_modules.adapters.Retrofit`) is what the user holds; the :class:`Record` is what the
layouts' hooks fill and read back: the stream batch in progress (training, until ``end_batch``), the inference
forward in progress, what the model was seen to use, how routing is steered (forced experts, ``verify()``),
and a layout's own per-call state (:attr:`Record.own`). ``verify()`` snapshots it whole (:meth:`Record.parts`);
``state_dict`` saves the batch part.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional, Set, Tuple, Union

import torch
from torch import Tensor

__all__ = ["Record"]


class Record:
    """What the hooks recorded for the forward passes of one retrofit.

    Attributes:
        query: router features of the stream batch's first training forward (later online iterations see
            the same images).
        size: samples of that forward (the default ``batch_size`` of ``end_batch``).
        trained_banks: ensemble banks the latest training forward used (moved after the optimizer step).
        ensemble_steps: EMA steps taken since the last ``end_batch``.
        eval_query: router features of the inference forward in progress: every routed call of that forward
            reads them (a prompt module called at each prompted layer), until the model's forward returns
            (or, for a routed method called outside it, until that call returns).
        forward_routing: ``(eval_query, experts)``: the routing of that forward, computed once.
        in_forward: the retrofitted model's forward is running (set and cleared by its hooks).
        forward_training: whether that forward trains (:meth:`start_forward`).
        eval_banks: ``(B,)`` banks the inference forward used (taken by the ensembled head).
        injected: experts the routing hook injected into the inference forward.
        routed: ``(B,)`` experts :meth:`route` gave the latest inference forward.
        routed_query: inside ``verify()``, the features :meth:`route` was last asked to route.
        used: experts the model's output shows that forward used (``None``: not observable).
        trained: experts whose prompts the latest training forward used.
        ensembled: ensemble banks the latest ensembled inference used (an int: one bank for all; a list,
            inside ``verify()``: the banks of every per-expert classifier that answered).
        forced: the experts routed inference answers instead of asking the router (:meth:`forcing`).
        unrouted: inside :meth:`unrouting`: inference is not routed (the codebase's own selection) and records
            nothing (a pass of the method's own, e.g. class statistics at a task end).
        verifying: inside ``verify()``: every routed call is observed.
        confirmed: experts seen taking effect once (observation stops when all were).
        warned_no_ema: ``end_batch`` warned once that the EMA copies did not move.
        train_in_eval: the retrofit option: a forward with autograd recording is a training forward whatever
            the model's mode (:attr:`training`).
        query_source: what produces the router's query, for error messages.
        caller: ``fly_modules.adapters.<method>``, the method the user asked for, which starts every message.
        own: a layout's own per-call state (MVP's query pass, the prefix models' running call), snapshotted
            with the record.
        handle: the :class:`~fly_modules.adapters.Retrofit` whose record this is (its router, ensemble,
            model and removal; the handle imports this module, not the reverse).
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.query: Optional[Tensor] = None
        self.size: Optional[int] = None
        self.trained_banks: Optional[Tensor] = None
        self.ensemble_steps = 0
        self.eval_query: Optional[Tensor] = None
        self.eval_banks: Optional[Tensor] = None
        self.injected: Optional[Tensor] = None
        self.routed: Optional[Tensor] = None
        self.routed_query: Optional[Tensor] = None
        self.forward_routing: Optional[Tuple[Tensor, Tensor]] = None
        self.in_forward = False
        self.forward_training = False
        self.used: Optional[Tensor] = None
        self.trained: Optional[Tensor] = None
        self.ensembled: Union[int, Tensor, List[int], None] = None
        self.forced: Union[int, Tensor, None] = None
        self.unrouted = False
        self.verifying = False
        self.confirmed: Set[int] = set()
        self.warned_no_ema = False
        self.train_in_eval = False
        self.query_source = "the query module"
        self.caller = f"fly_modules.adapters.{handle.family}"
        self.own: Any = None

    def parts(self) -> List[Any]:
        """The objects a snapshot of the record covers: itself and a layout's own state."""
        return [self] if self.own is None else [self, self.own]

    @property
    def training(self) -> bool:
        """Whether the forward in progress is a training forward, the one rule every hook reads (hooks on
        helper modules such as a frozen query model too): the retrofitted model is in training mode; or, with
        ``train_in_eval``, its forward was called with autograd recording (a loop that trains in eval mode:
        its inference runs under ``torch.no_grad()``), decided once per forward (a query pass inside it under
        ``no_grad`` belongs to it), and outside a forward by autograd's mode. Without ``train_in_eval`` a
        backward through an eval-mode output raises (:meth:`~fly_modules.adapters.Layout.guard_inference`)."""
        if self.handle.model.training:
            return True
        if not self.train_in_eval:
            return False
        return self.forward_training if self.in_forward else torch.is_grad_enabled()

    def start_forward(self) -> None:
        """The model's forward starts: whether it trains is decided now. A query a pass of the loop recorded
        just before, under ``no_grad`` (read as inference), belongs to this forward when it trains."""
        model_training = bool(self.handle.model.training)
        self.forward_training = model_training or (self.train_in_eval and torch.is_grad_enabled())
        self.in_forward = True
        if self.forward_training and not model_training and self.query is None and self.eval_query is not None:
            self.seen(query=self.eval_query)
            self.eval_query = None

    # ---------------------------------------------------------------------------------- what a forward used
    def seen(self, size: Optional[int] = None, *, query: Optional[Tensor] = None, banks: Optional[Tensor] = None,
             trained: Optional[Tensor] = None) -> None:
        """What a forward of ``size`` samples used: its router features ``query``, its ensemble ``banks`` and the
        experts whose prompts it ``trained``. In training the batch keeps its first size and query, the banks
        move after the optimizer step; at inference the query is routed and the banks ensembled."""
        handle = self.handle
        if query is not None and handle.router is None:
            query = None
        if banks is not None and handle.ensemble is None:
            banks = None
        if not self.training:
            if self.unrouted:
                return
            if query is not None:
                self.eval_query = query.detach()
            if banks is not None:
                self.eval_banks = banks.detach().reshape(-1).long()
            return
        if query is not None and self.query is None:
            self.query = query.detach()
        if size is None and query is not None:
            size = query.shape[0]
        if size is not None and self.size is None:
            self.size = int(size)
        if banks is not None:
            self.trained_banks = banks.detach().reshape(-1).long()
        if trained is not None:
            self.trained = trained.detach()

    def discard_batch(self) -> None:
        """Forget the stream batch recorded since the last ``end_batch``."""
        self.query, self.size, self.trained_banks, self.ensemble_steps = None, None, None, 0

    # ---------------------------------------------------------------------------------------------- routing
    def routing_active(self) -> bool:
        """Whether inference is routed now: the router is on and fitted (or an expert is forced)."""
        handle = self.handle
        if handle.router is None or handle.removed or self.unrouted:
            return False
        return self.forced is not None or handle.router.num_samples > 0

    def experts_for(self, features: Tensor) -> Tensor:
        """The router's (or the forced) ``(B,)`` experts of ``features``, in any mode; nothing recorded."""
        if self.forced is not None:
            return self.forced_experts(features.shape[0], features.device)
        router = self.handle.router
        return router.route(features.to(router.device))

    def forced_experts(self, size: int, device: torch.device) -> Tensor:
        """The forced ``(size,)`` experts (:meth:`forcing`): no router features needed."""
        forced = self.forced
        if isinstance(forced, Tensor):  # one expert per sample (verify's batch-independence check)
            if forced.shape != (size,):
                raise RuntimeError(f"Retrofit: {forced.numel()} forced experts for a routed call of {size} samples")
            return forced.to(device=device, dtype=torch.long)
        return torch.full((size,), int(forced), dtype=torch.long, device=device)

    def route_forced_unqueried(self, size: Optional[int], device: torch.device) -> Optional[Tensor]:
        """The forced experts of an inference call made before any query was recorded (a pass of the loop that
        runs the model before the query module, wrapped in ``handle.forcing(...)``: forcing asks the router
        nothing), recorded as :attr:`routed`; ``None`` when that is not the case (a query was recorded, nothing is
        forced, training, not routed, or inside ``verify()``, whose query checks need the recorded query)."""
        if self.forced is None or self.eval_query is not None or self.verifying or self.training:
            return None
        if not self.routing_active():
            return None
        if size is None:
            size = self.forced.shape[0] if isinstance(self.forced, Tensor) else None
        if size is None:
            raise RuntimeError(
                f"{self.caller}: an expert is forced but the routed call has no tensor argument to size the batch; "
                "force one expert per sample (handle.forcing(torch.full((B,), expert)))"
            )
        self.routed = self.forced_experts(size, device)
        return self.routed

    def route(self, features: Tensor) -> Optional[Tensor]:
        """The routed ``(B,)`` experts of an inference call, recorded as :attr:`routed`; ``None`` when the call
        is not routed (training, the router off, not fitted, or removed)."""
        if self.training or not self.routing_active():
            return None
        if self.verifying:
            self.routed_query = features.detach()
        experts = self.experts_for(features).to(features.device)
        self.routed = experts
        return experts

    def route_forward(self, query: Tensor) -> Optional[Tensor]:
        """:meth:`route` of the forward's recorded query, computed once per forward: every routed call of the
        forward gets the same experts."""
        routing = self.forward_routing
        if routing is not None and routing[0] is query:
            self.routed = routing[1]
            return routing[1]
        experts = self.route(query)
        self.forward_routing = None if experts is None else (query, experts)
        return experts

    def end_forward(self) -> None:
        """The forward is over: forget its inference query and its routing."""
        self.eval_query, self.forward_routing = None, None

    def pop_query(self, size: Optional[int]) -> Tensor:
        """Router features of the current inference forward, taken (``size``: the routed call's samples, checked)."""
        try:
            return self.forward_query(size)
        finally:
            self.eval_query = None

    def forward_query(self, size: Optional[int]) -> Tensor:
        """Router features of the current inference forward, left for its later routed calls (``size``: the
        routed call's samples, checked)."""
        query = self.eval_query
        caller = self.caller
        if query is None:
            raise RuntimeError(
                f"{caller}: the router is on but no query features were recorded before the routing module ran at "
                f"inference ({self.query_source} did not run first in this forward); run it before the model (or "
                "pass the query through the route module's call)"
            )
        if size is not None and query.shape[0] != size:
            raise RuntimeError(
                f"{caller}: the recorded query features hold {query.shape[0]} samples but the routed call has "
                f"{size}; run the query module on the same batch right before the model"
            )
        return query

    def pop_banks(self, size: int) -> Union[int, Tensor]:
        """Banks of the current inference forward, recorded as :attr:`ensembled`; the active bank when none
        were recorded."""
        banks, self.eval_banks = self.eval_banks, None
        if banks is None or banks.shape[0] != size:
            banks = int(self.handle.ensemble.active_expert)
        self.ensembled = banks
        return banks

    # ------------------------------------------------------------------------------------------ observation
    @property
    def wants_observation(self) -> bool:
        """Whether hooks should compute what the model used: until every expert was seen taking effect
        once, and during ``verify()``."""
        return self.verifying or len(self.confirmed) < (self.handle.num_experts or 1)

    def used_by_routed(self, routed: Tensor, used: Optional[Tensor], where: str) -> None:
        """The experts a routed inference call injected and those the model's output shows it used.

        Routed calls whose use is observable are compared (a host synchronisation each) until every
        expert was seen taking effect once: a model that ignores the routed value raises instead of
        evaluating unrouted.
        """
        self.routed, self.used = routed.detach(), None if used is None else used.detach()
        if used is None or not self.wants_observation:
            return
        if not torch.equal(used.reshape(-1).to(routed.device).long(), routed.reshape(-1).long()):
            raise RuntimeError(
                f"{self.caller}: {where} ignored the routed value: the router chose "
                f"experts {routed.reshape(-1).tolist()[:8]} but the model used {used.reshape(-1).tolist()[:8]}; the "
                "seam does not route this codebase (run handle.verify(batch) for details)"
            )
        self.confirmed.update(routed.reshape(-1).unique().tolist())

    # ---------------------------------------------------------------------------------------------- steering
    @contextlib.contextmanager
    def forcing(self, experts: Union[int, Tensor, None]) -> Iterator[None]:
        """Inside the block, routed inference answers ``experts`` (an int for every sample, or one per sample
        as a ``(B,)`` tensor) instead of asking the router, fitted or not."""
        before, self.forced = self.forced, experts
        try:
            yield
        finally:
            self.forced = before

    @contextlib.contextmanager
    def unrouting(self) -> Iterator[None]:
        """Inside the block, inference is not routed and records nothing (:attr:`unrouted`)."""
        before, self.unrouted = self.unrouted, True
        try:
            yield
        finally:
            self.unrouted = before

    @contextlib.contextmanager
    def observing(self) -> Iterator[None]:
        """Inside the block, hooks observe every routed call and the optimizer is not followed (``verify()``)."""
        before, self.verifying = self.verifying, True
        try:
            yield
        finally:
            self.verifying = before
