"""The handle every retrofit returns: the added modules, the per-batch call, checkpoints, verify, undo.

It owns the added :class:`~fly_modules.AnalyticRouter` and :class:`~fly_modules.TemporalEnsembleHead`,
the :class:`~fly_modules.adapters._restore.Installation` of hooks and the
:class:`~fly_modules.adapters._record.Record` the hooks fill (the families write the record, never the
handle); the user's loop adds :meth:`Retrofit.end_batch` (and :meth:`Retrofit.start_session` when experts
follow sessions).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from fly_modules import (
    AnalyticRouter,
    SampleBudgetSchedule,
    SessionSchedule,
    TemporalEnsembleHead,
    distributed,
)
from fly_modules._validation import InvalidParameterError, check_int

from . import _verify
from ._head import ClassifierSteps, no_ema_cause
from ._log import DiagnosticsLog
from ._options import Schedule
from ._record import Record
from ._restore import Installation, forget_retrofit, register_retrofit, registered_retrofit
from ._verify import VerifyReport

__all__ = ["Retrofit", "StepCounter", "live_retrofit"]

_STATE_FORMAT = 1


class StepCounter:
    """A method's own step counter (``task_count`` of FlyGCL, ``task_id`` of MISA): which expert's
    prompts the model trains. ``advance`` moves it to an expert the way the codebase's loop does."""

    def __init__(self, model: nn.Module, attribute: str, advance: Callable[[int], None]) -> None:
        self.model, self.attribute, self._advance = model, attribute, advance

    def read(self) -> int:
        return int(getattr(self.model, self.attribute))

    def advance(self, expert: int) -> None:
        if self.read() != expert:
            self._advance(expert)

    def restore(self, value: int) -> None:
        """Set the attribute directly (a resumed model; the codebase's advance already ran before)."""
        setattr(self.model, self.attribute, int(value))


def live_retrofit(model: nn.Module) -> Optional["Retrofit"]:
    """The retrofit installed on ``model`` now (``None``: none, or only a deep copy's, or removed)."""
    previous = registered_retrofit(model)
    if previous is not None and not previous.removed and previous.model is model:
        return previous
    return None


def already_retrofitted(model: nn.Module, previous: "Retrofit") -> RuntimeError:
    return RuntimeError(
        f"{type(model).__name__} is already retrofitted ({previous!r}); call remove() on that handle first "
        "(handle.remove() puts the model back as it was), then retrofit again"
    )


