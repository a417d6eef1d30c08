"""Avalanche plugin: the analytic router and the temporal ensemble inside any Avalanche strategy.

``FlyPlugin`` retrofits the strategy's model through :mod:`fly_modules.adapters` and drives the retrofit
from the strategy's callbacks, so ``Naive(model, optimizer, plugins=[FlyPlugin()])`` trains and evaluates
like ``benchmarks.ablation.runner``. Imported only on explicit access; written against avalanche-lib 0.6. The
callback table and how the stream maps onto the retrofit: ``docs/adapters.md``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

try:
    from avalanche.benchmarks.scenarios.online import OnlineCLExperience
    from avalanche.core import SupervisedPlugin
except ModuleNotFoundError as error:
    if error.name == "distutils":
        raise ImportError(
            "fly_modules.adapters.avalanche: Avalanche imports GPUtil, which needs distutils (removed from the "
            "standard library in Python 3.12); install setuptools, or reinstall with "
            'pip install "fly-modules[avalanche]", which adds it on Python >= 3.12'
        ) from error
    if error.name is not None and error.name.split(".")[0] == "avalanche":
        raise ImportError(
            'fly_modules.adapters.avalanche needs Avalanche (avalanche-lib): pip install "fly-modules[avalanche]"'
        ) from error
    raise

from fly_modules import SampleBudgetSchedule, SessionSchedule, batch_seen_class_mask, class_mask

from . import reference
from ._handle import Retrofit
from ._log import DiagnosticsLog

__all__ = ["FlyPlugin"]

ScheduleArg = Union[str, SampleBudgetSchedule, SessionSchedule, None]
TRAIN_MASKS = (None, "batch", "seen")
_METHOD_HOOKS = ("loss", "on_optimizer_step", "on_batch_end", "on_session_end", "on_evaluate")


def _is_method_output(output: Any) -> bool:
    """``True`` for the ``MethodOutput`` of a seam-contract method (duck-typed)."""
    return not isinstance(output, Tensor) and all(
        hasattr(output, name) for name in ("logits", "features", "selection", "aux_loss")
    )


def _is_seam_method(model: nn.Module) -> bool:
    """``True`` when ``model`` implements :class:`~fly_modules.adapters.SeamContract` and the loop hooks."""
    return all(hasattr(model, name) for name in (*reference.REQUIRED, *_METHOD_HOOKS))


def _starts_session(experience: Any) -> Optional[bool]:
    """Whether ``experience`` starts a session; ``None`` when the stream hides it.

    Every experience of an ordinary stream is a session. A sub-experience of an online stream starts
    one when it is the first piece of its original experience, which a strategy may only know with
    ``split_online_stream(..., access_task_boundaries=True)``.
    """
    if not isinstance(experience, OnlineCLExperience):
        return True
    if not experience.access_task_boundaries:
        return None
    return bool(experience.is_first_subexp)


class _MethodLoss:
    """The strategy's criterion while :class:`FlyPlugin` trains a seam-contract method.

    During a training iteration it returns the method's own loss of the kept ``MethodOutput``; any
    other call (evaluation, periodic evaluation) goes to the strategy's original criterion.
    """

    def __init__(self, plugin: "FlyPlugin", original: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.plugin = plugin
        self.original = original

    def __call__(self, mb_output: Tensor, mb_y: Tensor) -> Tensor:
        plugin = self.plugin
        if plugin._train_output is None or plugin._model is None:
            return self.original(mb_output, mb_y)
        return plugin._model.loss(plugin._train_output, mb_y, plugin._train_logit_mask)


class FlyPlugin(SupervisedPlugin, supports_distributed=False):
    """Avalanche plugin adding the analytic router and/or the temporal ensemble to a strategy's model.

    Args:
        method: the adapter family ``fly_modules.adapters.retrofit`` uses (``"reference"`` for the
            methods implementing :class:`~fly_modules.adapters.SeamContract`; ``"l2p"``, ``"dualprompt"``, ...).
            For the generic adapter build the handle yourself and use :meth:`from_retrofit`.
        router, ensemble: which component to add (both ``False``: the method as published, with
            the plugin still driving its loop hooks and the seen-class mask).
        schedule: when experts start. ``"experience"``: one expert per session (a
            :class:`~fly_modules.SessionSchedule` over the model's ``num_experts``; needs task
            boundaries); a ``SampleBudgetSchedule`` (task-free, counted per first-epoch iteration)
            or ``SessionSchedule`` instance; ``None``: only through ``plugin.handle.start_expert``.
        train_mask: training logit mask: ``None`` (Avalanche's plain loss), ``"batch"`` (the
            classes of the minibatch: the reference protocol's), ``"seen"`` (all classes trained
            on so far).
        method_loss: for seam-contract methods, train with ``model.loss(output, y, mask)`` (default)
            instead of the strategy's criterion on the logits.
        **retrofit_kwargs: passed to the adapter (``expansion_dim``, ``ridge``, ``seed``,
            ``decays``, ``aggregate``, family options such as ``num_experts``). ``optimizer`` is not
            accepted: the plugin moves the EMA copies after each optimizer step itself.

    Attributes:
        handle: the :class:`~fly_modules.adapters.Retrofit` (``None`` until the first ``train`` or
            ``eval``); ``handle.router`` and ``handle.ensemble`` are the added modules.
        seen_classes: ``(K,)`` long tensor, the sorted labels trained on so far (``None`` before).
        session: index of the current session (``-1`` before the first task boundary).

    Example::

        plugin = FlyPlugin(schedule="experience", expansion_dim=1024, ridge=1e2)
        strategy = Naive(model=method, optimizer=opt, train_mb_size=16, plugins=[plugin])
        for experience in split_online_stream(bench.train_stream, 16, access_task_boundaries=True):
            strategy.train(experience)
        strategy.eval(bench.test_stream)
    """

    def __init__(
        self,
        *,
        method: str = "reference",
        router: bool = True,
        ensemble: bool = True,
        schedule: ScheduleArg = "experience",
        train_mask: Optional[str] = None,
        method_loss: bool = True,
        **retrofit_kwargs: Any,
    ) -> None:
        super().__init__()
        if not (schedule is None or schedule == "experience" or isinstance(schedule, (SampleBudgetSchedule, SessionSchedule))):
            raise ValueError(
                "FlyPlugin: schedule must be 'experience', a SampleBudgetSchedule, a SessionSchedule or None, "
                f"got {schedule!r}"
            )
        if train_mask not in TRAIN_MASKS:
            raise ValueError(f"FlyPlugin: train_mask must be one of {TRAIN_MASKS}, got {train_mask!r}")
        if "optimizer" in retrofit_kwargs:
            raise TypeError("FlyPlugin moves the EMA copies after each optimizer step itself; do not pass optimizer=")
        self.method = method
        self.schedule_option = schedule
        self.retrofit_options: Dict[str, Any] = dict(router=router, ensemble=ensemble, **retrofit_kwargs)
        self.train_mask = train_mask
        self.method_loss = bool(method_loss)
        self.moves_ensemble = True
        self.handle: Optional[Retrofit] = None
        self.seen_classes: Optional[Tensor] = None
        self.session = -1
        self._position = -1  # of the current sub-experience in its original experience (online streams)
        self._model: Optional[nn.Module] = None  # the seam-contract method, when the model is one
        self._train_output: Any = None
        self._train_logit_mask: Optional[Tensor] = None
        self._saved_logit_mask: Any = None
        self._mask_set = False
        self.diagnostics: Optional[DiagnosticsLog] = None
        self._log_request: Optional[Dict[str, Any]] = None
        self.samples_trained = 0  # stream samples of first-epoch iterations: the diagnostics' step

    @classmethod
    def from_retrofit(
        cls,
        handle: Retrofit,
        *,
        train_mask: Optional[str] = None,
        method_loss: bool = True,
        update_ensemble: bool = True,
    ) -> "FlyPlugin":
        """A plugin driving an existing retrofit (e.g. from ``fly_modules.adapters.generic.retrofit``).

        The strategy's model must be ``handle.model``; the handle's own schedule is driven. Pass
        ``update_ensemble=False`` when the handle was built with ``optimizer=`` (its hook already
        moves the EMA copies after each step; the plugin would move them twice).
        """
        if not isinstance(handle, Retrofit):
            raise TypeError(f"FlyPlugin.from_retrofit: expected a fly_modules.adapters.Retrofit, got {type(handle).__name__}")
        plugin = cls(schedule=None, train_mask=train_mask, method_loss=method_loss)
        plugin.handle = handle
        plugin.moves_ensemble = bool(update_ensemble)
        return plugin

    def log_to(self, writer: Any, *, num_classes: Optional[int] = None, prefix: str = "fly") -> "FlyPlugin":
        """Write the retrofit's routing accuracy and expert use (:class:`~fly_modules.adapters.DiagnosticsLog`)
        to ``writer`` after every evaluation, at the number of stream samples trained; returns the plugin."""
        self._log_request = dict(writer=writer, num_classes=num_classes, prefix=prefix)
        if self.handle is not None:
            self.diagnostics = self.handle.log_to(**self._log_request)
        return self

    # -------------------------------------------------------------------------------------- helpers
    def _retrofit(self, model: nn.Module) -> Retrofit:
        from . import retrofit

        options = dict(self.retrofit_options)
        schedule = self.schedule_option
        handle = retrofit(model, self.method, schedule=None if schedule == "experience" else schedule, **options)
        if schedule == "experience":
            experts = getattr(model, "num_experts", None) or options.get("num_experts")
            if experts is None:
                added = handle.router if handle.router is not None else handle.ensemble
                experts = None if added is None else added.num_experts
            if experts is None:
                raise ValueError(
                    f"FlyPlugin: schedule='experience' needs the number of experts; {type(model).__name__} has no "
                    "num_experts (pass num_experts=... or a SessionSchedule)"
                )
            handle.schedule = SessionSchedule(int(experts))
        return handle

    def _prepare(self, strategy: Any) -> Retrofit:
        """Retrofit the strategy's model on first use; check the model of a given handle."""
        _refuse_distributed()
        if self.handle is None:
            self.handle = self._retrofit(strategy.model)
        if self._log_request is not None and self.diagnostics is None:
            self.diagnostics = self.handle.log_to(**self._log_request)
        elif self.handle.model is not strategy.model:
            raise ValueError(
                f"FlyPlugin: the strategy's model ({type(strategy.model).__name__}) is not the retrofitted model "
                f"({type(self.handle.model).__name__}); give the strategy handle.model"
            )
        if self.handle.removed:
            raise RuntimeError("FlyPlugin: the retrofit was removed (handle.remove()); build a new plugin")
        self._model = strategy.model if _is_seam_method(strategy.model) else None
        return self.handle

    def _ends_session(self, experience: Any) -> bool:
        """Whether ``experience`` (just trained) ends a session.

        Avalanche 0.6.0's ``FixedSizeExperienceSplitter`` sets ``is_last_subexp`` only when the last
        piece is shorter than ``experience_size``, so the position of the sub-experience in its original
        experience (counted by the plugin) is compared with ``sub_stream_length`` as well.
        """
        if not isinstance(experience, OnlineCLExperience):
            return True
        if not experience.access_task_boundaries:
            return False
        return bool(experience.is_last_subexp) or self._position == int(experience.sub_stream_length) - 1

    def _observe(self, labels: Tensor) -> None:
        labels = labels.detach().reshape(-1).long()
        if self.seen_classes is not None:
            labels = torch.cat([self.seen_classes.to(labels.device), labels])
        self.seen_classes = torch.unique(labels)

    def _seen_mask(self, like: Tensor) -> Optional[Tensor]:
        """``(C,)`` mask of the seen classes for logits ``like`` of shape ``(B, C)``; ``None`` before training."""
        if self.seen_classes is None:
            return None
        return class_mask(self.seen_classes.to(like.device), like.shape[-1], dtype=like.dtype, device=like.device)

    def _training_mask(self, labels: Tensor, logits: Tensor) -> Optional[Tensor]:
        if self.train_mask == "batch":
            return batch_seen_class_mask(labels.to(logits.device), logits.shape[-1], dtype=logits.dtype, device=logits.device)
        if self.train_mask == "seen":
            return self._seen_mask(logits)
        return None

    @torch.no_grad()
    def _method_scores(self, model: nn.Module, x: Tensor, output: Any) -> Tensor:
        """Evaluation scores of a seam-contract method from the strategy's (routed) forward output."""
        mask = self._seen_mask(output.logits)
        handle = self.handle
        ensemble = None if handle is None or handle.removed else handle.ensemble
        if ensemble is None:
            return model.predict(x, mask)  # the method's own inference (plain logits + mask for most)
        # fly_modules.adapters.reference's predict, on the forward the strategy already ran.
        members = model.transform_logits(ensemble.member_logits(output.features, model.bank_of(output.selection)), output.selection)
        if mask is not None:
            members = members + mask
        scores = ensemble.aggregate_members(members)
        return scores.log() if ensemble.aggregate.startswith("softmax") else scores

    def _set_criterion(self, strategy: Any, install: bool) -> None:
        current = getattr(strategy, "_criterion", None)
        if install:
            if current is None:
                raise TypeError(
                    f"FlyPlugin(method_loss=True) replaces the criterion of an Avalanche SGD strategy; "
                    f"{type(strategy).__name__} has none (pass method_loss=False)"
                )
            if not isinstance(current, _MethodLoss):
                strategy._criterion = _MethodLoss(self, current)
        elif isinstance(current, _MethodLoss) and current.plugin is self:
            strategy._criterion = current.original

    # ------------------------------------------------------------------------------------- training
    def before_training(self, strategy: Any, **kwargs: Any) -> None:
        self._prepare(strategy)
        if self._model is not None and self.method_loss:
            self._set_criterion(strategy, install=True)

    def before_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        experience = strategy.experience
        boundary = _starts_session(experience)
        if boundary is None:
            if isinstance(self.handle.schedule, SessionSchedule):
                raise RuntimeError(
                    "FlyPlugin: one expert per session needs task boundaries, but this online stream hides them; "
                    "build it with split_online_stream(..., access_task_boundaries=True) or use a "
                    "SampleBudgetSchedule (task-free)"
                )
            return
        if isinstance(experience, OnlineCLExperience):
            self._position = 0 if boundary else self._position + 1
        if boundary:
            self.session += 1
            self.handle.start_session(self.session)

    def before_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        self._observe(strategy.mb_y)

    def after_forward(self, strategy: Any, **kwargs: Any) -> None:
        output = strategy.mb_output
        if _is_method_output(output):
            self._train_output = output
            logits = output.logits
        elif isinstance(output, Tensor):
            logits = output
        else:
            return
        self._train_logit_mask = mask = self._training_mask(strategy.mb_y, logits)
        strategy.mb_output = logits if mask is None else logits + mask

    def after_update(self, strategy: Any, **kwargs: Any) -> None:
        if self._model is not None and self._train_output is not None:
            self._model.on_optimizer_step(self._train_output)
        if self.moves_ensemble:
            self.handle.update_ensemble()

    def after_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        if strategy.clock.train_exp_epochs == 0:
            if self._model is not None and self._train_output is not None:
                self._model.on_batch_end(strategy.mb_x, strategy.mb_y, self._train_output)
            if self.diagnostics is not None:
                self.diagnostics.add_training(strategy.mb_y)  # before end_batch may start the next expert
            self.samples_trained += int(strategy.mb_y.shape[0])
            self.handle.end_batch(int(strategy.mb_y.shape[0]))
        else:
            # A later pass over samples the router already counted: drop the recorded query.
            self.handle.discard_batch()
        self._train_output = None
        self._train_logit_mask = None

    def after_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        if self._model is not None and self._ends_session(strategy.experience):
            self._model.on_session_end(max(self.session, 0))

    def after_training(self, strategy: Any, **kwargs: Any) -> None:
        self._set_criterion(strategy, install=False)
        self._train_output = None

    # ----------------------------------------------------------------------------------- evaluation
    def before_eval(self, strategy: Any, **kwargs: Any) -> None:
        handle = self._prepare(strategy)
        if self._model is not None:
            self._model.on_evaluate()
        elif handle.ensemble is not None and self.seen_classes is not None:
            # A generic retrofit's head ensembles with handle.logit_mask; set it for this evaluation.
            self._saved_logit_mask, self._mask_set = handle.logit_mask, True
            like = handle.ensemble.online.weight
            handle.set_logit_mask(
                class_mask(self.seen_classes.to(like.device), handle.ensemble.num_classes, dtype=like.dtype, device=like.device)
            )

    def after_eval_forward(self, strategy: Any, **kwargs: Any) -> None:
        if self.diagnostics is not None:
            self.diagnostics.add_inference(strategy.mb_y)
        output = strategy.mb_output
        if _is_method_output(output):
            strategy.mb_output = self._method_scores(strategy.model, strategy.mb_x, output)
        elif isinstance(output, Tensor) and (self.handle is None or self.handle.ensemble is None):
            mask = self._seen_mask(output)
            if mask is not None:
                strategy.mb_output = output + mask

    def after_eval(self, strategy: Any, **kwargs: Any) -> None:
        if self._mask_set and self.handle is not None:
            self.handle.set_logit_mask(self._saved_logit_mask)
        self._saved_logit_mask, self._mask_set = None, False
        if self.diagnostics is not None:
            self.diagnostics.write(self.samples_trained)

    def __repr__(self) -> str:
        return (
            f"FlyPlugin(method={self.method!r}, schedule={self.schedule_option!r}, train_mask={self.train_mask!r}, "
            f"handle={self.handle!r})"
        )


def _refuse_distributed() -> None:
    """Avalanche's distributed strategies wrap the model and split each minibatch in ways the plugin does not
    follow: refused, rather than one retrofit per process each seeing a share of the stream."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise RuntimeError(
            f"FlyPlugin: distributed strategies are not handled (torch.distributed runs {dist.get_world_size()} "
            "processes); train the strategy in one process, or retrofit the model in your own DDP loop "
            "(docs/adapters.md, 'Several processes and mixed precision')"
        )
