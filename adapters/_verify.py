"""``Retrofit.verify``: checks, on one batch of the user's own model, that the retrofit does what it
claims, and reports them in plain words. Everything it touches is snapshotted and put back exactly.

The handle imports this module, not the reverse: ``handle`` below is the :class:`Retrofit` calling.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Mapping, Optional

import torch
from torch import Tensor

from fly_modules._validation import InvalidParameterError

from ._batch_independence import HINT, batch_independence, batch_size, take_rows
from ._restore import Installation, Snapshot, register_retrofit
from ._verify_ensemble import check_ensemble_inference, check_ensemble_step
from ._verify_query import SAME, query_checks
from ._verify_report import Check, VerifyReport
from ._verify_report import attempt as _attempt

__all__ = ["Check", "UnrestorableStateError", "VerifyReport", "verify"]

_SEED = 20260
_BATCH_SAMPLES = 8  # batch independence: the first samples of the batch, each also run alone


class UnrestorableStateError(RuntimeError):
    """``verify`` refuses a model holding state it could not put back exactly; nothing was run."""


# --------------------------------------------------------------------------------------------- runs
def _logits(output: Any) -> Tensor:
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
        return output["logits"]
    if isinstance(getattr(output, "logits", None), Tensor):
        return output.logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    raise TypeError(
        f"cannot find the logits in the model's output ({type(output).__name__}); pass forward=... returning them"
    )


class _Runner:
    """Calls the model the user's way, in a given mode, with the same random numbers every time."""

    def __init__(self, handle: Any, batch: Any, forward: Optional[Callable[[Any], Any]]) -> None:
        self.model, self.batch = handle.model, batch
        self.train_forward = forward or handle.model
        self.eval_forward = forward or handle._inference or handle.model
        self.forward = forward
        self.devices = sorted({p.device.index or 0 for p in handle.model.parameters() if p.device.type == "cuda"})

    def __call__(self, training: bool, batch: Any = None) -> Tensor:
        self.model.train(training)
        with torch.random.fork_rng(devices=self.devices), torch.set_grad_enabled(training):
            torch.manual_seed(_SEED)
            forward = self.train_forward if training else self.eval_forward
            return _logits(forward(self.batch if batch is None else batch))


def _differs(a: Tensor, b: Tensor) -> str:
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} and {tuple(b.shape)}"
    finite = torch.isfinite(a) & torch.isfinite(b)
    gap = (a - b)[finite].abs().max().item() if bool(finite.any()) else float("nan")
    return f"max |difference| {gap:.3g}"


# ------------------------------------------------------------------------------------------- verify
def verify(
    handle: Any,
    batch: Any,
    *,
    forward: Optional[Callable[[Any], Any]] = None,
    loss: Optional[Callable[[Tensor, Tensor], Tensor]] = None,
    targets: Optional[Tensor] = None,
) -> VerifyReport:
    _refuse_a_loop_pair(batch, forward)
    _refuse_an_empty_batch(batch)
    title = f"Retrofit of {type(handle.model).__name__} (family {handle.family!r})"
    if handle.removed:
        return VerifyReport(title, [Check("retrofit installed", False, "remove() was called on this handle")])
    model, run = handle.model, _Runner(handle, batch, forward)
    modules = [model, *handle._install.modules, *(m for m in (handle.router, handle.ensemble) if m is not None)]
    checks: List[Check] = []
    record = handle.record
    with record.observing():  # on in the snapshot: every restore keeps it on until the end
        snapshot = Snapshot(modules, [handle, handle.schedule, *record.parts()])
        if snapshot.unrestorable:
            raise UnrestorableStateError(
                f"Retrofit.verify: cannot put back {', '.join(snapshot.unrestorable[:4])} (inference-mode tensors); "
                "verify after creating them outside torch.inference_mode(), or do not verify this model"
            )
        try:
            handle.discard_batch()
            removed = _trial_removal(handle, run, snapshot, checks, targets)
            _check_training(handle, run, snapshot, removed, checks)
            _attempt(SAME, checks, lambda: checks.extend(Check(*c) for c in query_checks(handle, run, snapshot.restore,
                                                                                          batch)))
            _check_experts_trained(handle, run, snapshot, checks)
            check_ensemble_step(handle, run, snapshot, checks, loss, targets)
            _check_routing(handle, run, snapshot, checks)
            _check_batch_independence(handle, run, snapshot, checks)
            check_ensemble_inference(handle, run, snapshot, checks)
        finally:
            snapshot.restore(final=True)
    return VerifyReport(title, checks)


