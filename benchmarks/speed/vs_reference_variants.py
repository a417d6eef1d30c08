"""The three variants ``benchmarks/speed/vs_reference.py`` times: the official model's baseline, the official
model with its router and EMA heads, and ours (the baseline retrofitted), each with the official trainer,
its calls timed where they are the router's and the ensemble's share; and the random batches they share.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from fly_modules.adapters import Retrofit, retrofit
from torch import Tensor, nn

from benchmarks.core import reference_checkout as ref
from benchmarks.core.reference_checkout import EvalBatches
from fly_modules import SampleBudgetSchedule
from fly_modules._blocked import default_fold_rows

# --clock: wall time, or this process's CPU time (with one thread on a CPU shared with other jobs, the
# time the scheduler gives to others is not counted).
CLOCKS: Dict[str, Callable[[], float]] = {"wall": time.perf_counter, "process": time.process_time}


# ================================================================================== variants
@dataclass
class Variant:
    """One model with its official trainer; ``handle`` is set for ours, ``collect`` for the official.

    ``solve_seconds`` and ``part_seconds`` collect the durations of the router solves and of the calls
    that are the router's and the ensemble's share of a stream batch (see ``build_variants``).
    """

    name: str
    model: nn.Module
    trainer: Any
    handle: Optional[Retrofit] = None
    collect: bool = False
    solve_seconds: List[float] = field(default_factory=list)
    part_seconds: List[float] = field(default_factory=list)
    hook_seconds: List[float] = field(default_factory=list)  # ours: the retrofit's forward (pre-)hooks
    fold_seconds: List[float] = field(default_factory=list)  # ours: the router's folds (end_batch, end of block)
    finish: Optional[Callable[[], None]] = None  # ours: folds the router's pending rows at the end of a block


def stream_batch(variant: Variant, images: Tensor, labels: Tensor, online_iter: int) -> None:
    """One stream batch as the official ``online_step`` runs it (less its ``gc.collect()``)."""
    trainer = variant.trainer
    for _ in range(online_iter):
        trainer.online_train([images.clone(), labels.clone()])
    if variant.collect:
        trainer._collect_rp_features(images.clone(), labels.clone())
    if variant.handle is not None:
        variant.handle.end_batch(images.shape[0])  # router statistics + our expert schedule
    else:
        trainer._maybe_advance_internal_step(images.shape[0])


def stream_block(variant: Variant, batches: Sequence[Tuple[Tensor, Tensor]], online_iter: int) -> None:
    """Consecutive stream batches, then (ours) the router's pending rows folded into ``G``: when the clock
    stops, every row the block added is in the statistics, so its blocked update is counted in full."""
    for images, labels in batches:
        stream_batch(variant, images, labels, online_iter)
    if variant.finish is not None:
        variant.finish()


def block_batches(handle: Retrofit, train_batch: int) -> int:
    """Stream batches per timed block: enough rows for one fold of the router's buffer, so that each
    block holds the amortised update of its rows (fewer would leave the fold to some rounds only)."""
    router = handle.router
    rows = router.fold_rows or default_fold_rows(router.expansion_dim, router.device)
    return max(1, math.ceil(rows / train_batch))


def evaluate(variant: Variant, test_set: EvalBatches) -> None:
    if variant.handle is not None:
        variant.handle.set_logit_mask(variant.trainer.mask)
    variant.trainer.online_evaluate(test_set)


def time_each_call(function: Callable[..., Any], sink: List[float], sync: Callable[[], None],
                   clock: Callable[[], float]) -> Callable[..., Any]:
    """``function`` wrapped so that each call appends its duration (device work included) to ``sink``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        sync()
        start = clock()
        result = function(*args, **kwargs)
        sync()
        sink.append(clock() - start)
        return result

    return call


def record_seconds(target: Any, name: str, sink: List[float], sync: Callable[[], None],
                   clock: Callable[[], float]) -> None:
    """Wrap ``target.name`` (instance attribute) so that each call appends its duration to ``sink``."""
    setattr(target, name, time_each_call(getattr(target, name), sink, sync, clock))