class Retrofit:
    """Handle returned by every ``retrofit``: the added modules, the per-batch call, checkpoints and undo.

    Attributes:
        model: the retrofitted model.
        family: the adapter family that wired it.
        router: the :class:`~fly_modules.AnalyticRouter` (``None`` when ``router=False``).
        ensemble: the :class:`~fly_modules.TemporalEnsembleHead` (``None`` when ``ensemble=False``).
        schedule: the expert-start schedule (``None``: experts start only through :meth:`start_expert`).
        optimizer: the optimizer whose steps move the EMA copies (``None``: call :meth:`update_ensemble`).
        current_expert: the expert trained now (the router's target).
        num_experts: experts the method declared.
        logit_mask: mask added to the ensemble members before aggregation (:meth:`set_logit_mask`).
        process_group: ``torch.distributed`` group of a data-parallel run (the ``distributed`` option,
            resolved when the retrofit was made; ``None``: this process trains alone). ``end_batch`` adds every
            process's rows to the router and steps the schedule by the global batch size; the ensemble moves
            the banks that any process trained.
        record: what the hooks recorded for the stream batch and the forward in progress, and what they
            saw the model use (:class:`~fly_modules.adapters._record.Record`; the families write it).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        family: str = "custom",
        router: Optional[AnalyticRouter],
        ensemble: Optional[TemporalEnsembleHead],
        schedule: Schedule,
        start_method_expert: Callable[[int], None],
        banks_of_expert: Callable[[int], Sequence[int]],
        current_expert: int = 0,
        num_experts: Optional[int] = None,
        step_counter: Optional[StepCounter] = None,
        installation: Optional[Installation] = None,
        corrections: Sequence[Callable[[Installation], None]] = (),
        inference: Optional[Callable[[Any], Any]] = None,
        process_group: Optional[Any] = None,
        distributed: Any = False,
    ) -> None:
        # Two live retrofits of one model would wrap each other's seams, and removing them in the
        # order they were made would leave a wrapper behind: refuse the second one.
        previous = live_retrofit(model)
        if previous is not None:
            raise already_retrofitted(model, previous)
        if num_experts is None and router is not None:
            num_experts = router.num_experts
        if schedule is not None and num_experts is not None and schedule.num_experts > num_experts:
            raise InvalidParameterError(
                f"Retrofit: the schedule starts {schedule.num_experts} experts but only {num_experts} are declared"
            )
        self.model = model
        self.family = family
        self.router = router
        self.ensemble = ensemble
        self._classifier_steps = None if ensemble is None else ClassifierSteps(ensemble)  # the no-EMA warning's cause
        self.schedule = schedule
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.current_expert = int(current_expert)
        self.num_experts = num_experts
        self.logit_mask: Optional[Tensor] = None
        self.process_group: Optional[Any] = process_group
        if router is not None:
            router.process_group = process_group  # router.update gathers every process's rows
        self._distributed = distributed  # the option as given: "auto" is checked again at each end_batch
        self.record = Record(self)
        self._install = Installation() if installation is None else installation
        # ``correct(installation)`` for each upstream fix the retrofit installed (``correct_assembly``):
        # verify() compares the retrofit with the model carrying these fixes only.
        self._corrections = list(corrections)
        # how verify() evaluates when the model's inference is not its forward (reference: model.predict)
        self._inference = inference
        self._start_method_expert = start_method_expert
        self._banks_of_expert = banks_of_expert
        self._step_counter = step_counter
        self._optimizer_hook: Any = None
        self._following = False
        register_retrofit(model, self)
        self._install.add_undo(functools.partial(forget_retrofit, model, self))
        for correct in self._corrections:
            correct(self._install)

    @property
    def removed(self) -> bool:
        return self._install.removed

    @property
    def install(self) -> Installation:
        """The hooks and attribute swaps of this retrofit (what :meth:`remove` undoes), for inspection."""
        return self._install

    # ----------------------------------------------------------------------------------- evaluation
    def set_logit_mask(self, mask: Optional[Tensor]) -> None:
        """Logit mask added to every ensemble member *before* aggregation at inference.

        Call it once per evaluation with the seen-class mask (``0`` for seen classes, ``-inf``
        otherwise), shape ``(C,)`` or ``(B, C)``; ``None`` removes it. Adapters that return the
        ensemble through the model's own head use it; the ``reference`` adapter takes the mask as
        ``predict``'s argument instead.
        """
        if mask is not None and not isinstance(mask, Tensor):
            raise InvalidParameterError(f"Retrofit.set_logit_mask: expected a tensor or None, got {type(mask).__name__}")
        if mask is not None and mask.ndim not in (1, 2):
            raise InvalidParameterError(
                f"Retrofit.set_logit_mask: expected shape (C,) or (B, C), got {tuple(mask.shape)}"
            )
        if mask is not None and getattr(self.ensemble, "per_expert", False):
            raise InvalidParameterError(
                "Retrofit.set_logit_mask: the ensemble is a pool of per-expert classifiers, each answering its own "
                "classes; mask the model's concatenated logits in your own code"
            )
        self.logit_mask = mask

    # ------------------------------------------------------------------- a loop that feeds the handle itself
    def record_trained_banks(self, banks: Tensor) -> None:
        """The ensemble banks the latest training forward used (moved after the optimizer step); for a loop
        that feeds the handle itself (``reference.build_handle``), where no hook records them."""
        self.record.trained_banks = banks.detach()

    def routing_active(self) -> bool:
        """Whether inference is routed now: the router is on and fitted (or an expert is forced)."""
        return self.record.routing_active()

    def route(self, features: Tensor) -> Tensor:
        """The router's ``(B,)`` experts of ``features`` (for a loop that routes its own calls)."""
        return self.record.experts_for(features)

    def forcing(self, experts: Union[int, Tensor, None]) -> ContextManager[None]:
        """Inside the block, routed inference answers ``experts`` (an int for every sample, or one per sample
        as a ``(B,)`` tensor) instead of asking the router, fitted or not (per-expert evaluations)."""
        return self.record.forcing(experts)

    def unrouted(self) -> ContextManager[None]:
        """Inside the block, inference calls keep the codebase's own selection (nothing is routed, no query is
        needed or recorded): a pass the method runs for its own training in eval mode under ``no_grad`` (a
        memory pass, class statistics with the task it names). Classifiers still answer their ensemble."""
        return self.record.unrouting()

    def discard_batch(self) -> None:
        """Forget what the hooks recorded since the last ``end_batch`` (e.g. extra epochs over a batch)."""
        self.record.discard_batch()

    # ------------------------------------------------------------------------------- training calls
    def attach_optimizer(self, optimizer: Union[torch.optim.Optimizer, str, None]) -> None:
        """Move the EMA copies of the banks the last forward trained after each ``optimizer.step()``.

        A loop that re-creates its optimizer (the JH-LEE and HiDe loops do at every task with
        ``reinit_optimizer``) is followed: the first step of another optimizer that trains the same
        classifier moves the hook to it (or call this method with the new optimizer yourself).
        ``"auto"``: no optimizer yet; the first one that steps the classifier is attached.
        """
        if self.ensemble is None or optimizer is None:
            return
        if not self._following:
            self._install.global_step_post_hook(self._follow_optimizer)
            self._following = True
        if optimizer == "auto":
            return
        if self._optimizer_hook is not None:
            self._optimizer_hook.remove()

        def after_step(opt: Any, args: Any, kwargs: Any) -> None:
            if not self.removed:
                self.update_ensemble()

        self.optimizer = optimizer
        self._optimizer_hook = self._install.step_post_hook(optimizer, after_step)

    def _follow_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.removed or self.record.verifying or optimizer is self.optimizer or self.ensemble is None:
            return
        weight = self.ensemble.online.weight
        if any(p is weight for group in optimizer.param_groups for p in group["params"]):
            self.attach_optimizer(optimizer)  # the loop re-created its optimizer
            self.update_ensemble()

    def _optimizer_hook_attached(self) -> bool:
        return self._optimizer_hook is not None and self._install.has_hook(self._optimizer_hook)

    def update_ensemble(self) -> None:
        """One EMA step (what the optimizer hook runs; call it yourself if you passed no optimizer)."""
        if self.ensemble is None:
            return
        banks = self.record.trained_banks
        if banks is not None and self.process_group is not None:
            banks = distributed.gather_rows(banks.reshape(-1), self.process_group)  # the union over the ranks
        self.ensemble.update(None if banks is None else banks)
        self.record.ensemble_steps += 1

    def end_batch(self, batch_size: Optional[int] = None, *, query: Optional[Tensor] = None) -> List[int]:
        """Call once per stream batch, after its online iterations.

        Adds the batch's query features (recorded by the hooks during training, or ``query`` if
        given, e.g. features of the un-augmented batch) to the router with the current expert as
        target, then advances a sample-budget schedule by ``batch_size`` (default: the samples of the
        batch's first training forward; the baseline variant installs no hook, so pass it there).
        Returns the experts started.

        In a data-parallel run (``process_group``; every process calls it once per stream batch) every
        process's rows reach every router and the schedule counts the global batch, the sum of the
        processes' ``batch_size``, in one exchange (docs/adapters.md, "Several processes and mixed precision").

        The experts the schedule starts run the method's own start with autograd as the caller has it (a
        start that trains, such as FlyGCL's classifier alignment, works).

        Raises ``RuntimeError`` when the router is on and no query was recorded (the query module did
        not run in training), and when the method's own step counter left the current expert.
        """
        self._check_step_counter()
        features = query if query is not None else self.record.query
        if self.router is not None and features is None and not self.removed:
            seen = "a training forward ran" if self.record.size is not None else "no training forward was seen"
            raise RuntimeError(
                f"Retrofit.end_batch: the router is on but no query features were recorded since the last end_batch "
                f"({seen}; the router reads them from {self.record.query_source}). Run it in your training forward with "
                f"the model in training mode, or pass end_batch(query=features), or retrofit with router=False"
            )
        recorded = self.record.size
        if batch_size is None:
            batch_size = features.shape[0] if features is not None else (recorded or 0)
        if self.ensemble is not None and recorded is not None and self.record.ensemble_steps == 0 \
                and not self.record.warned_no_ema:
            cause = no_ema_cause(self.ensemble, stepped=self._classifier_steps.stepped())
            if cause is not None:
                self.record.warned_no_ema = True
                warnings.warn(cause, RuntimeWarning, stacklevel=3)
        # Before forgetting the batch: a rejected update keeps it (discard_batch() drops it).
        global_size = self._add_batch(features, int(batch_size))
        self.record.query, self.record.size, self.record.ensemble_steps = None, None, 0
        started: List[int] = []
        if isinstance(self.schedule, SampleBudgetSchedule):
            started = self.schedule.step(global_size)
            for expert in started:
                self.start_expert(expert)
        if self._classifier_steps is not None:
            self._classifier_steps.rebase()
        return started

    def _add_batch(self, features: Optional[Tensor], batch_size: int) -> int:
        """Add the batch's rows to the router and return the global batch size: with a process group, every
        process's rows and sizes, in one exchange (a header of a few ints, then the rows)."""
        group, router = self.process_group, self.router
        if group is None and distributed.auto_group_appeared(self._distributed, group):
            raise RuntimeError(
                f"Retrofit.end_batch: torch.distributed now runs {dist.get_world_size()} processes but the retrofit "
                "was made before dist.init_process_group, so each process would learn alone: retrofit after "
                "init_process_group, or pass distributed=False to train each process alone"
            )
        if router is not None and features is not None:
            with torch.no_grad():
                features = features.detach().to(router.device)
                if group is None:
                    router.update(features, self.current_expert)
                    return batch_size
                return distributed.all_gather_update(router, features, self.current_expert, group, counted=batch_size)
        if group is None or not isinstance(self.schedule, SampleBudgetSchedule):
            return batch_size
        return distributed.all_reduce_count(batch_size, group)

    def _check_step_counter(self) -> None:
        counter = self._step_counter
        if counter is None or self.removed or counter.read() == self.current_expert:
            return
        raise RuntimeError(
            f"Retrofit: {type(self.model).__name__}.{counter.attribute} is {counter.read()} but the retrofit's current "
            f"expert is {self.current_expert}: the model trains one step's prompts while the router learns another's. "
            f"Let the schedule advance it (remove the increment from your loop), or call "
            f"handle.start_expert(model.{counter.attribute}) right after advancing it yourself"
        )

    def start_session(self, session: int) -> List[int]:
        """Call at the start of each session when experts follow sessions; returns the experts started."""
        if not isinstance(self.schedule, SessionSchedule):
            return []
        started = self.schedule.on_session_start(session)
        for expert in started:
            self.start_expert(expert)
        return started

    def start_expert(self, expert: int) -> None:
        """Start ``expert``: the method's own start (its step counter, prompt init) and fresh bank copies."""
        bound = None if self.num_experts is None else self.num_experts - 1
        try:
            index = check_int(expert, "expert", caller="Retrofit.start_expert", minimum=0, maximum=bound)
        except InvalidParameterError:
            span = f"[0, {self.num_experts})" if self.num_experts is not None else ">= 0"
            raise InvalidParameterError(f"Retrofit.start_expert: expert must be an int in {span}, got {expert!r}") from None
        self.current_expert = index
        self._start_method_expert(index)
        if self.ensemble is not None:
            for bank in self._banks_of_expert(index):
                self.ensemble.start_expert(int(bank))

    # ---------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> Dict[str, Any]:
        """What the retrofit adds to a run, as tensors, ints, strings and dicts (``weights_only`` loads it).

        Router statistics, ensemble banks (the online head belongs to the model's own state), the
        schedule, the current expert, the method's step counter when the family drives one, and a
        stream batch recorded but not ended yet. Runs no collective: in a data-parallel run every process
        holds the same state at a batch boundary, so rank 0's serves every rank (an unfinished batch is
        the saving process's share, and only that process may load it).
        """
        state: Dict[str, Any] = {"format": _STATE_FORMAT, "family": self.family, "current_expert": self.current_expert}
        if self.router is not None:
            state["router"] = dict(self.router.state_dict())
        if self.ensemble is not None:
            state["ensemble"] = {k: v for k, v in self.ensemble.state_dict().items() if not k.startswith("online.")}
        if self.schedule is not None:
            state["schedule"] = dict(self.schedule.state_dict())
        if self._step_counter is not None:
            state["method_step"] = self._step_counter.read()
        pending = {"query": self.record.query, "size": self.record.size, "trained_banks": self.record.trained_banks}
        state["pending"] = {k: v for k, v in pending.items() if v is not None}
        if self.process_group is not None and (self.record.query is not None or self.record.size is not None):
            state["pending_rank"] = dist.get_rank(self.process_group)  # an unfinished batch is this process's share
        if self.logit_mask is not None:
            state["logit_mask"] = self.logit_mask
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; checks the parts match this retrofit before changing anything."""
        caller = "Retrofit.load_state_dict"
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise InvalidParameterError(f"{caller}: expected a dict from Retrofit.state_dict() (format {_STATE_FORMAT})")
        if state.get("family") != self.family:
            raise InvalidParameterError(f"{caller}: the state is of family {state.get('family')!r}, this is {self.family!r}")
        for part, present in (("router", self.router), ("ensemble", self.ensemble), ("schedule", self.schedule),
                              ("method_step", self._step_counter)):
            if (part in state) != (present is not None):
                raise InvalidParameterError(
                    f"{caller}: the state {'has' if part in state else 'lacks'} `{part}` but this retrofit "
                    f"{'has none' if present is None else 'has one'}"
                )
        bound = None if self.num_experts is None else self.num_experts - 1
        current = check_int(state["current_expert"], "current_expert", caller=caller, minimum=0, maximum=bound)
        rank = None if self.process_group is None else dist.get_rank(self.process_group)
        if "pending_rank" in state and state["pending_rank"] != rank:
            raise InvalidParameterError(
                f"{caller}: the state holds process {state['pending_rank']}'s share of an unfinished stream batch, this "
                f"is process {rank}: save after end_batch (a batch boundary), or let each process load its own state")
        # Each module checks its part before changing anything; the router is put back if the ensemble's
        # part is then refused, so the handle is never half-loaded.
        router_before = None if self.router is None else _cloned(self.router.state_dict())
        try:
            if self.router is not None:
                self.router.load_state_dict(state["router"])
            if self.ensemble is not None:
                # The online head is the model's own parameter: keep it, load the banks.
                online = {f"online.{k}": v for k, v in self.ensemble.online.state_dict().items()}
                self.ensemble.load_state_dict({**online, **state["ensemble"]})
        except Exception:
            if router_before is not None:
                self.router.load_state_dict(router_before)
            raise
        if self.schedule is not None:
            self.schedule.load_state_dict(state["schedule"])
        if self._step_counter is not None:
            self._step_counter.restore(state["method_step"])
        self.current_expert = current
        pending = state.get("pending", {})
        self.record.query = pending.get("query")
        self.record.size = None if pending.get("size") is None else int(pending["size"])
        self.record.trained_banks = pending.get("trained_banks")
        self.logit_mask = state.get("logit_mask")

    # --------------------------------------------------------------------------------------- verify
    def verify(
        self,
        batch: Any,
        *,
        forward: Optional[Callable[[Any], Any]] = None,
        loss: Optional[Callable[[Tensor, Tensor], Tensor]] = None,
        targets: Optional[Tensor] = None,
        strict: bool = False,
    ) -> VerifyReport:
        """Check on one batch that the retrofit works on this model; see ``docs/adapters.md``.

        Runs the model a few times (training and inference, each expert forced in turn, one training
        step with a throw-away optimizer, the real ``remove()``, the first samples of the batch together
        and one by one for batch independence) and puts the model, its gradients,
        the random number generators, the user's optimizer and this handle back exactly as they were.

        Raises :class:`~fly_modules.adapters.UnrestorableStateError`, before running anything, when the model
        holds state it could not put back (inference-mode tensors).

        Args:
            batch: the model's input (``x`` of your loop's ``(x, y)``; a tuple or list is refused unless
                ``forward`` takes it).
            forward: ``forward(batch) -> output`` as your loop calls the model (default ``model(batch)``);
                the output is the logits, or a dict with ``"logits"``, or a tuple starting with them. It is
                called in training and in eval mode: read ``handle.model.training`` where your loop passes
                ``train=...``, and ``handle.current_expert`` where it passes the task id.
            loss: ``loss(logits, targets)`` for the training step (default cross-entropy).
            targets: labels for that step (default ``arange(B) % C``).
            strict: raise ``RuntimeError`` listing the failures instead of only reporting them.

        Returns:
            a :class:`~fly_modules.adapters.VerifyReport` (``ok``, ``checks``; ``print`` it).
        """
        with self._local():  # verify may run on one process only: no collective
            report = _verify.verify(self, batch, forward=forward, loss=loss, targets=targets)
        if strict and not report.ok:
            raise RuntimeError(f"Retrofit.verify failed:\n{report}")
        return report

    @contextlib.contextmanager
    def _local(self) -> Iterator[None]:
        """Inside the block the handle and its router run no collective (their process group is ``None``)."""
        group = self.process_group
        self.process_group = None
        if self.router is not None:
            self.router.process_group = None
        try:
            yield
        finally:
            self.process_group = group
            if self.router is not None:
                self.router.process_group = group

    # ------------------------------------------------------------------------------------ diagnostics
    def log_to(self, writer: Any, *, num_classes: Optional[int] = None, prefix: str = "fly") -> DiagnosticsLog:
        """A :class:`~fly_modules.adapters.DiagnosticsLog` writing this retrofit's routing accuracy and expert
        use to ``writer`` (a ``SummaryWriter`` or any callable ``(tag, value, step)``); docs/diagnostics.md."""
        return DiagnosticsLog(self, writer, num_classes=num_classes, prefix=prefix)

    # ----------------------------------------------------------------------------------------- undo
    def remove(self) -> None:
        """Undo the retrofit: remove every hook and restore every replaced attribute (idempotent)."""
        self._install.remove()

    def __enter__(self) -> "Retrofit":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return (
            f"Retrofit(model={type(self.model).__name__}, family={self.family!r}, router={self.router is not None}, "
            f"ensemble={self.ensemble is not None}, schedule={self.schedule!r}, removed={self.removed})"
        )


def _cloned(state: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in state.items()}