def _refuse_a_loop_pair(batch: Any, forward: Optional[Callable[[Any], Any]]) -> None:
    """A loop's ``(x, y)`` would reach ``model((x, y))`` and fail deep inside: say what to pass instead."""
    if forward is None and isinstance(batch, (tuple, list)):
        raise InvalidParameterError(
            f"Retrofit.verify: batch must be the model's input, got a {type(batch).__name__} of {len(batch)}; for a "
            "loop's (x, y) pass handle.verify(x, targets=y), or forward=... that takes the whole batch"
        )


def _refuse_an_empty_batch(batch: Any) -> None:
    if batch_size(batch) == 0:
        raise InvalidParameterError(
            "Retrofit.verify: batch holds 0 samples; pass one batch of your data (at least two samples, so that "
            "batch independence is checked too)"
        )


def _usage_run(run: _Runner, training: bool, forward: Optional[Callable[[Any], Any]]) -> Tensor:
    """The un-retrofitted model run the caller's way; its failure is the caller's input, raised in one line."""
    try:
        return run(training).detach()
    except Exception as error:  # noqa: BLE001  (reported as a usage error naming the argument)
        mode = "training" if training else "eval"
        what, fix = ("forward=...", "pass forward=... calling the model as your loop does") if forward is not None \
            else ("model(batch)", "pass the model's input as batch, or forward=... calling the model as your loop does")
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise InvalidParameterError(
            f"Retrofit.verify: {what} raised {type(error).__name__}: {first} ({mode} mode, on the model without "
            f"the retrofit); {fix}"
        ) from None


def _refuse_targets(targets: Optional[Tensor], logits: Tensor) -> None:
    if targets is None:
        return
    if not isinstance(targets, Tensor) or targets.ndim == 0 or targets.shape[0] != logits.shape[0]:
        found = (f"a {type(targets).__name__}" if not isinstance(targets, Tensor) else
                 f"shape {tuple(targets.shape)}")
        raise InvalidParameterError(
            f"Retrofit.verify: targets must be a tensor with one label per sample of the batch ({logits.shape[0]}), "
            f"got {found}; pass the labels of this batch (y of your loop's (x, y))"
        )


@dataclasses.dataclass
class _Unretrofitted:
    """What the model is without the retrofit (the real ``remove()``): its parameters ``(name, id,
    requires_grad)``, its ``state_dict`` keys and its training-mode logits (``None``: it could not be run)."""

    parameters: List[Any] = dataclasses.field(default_factory=list)
    keys: List[str] = dataclasses.field(default_factory=list)
    train: Optional[Tensor] = None


def _trial_removal(handle: Any, run: _Runner, snapshot: Snapshot, checks: List[Check],
                   targets: Optional[Tensor]) -> _Unretrofitted:
    """Run the real ``remove()``, record the un-retrofitted model's outputs, then reinstall exactly. The
    caller's inputs are checked there first (the model without the retrofit must run them)."""
    model = handle.model
    restore_install = handle._install.snapshot()
    removed = _Unretrofitted()
    try:
        handle._install.remove()
        leftovers = handle._install.leftovers()
        hooks, swaps = handle._install.counts()
        checks.append(Check(
            "remove() restores the model", not leftovers,
            "; ".join(leftovers) if leftovers else
            f"the real remove() took out all {hooks} hook(s) and put back all {swaps} replaced attribute(s)",
        ))
        removed.parameters = [(n, id(p), p.requires_grad) for n, p in model.named_parameters()]
        removed.keys = list(model.state_dict().keys())
        fixes = Installation()  # correct_assembly: the baseline to compare with is the corrected model
        for correct in handle._corrections:
            correct(fixes)
        try:
            removed.train = _usage_run(run, True, run.forward)
            _refuse_targets(targets, removed.train)
            _usage_run(run, False, run.forward)  # only whether it runs (the snapshot puts back what it changed)
        finally:
            fixes.remove()
    finally:
        restore_install()
        register_retrofit(model, handle)  # remove() forgot it
        snapshot.restore()
    return removed


