"""``verify``'s checks of the ensemble: a training step moves the EMA copies of exactly the banks the forward
trained, and at inference the copies reach the logits of the samples routed to each expert (changing them
changes each of those samples' logits; that the ensembled head merely ran proves nothing)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ._batch_independence import batch_size, tolerance
from ._head import bank_copies, frozen_classifier, perturb_banks
from ._restore import Snapshot
from ._verify_report import Check, attempt

_SEED = 20261  # the random copies that stand in for each expert's banks (a generator of its own)

__all__ = ["check_ensemble_inference", "check_ensemble_step"]


def check_ensemble_step(handle: Any, run: Any, snapshot: Snapshot, checks: List[Check],
                         loss: Optional[Callable[[Tensor, Tensor], Tensor]], targets: Optional[Tensor]) -> None:
    name = "ensemble banks move after an optimizer step"
    ensemble = handle.ensemble
    if ensemble is None:
        checks.append(Check(name, None, "ensemble=False"))
        return

    def step() -> Check:
        handle.record.trained_banks = None
        logits = run(True)
        if not logits.requires_grad:
            snapshot.restore()
            return Check(name, None, "no parameter the training output depends on requires grad (everything is "
                                     "frozen, as after the last task): no optimizer step to check")
        labels = targets if targets is not None else torch.arange(logits.shape[0], device=logits.device) % logits.shape[-1]
        (loss or F.cross_entropy)(logits.float(), labels.to(logits.device)).backward()
        trainable = [p for p in handle.model.parameters() if p.grad is not None]
        online = ensemble.online
        before_online = online.weight.detach().clone()
        before = bank_copies(ensemble)
        torch.optim.SGD(trainable, lr=0.5).step()  # a throw-away optimizer: the user's is never stepped
        head_moved = not torch.equal(before_online, online.weight)
        handle.update_ensemble()
        after = bank_copies(ensemble)
        moved = [b for b, (x, y) in enumerate(zip(before, after)) if x.shape != y.shape or not torch.equal(x, y)]
        recorded = handle.record.trained_banks
        expected = sorted(set(recorded.reshape(-1).tolist())) if recorded is not None else [int(ensemble.active_expert)]
        snapshot.restore()
        if not head_moved:
            return Check(name, False, _unmoved_head(online))
        expected = _banks_moved_together(ensemble, expected)
        hooked, how = _step_hook(handle)
        ok = bool(moved) and moved == expected and hooked
        detail = (f"a step moved the EMA copies of bank(s) {moved}, those the forward trained, {how}" if ok else
                  f"a step moved bank(s) {moved} but the forward trained {expected}; {how}")
        return Check(name, ok, detail)

    attempt(name, checks, step)


def _unmoved_head(online: Any) -> str:
    if not online.weight.requires_grad:
        return frozen_classifier(online)
    return "the classifier the ensemble copies got no gradient: the loss does not reach it"


def _banks_moved_together(ensemble: Any, banks: List[int]) -> List[int]:
    """A pool of per-expert classifiers moves every bank of an expert at once (one classifier per expert)."""
    owner = getattr(ensemble, "expert_of_bank", None)
    if owner is None:
        return banks
    experts = {owner[b] for b in banks}
    return [b for b, expert in enumerate(owner) if expert in experts and ensemble.member(b) is not None]


def _step_hook(handle: Any) -> Tuple[bool, str]:
    """Whether the EMA step follows the user's optimizer, and how."""
    if handle.optimizer is not None:
        hooked = handle._optimizer_hook_attached()
        return hooked, (f"after each step of your {type(handle.optimizer).__name__} (its hook is attached)" if hooked
                        else f"but the hook on your {type(handle.optimizer).__name__} is gone")
    if handle._following:
        return True, "after each step of the first optimizer that trains the classifier (optimizer='auto')"
    return True, "when you call handle.update_ensemble() after each optimizer.step() (no optimizer given)"


