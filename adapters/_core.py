"""The part of every retrofit that does not depend on the codebase: state, hooks, schedule, undo.

A :class:`Retrofit` owns the added :class:`~fly_modules.AnalyticRouter` and
:class:`~fly_modules.TemporalEnsembleHead`, the hook handles it registered, and the actions that
undo it. Family adapters (``reference``, ``l2p``, ``dualprompt``, ``mvp``, ``hide``, ``generic``) supply the
seams: where the query features appear, how a routed expert is injected, where the classifier is,
which ensemble banks a batch trained, and what starting an expert means for the method.

The training loop stays the user's. What the retrofit needs and a hook cannot see is one call per
stream batch, :meth:`Retrofit.end_batch`, made after the batch's online iterations (and
:meth:`Retrofit.start_session` at session starts when experts follow sessions).
"""

from __future__ import annotations

import functools
import operator
import weakref
from typing import Any, Callable, List, Optional, Sequence, TypeVar, Union

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from fly_modules import AnalyticRouter, SampleBudgetSchedule, SessionSchedule, TemporalEnsembleHead

__all__ = ["Retrofit", "Schedule", "SeamError", "missing_seam", "set_instance_attribute", "undo_on_failure"]

Schedule = Union[SampleBudgetSchedule, SessionSchedule, None]
# Instance attribute holding a weak reference to a model's live retrofit.
_MARKER = "_fly_modules_retrofit"


class SeamError(AttributeError):
    """A model lacks an attribute an adapter needs; the message says how to use the generic adapter."""


def missing_seam(family: str, model: nn.Module, path: str, what: str) -> SeamError:
    present = sorted(name for name, _ in model.named_children()) if isinstance(model, nn.Module) else []
    return SeamError(
        f"fly_modules.adapters.{family}: {type(model).__name__} has no `{path}` ({what}); its submodules are "
        f"{present}. If your code names it differently, pass the seams explicitly: "
        f"fly_modules.adapters.generic.retrofit(model, query_module=..., route_module=..., route_kwarg=..., "
        f"head_owner=..., head_name=...)"
    )