def _check_training(handle: Any, run: _Runner, snapshot: Snapshot, removed: _Unretrofitted,
                    checks: List[Check]) -> None:
    model = handle.model
    now = [(n, id(p), p.requires_grad) for n, p in model.named_parameters()]
    before = removed.parameters
    keys, keys_before = list(model.state_dict().keys()), removed.keys
    differ = sorted({n for n, *_ in set(now) ^ set(before)} | set(keys).symmetric_difference(keys_before))
    if not differ and (now != before or keys != keys_before):
        differ = ["(their order)"]
    trainable = sum(1 for _, _, grad in now if grad)
    checks.append(Check(
        "training parameters untouched", not differ,
        f"the same {len(now)} parameter objects ({trainable} trainable) with the same requires_grad and state_dict "
        f"keys as without the retrofit" if not differ else
        f"parameters or state_dict keys differ from the un-retrofitted model's: {differ[:6]}; an optimizer or "
        "checkpoint made without the retrofit would not match what the model uses",
    ))

    def training_outputs() -> Check:
        logits = run(True).detach()
        snapshot.restore()
        if removed.train is None:
            return Check("training outputs unchanged", None, "the un-retrofitted model could not be run")
        equal = torch.equal(logits, removed.train)
        fixed = " (with its assembly corrected, correct_assembly=True)" if handle._corrections else ""
        return Check(
            "training outputs unchanged", equal,
            f"training-mode logits are bit-identical to the un-retrofitted model's{fixed}" if equal else
            f"training-mode logits differ from the un-retrofitted model's ({_differs(logits, removed.train)})",
        )

    _attempt("training outputs unchanged", checks, training_outputs)
    if handle.router is None:
        checks.append(Check("router receives queries", None, "router=False"))
        return

    def router_query() -> Check:
        handle.record.query = None
        run(True)
        query = handle.record.query
        snapshot.restore()
        name = "router receives queries"
        if query is None:
            return Check(name, False, (
                f"a training forward recorded no query features: {handle.record.query_source} did not run. end_batch() "
                "would raise; run it in your training loop (or pass end_batch(query=...))"
            ))
        shape_ok = query.ndim == 2 and query.shape[1] == handle.router.in_features
        finite = bool(torch.isfinite(query).all())
        return Check(name, shape_ok and finite, (
            f"each training batch gives the router a {tuple(query.shape)} query from {handle.record.query_source}"
            + ("" if shape_ok else f", but the router expects width {handle.router.in_features}")
            + ("" if finite else ", holding NaN or infinite values")
        ))  # a query that is the same for every sample: "router query varies across samples" (_verify_query)

    _attempt("router receives queries", checks, router_query)


def _check_experts_trained(handle: Any, run: _Runner, snapshot: Snapshot, checks: List[Check]) -> None:
    """Starting an expert must make the model train that expert's prompts (the method's own counter)."""
    name = "training follows the current expert"
    current = handle.current_expert
    experts = [current] + ([current + 1] if handle.num_experts is not None and current + 1 < handle.num_experts else [])
    seen: List[str] = []
    for expert in experts:
        handle.start_expert(expert)
        handle.record.trained = None
        try:
            run(True)
        except Exception as error:  # noqa: BLE001
            snapshot.restore()
            checks.append(Check(name, False, f"a training forward after start_expert({expert}) raised "
                                             f"{type(error).__name__}: {error}"))
            return
        trained = handle.record.trained
        snapshot.restore()
        if trained is None:
            checks.append(Check(name, None, "this family does not tie the prompts trained to an expert" if
                                handle.family != "generic" else "nothing shows which expert a training forward "
                                "trained: pass bank_from_output=... (the expert of each sample, read from "
                                "route_module's output), or name a pool of per-expert classifiers as the head"))
            return
        used = sorted(set(trained.reshape(-1).tolist()))
        if used != [expert]:
            parts = "prompts (or per-expert classifiers)" if getattr(handle.ensemble, "per_expert", False) else "prompts"
            checks.append(Check(name, False, (
                f"after start_expert({expert}) the model trained the {parts} of expert(s) {used}: the router would "
                f"learn expert {expert} for samples that trained another's {parts}. The method's own step counter "
                "must follow the retrofit (no start_expert override that skips it; pass the task id your loop "
                "passes as handle.current_expert; start_expert=... adding the task's classifier)"
            )))
            return
        seen.append(str(expert))
    checks.append(Check(name, True, f"after start_expert(e) the model trains expert e's prompts (e = {', '.join(seen)})"))