def check_ensemble_inference(handle: Any, run: Any, snapshot: Snapshot, checks: List[Check]) -> None:
    """The ensemble's copies reach the logits of the samples routed to each expert: perturbing the copies of
    that expert's banks must change every one of those samples' inference logits."""
    name = "inference uses the ensemble"
    if handle.ensemble is None:
        checks.append(Check(name, None, "ensemble=False"))
        return

    def infer() -> Check:
        missed, reached = [], []
        grow = _PoolGrowth(handle)
        for forced, rows, banks, label in _ensemble_probes(handle, run):
            base, used = _forced_run(handle, run, snapshot, forced, grow)
            if not banks:  # no router, or no bank per expert: the banks this forward used for those rows
                banks = _used_banks(used, rows)

            perturbed = _Perturbed(handle, grow, banks)
            changed = _rows_changed(base, _forced_run(handle, run, snapshot, forced, perturbed)[0])
            (reached if banks and bool(changed[rows].all()) else missed).append(label)
        if missed:
            rule = handle.ensemble.aggregate
            why = (" (aggregate='logit_min_entropy' answers the online head whenever a logit is negative)"
                   if rule == "logit_min_entropy" else
                   ": the model's logits come from another classifier than the one the adapter wrapped, or from "
                   "another expert's")
            return Check(name, False, f"changing the EMA copies of {', '.join(missed)} leaves the inference logits "
                                      f"of its samples unchanged{why}")
        return Check(name, True, f"the EMA copies reach the inference logits of the samples of {', '.join(reached)} "
                                 "(changing them changes each of those samples' logits)")

    attempt(name, checks, infer)


class _PoolGrowth:
    """A pool of per-expert classifiers gets every expert's classifier first (the method's own start of each
    later expert, undone with the rest), so that each expert's samples can be looked at; else nothing."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.later = range(handle.current_expert + 1, int(handle.num_experts or 0)) \
            if getattr(handle.ensemble, "per_expert", False) else range(0)

    def __call__(self) -> None:
        current = self.handle.current_expert
        for expert in self.later:
            self.handle.start_expert(expert)
        self.handle.current_expert = current


class _Perturbed:
    """Before a run: the pool grown, then the copies of ``banks`` replaced by large random weights."""

    def __init__(self, handle: Any, grow: _PoolGrowth, banks: List[int]) -> None:
        self.handle, self.grow, self.banks = handle, grow, banks

    def __call__(self) -> None:
        self.grow()
        perturb_banks(self.handle.ensemble, self.banks, torch.Generator().manual_seed(_SEED))


def _forced_run(handle: Any, run: Any, snapshot: Snapshot, forced: Any,
                before: Optional[Callable[[], None]] = None) -> Tuple[Tensor, Any]:
    """Inference logits with ``forced`` experts (after ``before()``), and the banks the ensembled head answered
    for (``None``: not recorded; an int: one bank for all)."""
    handle.record.ensembled = None
    try:
        if before is not None:
            before()
        with handle.record.forcing(forced):
            logits = run(False).detach()
        used = handle.record.ensembled
        return logits, used.reshape(-1).cpu() if isinstance(used, Tensor) else used
    finally:
        snapshot.restore()


def _ensemble_probes(handle: Any, run: Any) -> List[Tuple[Any, Tensor, List[int], str]]:
    """``(forced experts, rows routed to one expert, that expert's banks, its name)`` for each expert: the
    batch routed to experts ``0, 1, ..., E-1, 0, ...`` (each expert alone when the batch is smaller). Without
    a router, the whole batch and the banks the model's own selection used (an empty list: read from the run)."""
    total = batch_size(run.batch) or 1
    if handle.router is None:
        return [(None, torch.ones(total, dtype=torch.bool), [], "the banks the model selected")]
    experts = int(handle.num_experts or handle.router.num_experts)
    probes = []
    for expert in range(experts):
        banks = [int(b) for b in handle._banks_of_expert(expert)]
        if total >= experts:
            forced = torch.arange(total) % experts
            probes.append((forced, forced == expert, banks, f"expert {expert}"))
        else:
            probes.append((expert, torch.ones(total, dtype=torch.bool), banks, f"expert {expert}"))
    return probes


def _used_banks(used: Any, rows: Tensor) -> List[int]:
    """The banks an inference forward answered for ``rows``: one per sample (a tensor), one for all (an int), or
    those of every per-expert classifier that answered (a list: a model that runs them all)."""
    if isinstance(used, list):
        return used
    return sorted(set(used[rows].tolist())) if isinstance(used, Tensor) else [] if used is None else [used]


def _rows_changed(base: Tensor, other: Tensor) -> Tensor:
    """``(B,)``: whether each sample's logits differ by more than rounding (or in which entries are finite)."""
    tol = tolerance(base)
    base, other = base.reshape(base.shape[0], -1).double(), other.reshape(other.shape[0], -1).double()
    finite = torch.isfinite(base) & torch.isfinite(other)
    pattern = (torch.isfinite(base) != torch.isfinite(other)).any(1)
    gap = torch.where(finite, (base - other).abs(), torch.zeros_like(base)).amax(1)
    return pattern | (gap > tol)
