"""``Retrofit.verify``: checks, on one batch of the user's own model, that the retrofit does what it
claims, and reports them in plain words. Everything it touches is snapshotted and put back exactly.

The handle imports this module, not the reverse: ``handle`` below is the :class:`Retrofit` calling.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fly_modules._validation import InvalidParameterError

from ._batch_independence import HINT, batch_independence, batch_size, take_rows
from ._restore import Installation, Snapshot, register_retrofit
from ._verify_query import SAME, query_checks

__all__ = ["Check", "UnrestorableStateError", "VerifyReport", "verify"]

_SEED = 20260
_BATCH_SAMPLES = 8  # batch independence: the first samples of the batch, each also run alone


class UnrestorableStateError(RuntimeError):
    """``verify`` refuses a model holding state it could not put back exactly; nothing was run."""


@dataclasses.dataclass(frozen=True)
class Check:
    """One verified claim: ``ok`` is ``True``, ``False``, or ``None`` when it does not apply."""

    name: str
    ok: Optional[bool]
    detail: str

    def __str__(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "n/a "}[self.ok]
        return f"[{mark}] {self.name}: {self.detail}"


class VerifyReport:
    """What :meth:`Retrofit.verify` found; ``print(report)`` reads as a list of plain sentences."""

    def __init__(self, title: str, checks: List[Check]) -> None:
        self.title = title
        self.checks = checks

    @property
    def ok(self) -> bool:
        """No check failed."""
        return all(check.ok is not False for check in self.checks)

    @property
    def failures(self) -> List[Check]:
        return [check for check in self.checks if check.ok is False]

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)

    def __str__(self) -> str:
        verdict = "all checks passed" if self.ok else f"{len(self.failures)} check(s) FAILED"
        return "\n".join([f"{self.title}: {verdict}", *(f"  {check}" for check in self.checks)])

    def __repr__(self) -> str:
        return f"VerifyReport(ok={self.ok}, checks={len(self.checks)}, failures={[c.name for c in self.failures]})"


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


def _attempt(name: str, checks: List[Check], action: Callable[[], Optional[Check]]) -> None:
    """Run one check; an exception becomes a failed check naming it."""
    try:
        result = action()
    except Exception as error:  # noqa: BLE001  (any failure of the user's model is reported)
        result = Check(name, False, f"raised {type(error).__name__}: {error}")
    if result is not None:
        checks.append(result)


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
            removed = _trial_removal(handle, run, snapshot, checks)
            _check_training(handle, run, snapshot, removed, checks)
            _attempt(SAME, checks, lambda: checks.extend(Check(*c) for c in query_checks(handle, run, snapshot.restore,
                                                                                          batch)))
            _check_experts_trained(handle, run, snapshot, checks)
            _check_ensemble_step(handle, run, snapshot, checks, loss, targets)
            _check_routing(handle, run, snapshot, checks)
            _check_batch_independence(handle, run, snapshot, checks)
            _check_ensemble_inference(handle, run, snapshot, checks)
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


@dataclasses.dataclass
class _Unretrofitted:
    """What the model is without the retrofit (the real ``remove()``): its parameters ``(name, id,
    requires_grad)``, its ``state_dict`` keys and its training-mode logits (``None``: it could not be run)."""

    parameters: List[Any] = dataclasses.field(default_factory=list)
    keys: List[str] = dataclasses.field(default_factory=list)
    train: Optional[Tensor] = None


def _trial_removal(handle: Any, run: _Runner, snapshot: Snapshot, checks: List[Check]) -> _Unretrofitted:
    """Run the real ``remove()``, record the un-retrofitted model's outputs, then reinstall exactly."""
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
            removed.train = run(True).detach()
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
        ))

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
            checks.append(Check(name, None, "this family does not tie the prompts trained to an expert"))
            return
        used = sorted(set(trained.reshape(-1).tolist()))
        if used != [expert]:
            checks.append(Check(name, False, (
                f"after start_expert({expert}) the model trained the prompts of expert(s) {used}: the router would "
                f"learn expert {expert} for samples that trained another's prompts. The method's own step counter "
                "must follow the retrofit (no start_expert override that skips it; pass the task id your loop "
                "passes as handle.current_expert)"
            )))
            return
        seen.append(str(expert))
    checks.append(Check(name, True, f"after start_expert(e) the model trains expert e's prompts (e = {', '.join(seen)})"))


def _check_ensemble_step(handle: Any, run: _Runner, snapshot: Snapshot, checks: List[Check],
                         loss: Optional[Callable[[Tensor, Tensor], Tensor]], targets: Optional[Tensor]) -> None:
    name = "ensemble banks move after an optimizer step"
    ensemble = handle.ensemble
    if ensemble is None:
        checks.append(Check(name, None, "ensemble=False"))
        return

    def step() -> Check:
        handle.record.trained_banks = None
        logits = run(True)
        labels = targets if targets is not None else torch.arange(logits.shape[0], device=logits.device) % logits.shape[-1]
        (loss or F.cross_entropy)(logits.float(), labels.to(logits.device)).backward()
        trainable = [p for p in handle.model.parameters() if p.grad is not None]
        before_online = ensemble.online.weight.detach().clone()
        before = ensemble.ema_weight.detach().clone()
        torch.optim.SGD(trainable, lr=0.5).step()  # a throw-away optimizer: the user's is never stepped
        head_moved = not torch.equal(before_online, ensemble.online.weight)
        handle.update_ensemble()
        moved = sorted(set((before != ensemble.ema_weight).flatten(1).any(1).nonzero().flatten().tolist()))
        recorded = handle.record.trained_banks
        expected = sorted(set(recorded.reshape(-1).tolist())) if recorded is not None else [int(ensemble.active_expert)]
        snapshot.restore()
        if handle.optimizer is not None:
            hooked = handle._optimizer_hook_attached()
            how = (f"after each step of your {type(handle.optimizer).__name__} (its hook is attached)" if hooked else
                   f"but the hook on your {type(handle.optimizer).__name__} is gone")
        elif handle._following:
            hooked, how = True, "after each step of the first optimizer that trains the classifier (optimizer='auto')"
        else:
            hooked, how = True, "when you call handle.update_ensemble() after each optimizer.step() (no optimizer given)"
        if not head_moved:
            return Check(name, False, "the classifier the ensemble copies got no gradient: the loss does not reach it")
        ok = bool(moved) and moved == expected and hooked
        detail = (f"a step moved the EMA copies of bank(s) {moved}, those the forward trained, {how}" if ok else
                  f"a step moved bank(s) {moved} but the forward trained {expected}; {how}")
        return Check(name, ok, detail)

    _attempt(name, checks, step)


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


def _check_ensemble_inference(handle: Any, run: _Runner, snapshot: Snapshot, checks: List[Check]) -> None:
    name = "inference uses the ensemble"
    if handle.ensemble is None:
        checks.append(Check(name, None, "ensemble=False"))
        return

    def infer() -> Check:
        handle.record.ensembled = None
        run(False)
        banks = handle.record.ensembled
        snapshot.restore()
        if banks is None:
            return Check(name, False, "the ensembled head did not run at inference: the model's logits come from "
                                      "another classifier than the one the adapter wrapped")
        shown = sorted(set(banks.reshape(-1).tolist())) if isinstance(banks, Tensor) else [int(banks)]
        return Check(name, True, f"the inference output ensembles the online head with the EMA copies of bank(s) {shown}")

    _attempt(name, checks, infer)