def build_variants(checkout: ref.Checkout, method: str, args: argparse.Namespace) -> Dict[str, Variant]:
    baseline, official = ref.build_models(
        checkout, method, args.vit, num_classes=args.num_classes, num_experts=args.num_experts,
        expansion_dim=args.expansion_dim, ridge=args.ridge, seed=args.seed, device=args.device,
    )
    ours = copy.deepcopy(baseline)
    budget = args.warmup_batches * args.train_batch  # samples per expert (step) during the warm-up

    def trainer(model: nn.Module) -> Any:
        return ref.make_trainer(
            checkout, method, model, device=args.device, amp=args.amp, lr=args.lr, num_classes=args.num_classes,
            num_experts=args.num_experts, samples_per_step=budget,
        )

    variants = {
        "baseline": Variant("baseline", baseline, trainer(baseline)),
        "official": Variant("official", official, trainer(official), collect=True),
        "ours": Variant("ours", ours, trainer(ours)),
    }
    options = dict(router_features=args.mvp_router_features) if method == "mvp" else {}
    handle = retrofit(
        ours, method=method, router=True, ensemble=True, optimizer=variants["ours"].trainer.optimizer,
        schedule=SampleBudgetSchedule(budget, args.num_experts), expansion_dim=args.expansion_dim,
        ridge=args.ridge, **options,
    )
    use_expansion(handle, official.rp_head.W_rand)
    variants["ours"].handle = handle
    timing = dict(sync=synchronizer(args.device), clock=CLOCKS[args.clock])
    record_seconds(official.rp_head, "update", variants["official"].solve_seconds, **timing)
    record_seconds(handle.router, "solve", variants["ours"].solve_seconds, **timing)
    # The router's and the ensemble's own calls per stream batch; hook costs inside the model's
    # forward (ours) are not among them, the end-to-end difference includes everything.
    record_seconds(variants["official"].trainer, "_collect_rp_features", variants["official"].part_seconds, **timing)
    record_seconds(official, "update_ema_fc", variants["official"].part_seconds, **timing)
    record_seconds(handle, "end_batch", variants["ours"].part_seconds, **timing)
    record_seconds(handle, "update_ensemble", variants["ours"].part_seconds, **timing)
    record_seconds(handle.router, "flush", variants["ours"].fold_seconds, **timing)
    variants["ours"].finish = handle.router.flush  # the timed flush: its folds count among the folds too
    record_seconds(variants["ours"], "finish", variants["ours"].part_seconds, **timing)
    time_forward_hooks(handle, variants["ours"].hook_seconds, **timing)
    return variants


def time_forward_hooks(handle: Retrofit, sink: List[float], sync: Callable[[], None],
                       clock: Callable[[], float]) -> None:
    """Wrap every forward (pre-)hook the retrofit installed so that each call appends its duration to
    ``sink``. (The optimizer step hook runs ``update_ensemble``, which is timed by itself.)"""
    for hook_handle, what in handle.install._hooks:
        hooks = hook_handle.hooks_dict_ref()
        if not what.startswith("forward") or hooks is None or hook_handle.id not in hooks:
            continue
        hooks[hook_handle.id] = time_each_call(hooks[hook_handle.id], sink, sync, clock)


def use_expansion(handle: Retrofit, official_matrix: Tensor) -> None:
    """Give our router the official random matrix (``W_rand`` is ``R^T``), through its state_dict, so
    that statistics and routing scores can be compared; it changes no cost."""
    state = handle.router.state_dict()
    state["expansion.weight"] = official_matrix.t()
    handle.router.load_state_dict(state)


def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


# ===================================================================================== data
def make_batch(generator: torch.Generator, size: int, args: argparse.Namespace) -> Tuple[Tensor, Tensor]:
    side = ref.VIT_PRESETS[args.vit]["img_size"]
    images = torch.randn(size, 3, side, side, generator=generator)
    labels = torch.randint(0, args.num_classes, (size,), generator=generator)
    return images.to(args.device), labels.to(args.device)