class Retrofit:
    """Handle returned by every ``retrofit``: the added modules, the per-batch call, and undo.

    Attributes:
        model: the retrofitted model.
        router: the :class:`~fly_modules.AnalyticRouter` (``None`` when ``router=False``).
        ensemble: the :class:`~fly_modules.TemporalEnsembleHead` (``None`` when ``ensemble=False``).
        schedule: the expert-start schedule (``None``: experts start only through :meth:`start_expert`).
        current_expert: the expert trained now (the router's target).
        logit_mask: mask added to the ensemble members before aggregation (:meth:`set_logit_mask`).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        router: Optional[AnalyticRouter],
        ensemble: Optional[TemporalEnsembleHead],
        schedule: Schedule,
        start_method_expert: Callable[[int], None],
        banks_of_expert: Callable[[int], Sequence[int]],
        current_expert: int = 0,
        num_experts: Optional[int] = None,
    ) -> None:
        # Two live retrofits of one model would wrap each other's seams, and removing them in the
        # order they were made would leave a wrapper behind: refuse the second one.
        previous = getattr(model, _MARKER, None)
        previous = previous() if previous is not None else None
        if previous is not None and not previous.removed and previous.model is model:  # (not a deepcopy's)
            raise RuntimeError(
                f"{type(model).__name__} is already retrofitted ({previous!r}); call remove() on that handle first"
            )
        if num_experts is None and router is not None:
            num_experts = router.num_experts
        if schedule is not None and num_experts is not None and schedule.num_experts > num_experts:
            raise ValueError(
                f"Retrofit: the schedule starts {schedule.num_experts} experts but only {num_experts} are declared"
            )
        self.model = model
        self.router = router
        self.ensemble = ensemble
        self.schedule = schedule
        self.current_expert = int(current_expert)
        self._start_method_expert = start_method_expert
        self._banks_of_expert = banks_of_expert
        self._handles: List[RemovableHandle] = []
        self._undo: List[Callable[[], None]] = []
        self._pending_query: Optional[Tensor] = None
        self._pending_size: Optional[int] = None
        self._trained_banks: Optional[Tensor] = None
        #: ``torch.distributed`` group of a data-parallel run: the ensemble then moves the banks that
        #: any rank trained (the router gathers through its own ``process_group``).
        self.process_group: Optional[Any] = None
        self.logit_mask: Optional[Tensor] = None
        #: experts the method declared (``start_expert`` rejects ids outside ``[0, num_experts)``).
        self.num_experts = num_experts
        self.removed = False
        model.__dict__[_MARKER] = weakref.ref(self)
        self.add_undo(lambda: model.__dict__.pop(_MARKER, None))

    # ------------------------------------------------------------------------- evaluation
    def set_logit_mask(self, mask: Optional[Tensor]) -> None:
        """Logit mask added to every ensemble member *before* aggregation at inference.

        Call it once per evaluation with the seen-class mask (``0`` for seen classes, ``-inf``
        otherwise), shape ``(C,)`` or ``(B, C)``; ``None`` removes it. Adapters that return the
        ensemble through the model's own head (``generic``, ``l2p``, ``dualprompt``, ``mvp``,
        ``hide``) use it; the ``reference`` adapter takes the mask as ``predict``'s argument instead.
        """
        if mask is not None and not isinstance(mask, Tensor):
            raise TypeError(f"Retrofit.set_logit_mask: expected a tensor or None, got {type(mask).__name__}")
        if mask is not None and mask.ndim not in (1, 2):
            raise ValueError(f"Retrofit.set_logit_mask: expected shape (C,) or (B, C), got {tuple(mask.shape)}")
        self.logit_mask = mask

    @property
    def training(self) -> bool:
        """The retrofitted model's mode (hooks on helper modules such as a frozen query model use it)."""
        return bool(self.model.training)

    # ----------------------------------------------------------------- used by family adapters
    def add_handle(self, handle: RemovableHandle) -> None:
        self._handles.append(handle)

    def add_undo(self, action: Callable[[], None]) -> None:
        self._undo.append(action)

    def record_query(self, features: Tensor) -> None:
        """Keep the first query of the batch (later online iterations see the same images)."""
        if self._pending_query is None:
            self._pending_query = features.detach()
        self.record_batch_size(features.shape[0])

    def discard_batch(self) -> None:
        """Forget what the hooks recorded since the last ``end_batch`` (e.g. extra epochs over a batch)."""
        self._pending_query, self._pending_size, self._trained_banks = None, None, None

    def record_batch_size(self, size: int) -> None:
        """Samples of the batch's first training forward (the default ``batch_size`` of ``end_batch``)."""
        if self._pending_size is None:
            self._pending_size = int(size)

    def record_trained_banks(self, banks: Tensor) -> None:
        """The ensemble banks the latest training forward used (moved after the optimizer step)."""
        self._trained_banks = banks.detach()

    def routing_active(self) -> bool:
        return self.router is not None and not self.removed and self.router.num_samples > 0

    def route(self, features: Tensor) -> Tensor:
        return self.router.route(features.to(self.router.gram.device))

    # ------------------------------------------------------------------------ training calls
    def attach_optimizer(self, optimizer: Optional[torch.optim.Optimizer]) -> None:
        """Move the EMA copies of the banks the last forward trained after each ``optimizer.step()``."""
        if self.ensemble is None or optimizer is None:
            return

        def after_step(opt: Any, args: Any, kwargs: Any) -> None:
            if not self.removed:
                self.update_ensemble()

        self.add_handle(optimizer.register_step_post_hook(after_step))

    def update_ensemble(self) -> None:
        """One EMA step (what the optimizer hook runs; call it yourself if you passed no optimizer)."""
        if self.ensemble is None:
            return
        banks = self._trained_banks
        if banks is not None and self.process_group is not None:
            from fly_modules.distributed import gather_rows

            banks = gather_rows(banks.reshape(-1), self.process_group)  # the union over the ranks
        self.ensemble.update(None if banks is None else banks)

    @torch.no_grad()
    def end_batch(self, batch_size: Optional[int] = None, *, query: Optional[Tensor] = None) -> List[int]:
        """Call once per stream batch, after its online iterations.

        Adds the batch's query features (recorded by the forward hook during training, or ``query``
        if given, e.g. features of the un-augmented batch) to the router with the current expert as
        target, then advances a sample-budget schedule by ``batch_size`` (default: the samples of the
        batch's first training forward as recorded by the adapter's hooks; the baseline variant installs
        no hook, so pass it there). Returns the experts started.
        """
        features = query if query is not None else self._pending_query
        recorded = self._pending_size
        if batch_size is None:
            batch_size = features.shape[0] if features is not None else (recorded or 0)
        if self.router is not None and features is not None:
            # Before forgetting the batch: a rejected update keeps it (discard_batch() drops it).
            self.router.update(features.to(self.router.gram.device), self.current_expert)
        self._pending_query, self._pending_size = None, None
        started: List[int] = []
        if isinstance(self.schedule, SampleBudgetSchedule):
            started = self.schedule.step(int(batch_size))
            for expert in started:
                self.start_expert(expert)
        return started

    def start_session(self, session: int) -> List[int]:
        """Call at the start of each session when experts follow sessions; returns the experts started."""
        if not isinstance(self.schedule, SessionSchedule):
            return []
        started = self.schedule.on_session_start(session)
        for expert in started:
            self.start_expert(expert)
        return started

    def start_expert(self, expert: int) -> None:
        """Start ``expert``: the method's own start (prompt init, ...) and fresh copies of its banks."""
        try:
            index = None if isinstance(expert, bool) else operator.index(expert)
        except TypeError:
            index = None
        if index is None or index < 0 or (self.num_experts is not None and index >= self.num_experts):
            bound = f"[0, {self.num_experts})" if self.num_experts is not None else ">= 0"
            raise ValueError(f"Retrofit.start_expert: expert must be an int in {bound}, got {expert!r}")
        self.current_expert = index
        self._start_method_expert(index)
        if self.ensemble is not None:
            for bank in self._banks_of_expert(index):
                self.ensemble.start_expert(int(bank))

    # ------------------------------------------------------------------------------ undo
    def remove(self) -> None:
        """Undo the retrofit: remove every hook and restore every replaced attribute (idempotent)."""
        if self.removed:
            return
        for handle in self._handles:
            handle.remove()
        for action in reversed(self._undo):
            action()
        self._handles.clear()
        self._undo.clear()
        self.removed = True

    def __enter__(self) -> "Retrofit":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return (
            f"Retrofit(model={type(self.model).__name__}, router={self.router is not None}, "
            f"ensemble={self.ensemble is not None}, schedule={self.schedule!r}, removed={self.removed})"
        )