def _check_routing(handle: Any, run: _Runner, snapshot: Snapshot, checks: List[Check]) -> None:
    router = handle.router
    if router is None:
        checks.append(Check("forcing each expert selects its prompts", None, "router=False"))
        return
    outputs: List[Tensor] = []
    usage: List[str] = []
    for expert in range(int(handle.num_experts or router.num_experts)):
        handle.record.used = handle.record.routed = None
        try:
            with handle.record.forcing(expert):
                outputs.append(run(False).detach())
        except Exception as error:  # noqa: BLE001
            snapshot.restore()
            checks.append(Check("forcing each expert selects its prompts", False,
                                f"an inference forward with expert {expert} forced raised {type(error).__name__}: {error}"))
            return
        used, routed = handle.record.used, handle.record.routed
        snapshot.restore()
        if routed is None:
            checks.append(Check("forcing each expert selects its prompts", False, (
                f"no routed value was injected at inference (expert {expert} forced): the routed module did not run, "
                f"or no query reached it from {handle.record.query_source}"
            )))
            return
        if used is not None:
            wrong = sorted(set(used.reshape(-1).tolist()) - {expert})
            if wrong:
                checks.append(Check("forcing each expert selects its prompts", False,
                                    f"with expert {expert} forced the model used the prompts of expert(s) {wrong}"))
                return
            usage.append(str(expert))
    checks.append(Check(
        "forcing each expert selects its prompts", True if usage else None,
        f"the model's outputs show it used the forced expert's prompts (experts {', '.join(usage)})" if usage else
        "this family's outputs do not show which prompt was used; judged by the logits below",
    ))
    same = [(a, b) for a in range(len(outputs)) for b in range(a + 1, len(outputs)) if torch.equal(outputs[a], outputs[b])]
    pairs = len(outputs) * (len(outputs) - 1) // 2
    checks.append(Check(
        "forcing each expert changes the logits", (not same) if len(outputs) > 1 else None,
        f"the {len(outputs)} experts give {len(outputs)} different outputs (all {pairs} pairs compared)"
        if not same and len(outputs) > 1 else "only one expert" if len(outputs) < 2 else
        f"expert pair(s) {same[:6]} give identical logits: the model ignores the routed value",
    ))
    fitted = router.num_samples
    checks.append(Check("router fitted", None if fitted == 0 else True, (
        f"holds {fitted} samples; inference is routed" if fitted else
        "holds no samples yet: inference uses the method's own selection until the first end_batch()"
    )))


def _check_batch_independence(handle: Any, run: _Runner, snapshot: Snapshot, checks: List[Check]) -> None:
    """Each sample's inference output is the one it gets alone: mixed experts, one expert, or (no router)
    the model's own selection, on the first ``_BATCH_SAMPLES`` samples of the batch."""
    total = batch_size(run.batch)
    if total is None:
        checks.append(Check("batch independence", None, "the batch holds no tensor to split into samples"))
        return
    router = handle.router
    num_experts = None if router is None else int(handle.num_experts or router.num_experts)

    def evaluate(rows: Tensor, experts: Optional[Tensor]) -> Tensor:
        try:
            with handle.record.forcing(experts):
                return run(False, take_rows(run.batch, rows, total))
        finally:
            snapshot.restore()

    try:
        hint = "" if handle._corrections else HINT  # corrected already: the mix is elsewhere
        found = batch_independence(evaluate, min(total, _BATCH_SAMPLES), num_experts, hint)
    except Exception as error:  # noqa: BLE001  (any failure of the user's model is reported)
        snapshot.restore()
        checks.append(Check("batch independence", False, f"raised {type(error).__name__}: {error}"))
        return
    checks.extend(Check(c.name, c.ok, c.detail) for c in found)