_Install = TypeVar("_Install", bound=Callable[..., Retrofit])


def undo_on_failure(install: _Install) -> _Install:
    """Wrap a family's ``retrofit(model, ...)``: if it raises after creating its handle, remove what it
    installed, so the model is left as it was and can be retrofitted again."""

    @functools.wraps(install)
    def wrapper(model: nn.Module, *args: Any, **kwargs: Any) -> Retrofit:
        before = getattr(model, _MARKER, None)
        try:
            return install(model, *args, **kwargs)
        except BaseException:
            after = getattr(model, _MARKER, None)
            handle = after() if after is not None and after is not before else None
            if handle is not None:
                handle.remove()
            raise

    return wrapper  # type: ignore[return-value]


def _holder(obj: Any, name: str) -> Optional[dict]:
    """The dict of ``obj`` that stores ``name`` now: ``_parameters``, ``_buffers``, ``_modules`` of a
    module, or the instance ``__dict__``; ``None`` when only the class (or nothing) defines it."""
    if isinstance(obj, nn.Module):
        for store in (obj._parameters, obj._buffers, obj._modules):
            if name in store:
                return store
    return vars(obj) if name in vars(obj) else None


def set_instance_attribute(retrofit: Retrofit, obj: Any, name: str, value: Any) -> None:
    """``setattr`` on an instance, undone by the retrofit.

    Undo puts the old value back into the very dict that held it (a module's ``_modules``,
    ``_parameters`` or ``_buffers``, or the instance ``__dict__``), or deletes the new attribute so
    that the class attribute shows through again. ``nn.Module.__setattr__`` moves a child module,
    parameter or buffer out of ``__dict__``, so a plain ``vars(obj)`` record would miss it.
    """
    store = _holder(obj, name)
    old = store[name] if store is not None else None
    setattr(obj, name, value)

    def undo() -> None:
        current = _holder(obj, name)
        if current is not None:
            del current[name]
        if store is not None:
            store[name] = old

    retrofit.add_undo(undo)
