#!/usr/bin/env python
"""End-to-end speed of fly-modules against the official FlyPrompt code, on the same model.

From a checkout of AnAppleCore/FlyGCL (``--reference-repo``; read-only, nothing copied), the official
DualPrompt and MVP models are built in a chosen ViT shape with random weights, and three variants of
each are timed side by side, in alternating rounds, on the same batches, all driven by the official
trainer's own per-batch methods:

* ``baseline``: the model with its REAR/TE2 flags off;
* ``official``: the same model with ``--use_rp_gate --use_ema_head``: per stream batch, the trainer's
  online iterations (each followed by its EMA update) and ``_collect_rp_features`` (a prompt-free pass
  over the clean batch, then ``rp_head.collect``); every evaluation starts with ``rp_head.update()``
  (an LU solve of the M x M system) and ensembles per sample (``forward_with_ema``);
* ``ours``: the baseline model retrofitted by ``fly_modules.adapters.retrofit`` (router and ensemble
  on), the same trainer, plus ``handle.end_batch`` per stream batch.

Training is timed in blocks of consecutive stream batches (``--block-batches``; by default one fold of our
router's row buffer), ours' block ending with its rows folded into ``G``, so the blocked statistics
update is counted in full. Printed: the training step (per stream batch), ours' overhead in parts, the
router's folds as float64 arithmetic beside a square GEMM's rate, and the evaluation (``--eval-batches``
batches, after new statistics, and again with unchanged statistics) of each variant, overheads over the
baseline, the official / ours ratios, where the evaluation time goes (solve vs the batches), and whether
the two implementations agree where they are comparable. ``--profile`` adds operator profiles;
``--train-only`` times the training step alone.

Run from the repository root::

    python -m benchmarks.speed.vs_reference --reference-repo PATH --threads 1          # CPU, tiny ViT
    python -m benchmarks.speed.vs_reference --reference-repo PATH --device cuda --vit base
    python -m benchmarks.speed.vs_reference --reference-repo tests/fixtures/fake_flygcl --quick
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from fly_modules.adapters import Retrofit, retrofit
from torch import Tensor, nn

from benchmarks.core import reference_checkout as ref
from benchmarks.core.reference_checkout import EvalBatches
from benchmarks.flags import Parser, add_common_flag, add_flag, add_shared_flag
from benchmarks.speed.timing import Report, configure_threads, format_seconds, median, print_header
from fly_modules import SampleBudgetSchedule
from fly_modules._blocked import default_fold_rows
from fly_modules._ridge import PANEL_ROWS, panels
from fly_modules._validation import Integer, Real

# % of the baseline's training step, router + ensemble together: ViT-B/16 on a GPU, the tiny ViT on a CPU
# (whose step is so cheap that the router's float64 update weighs more; see fold_arithmetic).
TARGET_TRAIN_OVERHEAD = {"cuda": 5.0, "cpu": 15.0}
TARGET_EVAL_SPEEDUP = 3.0     # our evaluation throughput / the official code's
VARIANTS = ("baseline", "official", "ours")
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


# =================================================================================== timing
@dataclass
class Timings:
    train: Dict[str, List[float]] = field(default_factory=lambda: {name: [] for name in VARIANTS})
    train_parts: Dict[str, List[float]] = field(default_factory=lambda: {name: [] for name in VARIANTS})
    train_hooks: Dict[str, List[float]] = field(default_factory=lambda: {name: [] for name in VARIANTS})
    train_folds: Dict[str, List[float]] = field(default_factory=lambda: {name: [] for name in VARIANTS})
    eval_fresh: Dict[str, List[float]] = field(default_factory=lambda: {name: [] for name in VARIANTS})
    eval_repeat: Dict[str, List[float]] = field(default_factory=lambda: {name: [] for name in VARIANTS})
    solve_fresh: Dict[str, List[float]] = field(default_factory=lambda: {name: [] for name in VARIANTS})
    solve_repeat: Dict[str, List[float]] = field(default_factory=lambda: {name: [] for name in VARIANTS})


def run_rounds(variants: Dict[str, Variant], test_set: EvalBatches, args: argparse.Namespace) -> Timings:
    """Warm-up stream (every expert gets statistics), then alternating rounds of: one block of
    ``args.block_batches`` stream batches per variant, one evaluation per variant (new statistics), one
    more (unchanged statistics). Training times are per stream batch (the block's time / its batches)."""
    generator = torch.Generator().manual_seed(args.seed + 1)
    sync, clock = synchronizer(args.device), CLOCKS[args.clock]
    for _ in range(args.warmup_batches * args.num_experts):
        images, labels = make_batch(generator, args.train_batch, args)
        for variant in variants.values():
            stream_batch(variant, images, labels, args.online_iter)
    for variant in variants.values():  # every block then starts with an empty buffer
        if variant.finish is not None:
            variant.finish()
    timings = Timings()

    def timed(call: Callable[[], None]) -> float:
        sync()
        start = clock()
        call()
        sync()
        return clock() - start

    for round_index in range(args.warmup_rounds + args.rounds):
        measured = round_index >= args.warmup_rounds
        shift = round_index % len(VARIANTS)
        order = [variants[name] for name in VARIANTS[shift:] + VARIANTS[:shift]]
        batches = [make_batch(generator, args.train_batch, args) for _ in range(args.block_batches)]
        for variant in order:
            parts, hooks, folds = len(variant.part_seconds), len(variant.hook_seconds), len(variant.fold_seconds)
            seconds = timed(functools.partial(stream_block, variant, batches, args.online_iter))
            if measured:
                per_batch = 1.0 / args.block_batches
                timings.train[variant.name].append(seconds * per_batch)
                timings.train_parts[variant.name].append(sum(variant.part_seconds[parts:]) * per_batch)
                timings.train_hooks[variant.name].append(sum(variant.hook_seconds[hooks:]) * per_batch)
                timings.train_folds[variant.name].append(sum(variant.fold_seconds[folds:]) * per_batch)
        if args.train_only:
            continue
        for phase, total, solve in (("fresh", timings.eval_fresh, timings.solve_fresh),
                                    ("repeat", timings.eval_repeat, timings.solve_repeat)):
            for variant in order:
                if phase == "repeat" and variant.name == "baseline":
                    continue  # nothing to re-solve: its second evaluation is its first
                solves = len(variant.solve_seconds)
                seconds = timed(functools.partial(evaluate, variant, test_set))
                if measured:
                    total[variant.name].append(seconds)
                    solve[variant.name].append(sum(variant.solve_seconds[solves:]))
    timings.eval_repeat["baseline"] = list(timings.eval_fresh["baseline"])
    timings.solve_repeat["baseline"] = [0.0] * len(timings.eval_fresh["baseline"])
    return timings


def report_timings(method: str, timings: Timings, test_set: EvalBatches, args: argparse.Namespace,
                   report: Report) -> Dict[str, Any]:
    """Print the figures; overheads and speed-ups are medians of per-round ratios (``paired_ratio``)."""
    train = {name: median(values) for name, values in timings.train.items()}
    overhead = {name: 100.0 * (paired_ratio(timings.train, name, "baseline") - 1.0) for name in ("official", "ours")}
    print(f"training step = one stream batch of {args.train_batch}: {args.online_iter} online iteration(s) "
          f"(forward, loss, backward, optimizer step, EMA update) + router statistics; timed in blocks of "
          f"{args.block_batches} batches (ours folds its buffered rows within each block), {args.rounds} rounds")
    print(f"  baseline  {format_seconds(train['baseline']):>12} (median)")
    for name in ("official", "ours"):
        print(f"  {name:<9} {format_seconds(train[name]):>12}   overhead {overhead[name]:+.1f}% (median of per-round "
              f"ratios; ratio of the medians: {percent(train[name], train['baseline'])})")
    parts = {name: median(values) for name, values in timings.train_parts.items()}
    print(f"  official / ours: {paired_ratio(timings.train, 'official', 'ours'):.2f}x")
    print(f"  time inside the router's and the ensemble's own calls, per stream batch: official "
          f"{format_seconds(parts['official'])} = {100 * parts['official'] / train['baseline']:.1f}% of the baseline "
          f"(_collect_rp_features, update_ema_fc), ours {format_seconds(parts['ours'])} = "
          f"{100 * parts['ours'] / train['baseline']:.1f}% (end_batch, update_ensemble)")

    breakdown = overhead_breakdown(timings, args)
    arithmetic = fold_arithmetic(timings, args)
    target = TARGET_TRAIN_OVERHEAD[args.device.type]
    report.check(f"vs_reference.{method}.train_overhead", overhead["ours"], "<=", target, unit="%",
                 fmt=".1f", detail=f"ours over the baseline (official: {overhead['official']:+.1f}%)")
    result = {
        "train_seconds": train, "train_seconds_all": timings.train, "train_part_seconds": parts,
        "block_batches": args.block_batches,
        "train_overhead_breakdown": breakdown, "fold_arithmetic": arithmetic,
        "train_overhead_percent": overhead, "train_official_over_ours": paired_ratio(timings.train, "official", "ours"),
    }
    if args.train_only:
        print("evaluation: not timed (--train-only)")
        return result
    samples = test_set.samples
    print(f"evaluation = {len(test_set)} batch(es) of {args.eval_batch} ({samples} samples) through the official "
          f"trainer's online_evaluate; medians of {args.rounds} rounds")
    figures: Dict[str, float] = {}
    speedup: Dict[str, float] = {}
    for phase, key, totals, solves in (("after new statistics", "fresh", timings.eval_fresh, timings.solve_fresh),
                                       ("unchanged statistics", "repeat", timings.eval_repeat, timings.solve_repeat)):
        print(f"  {phase}:")
        for name in VARIANTS:
            total, solve = median(totals[name]), median(solves[name])
            loop = max(total - solve, 1e-12)
            print(f"    {name:<9} {samples / total:>10.1f} samples/s  ({format_seconds(total)}: solve "
                  f"{format_seconds(solve)}, batches {samples / loop:.1f} samples/s)")
            figures[f"{key}:{name}"], figures[f"{key}:{name}:batches"] = total, loop
        speedup[key] = paired_ratio(totals, "official", "ours")
        print(f"    ours / official: {speedup[key]:.2f}x (median of per-round ratios; batches alone: "
              f"{figures[f'{key}:official:batches'] / figures[f'{key}:ours:batches']:.2f}x)")
    report.check(f"vs_reference.{method}.eval_speedup", speedup["fresh"], ">=", TARGET_EVAL_SPEEDUP, unit="x",
                 detail=f"evaluation throughput ours / official after new statistics, batch {args.eval_batch}; "
                        f"unchanged statistics: {speedup['repeat']:.2f}x")
    return {
        **result, "eval_samples": samples, "eval_seconds": figures,
        "eval_seconds_all": {"fresh": timings.eval_fresh, "repeat": timings.eval_repeat},
        "solve_seconds_all": {"fresh": timings.solve_fresh, "repeat": timings.solve_repeat},
        "eval_speedup_fresh": speedup["fresh"], "eval_speedup_repeat": speedup["repeat"],
    }


def overhead_breakdown(timings: Timings, args: argparse.Namespace) -> Dict[str, float]:
    """Our training-step overhead over the baseline, in parts (percent of the baseline's step, medians of
    per-round values): the router's and ensemble's own calls (``end_batch``, of which the router's folds,
    and ``update_ensemble``), the retrofit's forward hooks, and the rest, which no call of ours contains
    (the retrofit's swapped modules inside the forward, extra allocations, cache effects)."""
    rounds = range(len(timings.train["ours"]))
    base = timings.train["baseline"]
    parts = {
        "total": [timings.train["ours"][i] - base[i] for i in rounds],
        "calls": [timings.train_parts["ours"][i] for i in rounds],
        "folds": [timings.train_folds["ours"][i] for i in rounds],
        "hooks": [timings.train_hooks["ours"][i] for i in rounds],
    }
    parts["rest"] = [parts["total"][i] - parts["calls"][i] - parts["hooks"][i] for i in rounds]
    result = {name: 100.0 * median([v / b for v, b in zip(values, base)]) for name, values in parts.items()}
    print(f"  ours' overhead in parts, % of the baseline step (medians of per-round values): total {result['total']:+.1f}"
          f" = our calls {result['calls']:.1f} (router folds {result['folds']:.1f} of it, amortised) + forward hooks "
          f"{result['hooks']:.1f} + outside both {result['rest']:+.1f} (swapped modules in the forward, allocations, "
          f"caches{', synchronisations' if args.device.type == 'cuda' else ''})")
    return result


def fold_flops(rows: int, width: int) -> float:
    """Flops of adding ``rows`` expanded rows to ``G``'s lower triangle in panels, as the router does
    (``accumulate_lower_gram``): ``2 rows sum_i panel_i end_i``, about ``rows (M^2 + 512 M)``."""
    return sum(2.0 * rows * (stop - start) * stop for start, stop in panels(width, PANEL_ROWS))


def gemm_rates(device: torch.device, clock: Callable[[], float], size: int = 2048, repeats: int = 3) -> Dict[str, float]:
    """GFLOP/s of a square ``size`` GEMM in float64 and float32 on ``device`` (best of ``repeats``: load only
    ever slows a round): the machine's arithmetic rate, which the router's fold is compared with."""
    sync, rates = synchronizer(device), {}
    for dtype in (torch.float64, torch.float32):
        a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
        out = torch.zeros(size, size, dtype=dtype, device=device)
        best = float("inf")
        for _ in range(repeats + 1):  # the first call warms the library up
            sync()
            start = clock()
            out.addmm_(a, b)
            sync()
            best = min(best, clock() - start)
        rates[str(dtype).replace("torch.", "")] = 2.0 * size**3 / max(best, 1e-12) / 1e9
    return rates


def fold_arithmetic(timings: Timings, args: argparse.Namespace) -> Dict[str, float]:
    """The router's folds as arithmetic: float64 flops per stream batch, the rate they ran at, and that
    rate against a square float64 GEMM on this machine: a fold at the GEMM rate is the update's
    arithmetic itself, the floor of ours' overhead at this M (only fewer or faster flops lower it)."""
    rounds = range(len(timings.train["ours"]))
    base = timings.train["baseline"]
    seconds = median(timings.train_folds["ours"])
    flops = fold_flops(args.train_batch, args.expansion_dim)
    result = {
        "gflop_per_batch": flops / 1e9,
        "gflops": flops / max(seconds, 1e-12) / 1e9 if seconds > 0 else 0.0,
        "percent_of_baseline": 100.0 * median([timings.train_folds["ours"][i] / base[i] for i in rounds]),
        "gemm_gflops_float64": args.gemm_rates["float64"],
        "gemm_gflops_float32": args.gemm_rates["float32"],
    }
    if seconds > 0:
        print(f"  router folds as arithmetic: {result['gflop_per_batch']:.2f} GFLOP float64 per stream batch "
              f"(G's lower triangle, {args.train_batch} rows at M = {args.expansion_dim}) at {result['gflops']:.1f} "
              f"GFLOP/s = {result['percent_of_baseline']:.1f}% of the baseline step; a square float64 GEMM runs at "
              f"{result['gemm_gflops_float64']:.1f} GFLOP/s here (float32 {result['gemm_gflops_float32']:.1f}), so "
              f"the fold is {100 * result['gflops'] / result['gemm_gflops_float64']:.0f}% of this machine's float64 rate")
    return result


def paired_ratio(times: Dict[str, List[float]], numerator: str, denominator: str) -> float:
    """Median over rounds of ``numerator``'s time / ``denominator``'s in the same round: the variants of
    a round run back to back, so the ratio is less exposed to load that drifts during the run."""
    return median([a / b for a, b in zip(times[numerator], times[denominator])])


def percent(value: float, base: float) -> str:
    return f"{100.0 * (value / base - 1.0):+.1f}%"


# ================================================================================ agreement
def compare_training(method: str, variants: Dict[str, Variant], args: argparse.Namespace) -> Dict[str, float]:
    """Official and ours trained the same weights on the same batches: do they end in the same state?"""
    official, ours, handle = variants["official"].model, variants["ours"].model, variants["ours"].handle
    ours_state = ours.state_dict()
    weights = max_abs_difference(
        (tensor, ours_state[name]) for name, tensor in official.named_parameters()
        if tensor.requires_grad and name in ours_state
    )
    ema_weight, ema_bias = ref.ema_bank_weights(official)
    ema = max(max_abs(ema_weight - handle.ensemble.ema_weight), max_abs(ema_bias - handle.ensemble.ema_bias))
    print("training equivalence (same initial weights, same batches, trained side by side):")
    print(f"  trainable weights (prompts, keys, online head): max |official - ours| = {weights:.2e}")
    print(f"  EMA heads (every bank, both decays):            max |official - ours| = {ema:.2e}")
    result = {"weights": weights, "ema": ema}
    if method == "mvp" and args.mvp_router_features == "query":
        print("  router statistics: not comparable (official statistics come from the final-norm class token, "
              "ours from MVP's query with --mvp-router-features query)")
        return result
    gram_official = official.rp_head.G.double()
    gram_ours = handle.router.gram_matrix().to(gram_official.device)
    cross_official = official.rp_head.Q.double()
    cross_ours = handle.router.cross.to(cross_official.device)
    result["gram"] = max_abs(gram_official - gram_ours) / max(max_abs(gram_official), 1e-30)
    result["cross"] = max_abs(cross_official - cross_ours) / max(max_abs(cross_official), 1e-30)
    print(f"  router statistics (same random matrix): max |dG| / max |G| = {result['gram']:.2e}, "
          f"max |dQ| / max |Q| = {result['cross']:.2e} (official accumulates float32, ours float64)")
    return result


@torch.no_grad()
def compare_inference(method: str, variants: Dict[str, Variant], test_set: EvalBatches,
                      args: argparse.Namespace) -> Dict[str, float]:
    """Routing and predictions with identical state: a fresh retrofit of the trained model given the
    official router statistics and EMA heads, against the official model, batch by batch."""
    official, trainer = variants["official"].model, variants["official"].trainer
    twin = copy.deepcopy(variants["baseline"].model)
    twin.load_state_dict({k: v for k, v in official.state_dict().items()
                          if not k.startswith(("rp_head.", "experts_fc."))})
    # Route on the features the official code routes on: MVP's query for MVP (its statistics come from
    # the final-norm class token, a mismatch we reproduce here by loading them as they are).
    options = dict(router_features="query") if method == "mvp" else {}
    handle = retrofit(twin, method=method, router=True, ensemble=True, expansion_dim=args.expansion_dim,
                      ridge=args.ridge, **options)
    state = handle.router.state_dict()
    state.update({"expansion.weight": official.rp_head.W_rand.t(), "gram": official.rp_head.G,
                  "cross": official.rp_head.Q, "counts": variants["ours"].handle.router.counts})
    handle.router.load_state_dict(state)
    ema_weight, ema_bias = ref.ema_bank_weights(official)
    handle.ensemble.ema_weight.copy_(ema_weight)
    handle.ensemble.ema_bias.copy_(ema_bias)
    handle.set_logit_mask(trainer.mask)
    official.rp_head.update()
    official.eval()
    twin.eval()
    seen_steps = min(official.task_count + 1, official.task_num)
    routed, slots, predictions, samples = 0, 0, 0, 0
    score_error, probability_error = 0.0, 0.0
    for images, _ in test_set:
        query = ref.mvp_query(official, images) if method == "mvp" else ref.clean_query(official, images)
        official_scores = official.rp_head(query)[:, :seen_steps].double()
        ours_scores = handle.router(query)[:, :seen_steps].to(official_scores)
        score_error = max(score_error, max_abs(official_scores - ours_scores) / max(max_abs(official_scores), 1e-30))
        routed += int((official_scores.argmax(1) == handle.router.route(query).to(images.device)).sum())
        members = [logits + trainer.mask for logits in official.forward_with_ema(images)]
        official_probabilities = trainer._ensemble_logits(members)
        official_slots = official.last_expert_ids
        ours_probabilities = twin(images).exp()
        if method == "dualprompt":
            slots += int((official_slots == twin.e_prompt.last_selected_indices[:, 0]).sum())
        probability_error = max(probability_error, max_abs(official_probabilities - ours_probabilities))
        predictions += int((official_probabilities.argmax(1) == ours_probabilities.argmax(1)).sum())
        samples += images.shape[0]
    handle.remove()
    result = {"routed": routed / samples, "predictions": predictions / samples, "scores": score_error,
              "probabilities": probability_error}
    print(f"inference with identical state ({samples} test samples; a fresh retrofit of the trained model given "
          f"the official router statistics, random matrix and EMA heads; routing on "
          f"{'MVP query' if method == 'mvp' else 'final-norm class token'} features):")
    print(f"  router scores: max |official - ours| / max |official| = {score_error:.2e} "
          f"(official: float32 statistics, float32 LU; ours: float64, Cholesky refined to float64)")
    print(f"  routed step agrees on {100 * result['routed']:.2f}% of the samples")
    if method == "dualprompt":
        result["slots"] = slots / samples
        print(f"  selected E-prompt slot agrees on {100 * result['slots']:.2f}%")
    print(f"  prediction agrees on {100 * result['predictions']:.2f}%; max |p_official - p_ours| = "
          f"{probability_error:.2e} (softmax-max ensemble of the online head and the two EMA heads)")
    return result


def max_abs(tensor: Tensor) -> float:
    return float(tensor.detach().double().abs().max()) if tensor.numel() else 0.0


def max_abs_difference(pairs: Iterator[Tuple[Tensor, Tensor]]) -> float:
    return max((max_abs(a.detach() - b.detach().to(a)) for a, b in pairs), default=0.0)


# ================================================================================== profile
def profile(variants: Dict[str, Variant], test_set: EvalBatches, args: argparse.Namespace) -> None:
    """Operator profile (torch.profiler) of one stream batch and one evaluation of official and ours."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.type == "cuda" else [])
    sort_by = "self_cuda_time_total" if args.device.type == "cuda" else "self_cpu_time_total"
    images, labels = make_batch(torch.Generator().manual_seed(args.seed + 2), args.train_batch, args)
    for name in ("official", "ours"):
        variant = variants[name]
        for what, call in (("stream batch", functools.partial(stream_batch, variant, images, labels, args.online_iter)),
                           ("evaluation", functools.partial(evaluate, variant, test_set))):
            with torch_profile(activities=activities) as prof:
                call()
            print(f"\nprofile: {name}, {what} (top operators by self time)")
            print(prof.key_averages().table(sort_by=sort_by, row_limit=args.profile_rows))


# ===================================================================================== main
def reference_commit(path: str) -> str:
    try:
        found = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not available)"
    return found.stdout.strip() if found.returncode == 0 else "unknown (not a git checkout)"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--reference-repo", required=True, help="a checkout of AnAppleCore/FlyGCL (read only)")
    parser.add_argument("--methods", nargs="+", choices=ref.METHODS, default=list(ref.METHODS))
    parser.add_argument("--vit", choices=sorted(ref.VIT_PRESETS), default="tiny",
                        help="ViT shape (random weights): " + "; ".join(
                            f"{k}: {', '.join(f'{a}={b}' for a, b in v.items())}" for k, v in ref.VIT_PRESETS.items()))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--amp", action="store_true", help="fp16 autocast as the official --use_amp (CUDA only)")
    add_shared_flag(parser, "expansion_dim", narrower=[Integer(minimum=1)], help="router expansion M (official --rp_dim)")
    add_shared_flag(parser, "ridge", narrower=[Real(above=0)], help="router ridge > 0 (official --rp_ridge)")
    add_flag(parser, "--num-classes", Integer(minimum=1), default=100, help="classes of the stream")
    add_flag(parser, "--num-experts", Integer(minimum=2), default=5,
             help="steps (official --step_num / --n_tasks; its step counter needs two)")
    add_flag(parser, "--train-batch", Integer(minimum=1), default=None, help="stream batch (default 64; 8 for --vit base on the CPU)")
    add_flag(parser, "--eval-batch", Integer(minimum=1), default=None,
             help="evaluation batch (default 128; 16 for --vit base on the CPU)")
    add_flag(parser, "--eval-batches", Integer(minimum=1), default=None,
             help="batches per evaluation (default 40 on CUDA, 10 on the CPU, 1 for --vit base on the CPU)")
    add_flag(parser, "--online-iter", Integer(minimum=1), default=3, help="optimizer steps per stream batch")
    add_flag(parser, "--block-batches", Integer(minimum=1), default=None,
             help="stream batches per variant per round, timed together (default: enough rows for one "
                  "fold of our router's buffer, e.g. 8 batches of 64 at M = 10,000 on the CPU)")
    add_flag(parser, "--warmup-batches", Integer(minimum=1), default=1,
             help="untimed stream batches per expert before timing (every expert gets statistics)")
    add_flag(parser, "--rounds", Integer(minimum=1), default=5, help="measured alternating rounds")
    add_flag(parser, "--warmup-rounds", Integer(minimum=0), default=1, help="unmeasured rounds first")
    add_flag(parser, "--lr", Real(above=0), default=0.005, help="Adam learning rate (the paper's for DualPrompt/MVP)")
    parser.add_argument("--mvp-router-features", choices=("cls", "query"), default="cls",
                        help="our MVP router's features (fly_modules.adapters.mvp router_features)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (CPU only; steadier on a shared machine "
                             "with --threads 1)")
    add_common_flag(parser, "seed", default=0)
    add_common_flag(parser, "threads", default=None, help="torch threads (default: all available CPUs)")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler tables of official and ours")
    add_flag(parser, "--profile-rows", Integer(minimum=1), default=15, help="rows of each profiler table")
    parser.add_argument("--quick", action="store_true", help="micro ViT and small sizes for a smoke test (seconds)")
    parser.add_argument("--train-only", action="store_true",
                        help="time the training step only: no evaluations, no inference agreement check")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target fails")
    args = parser.parse_args(argv)
    if args.quick:
        args.threads = args.threads or 1
        args.vit, args.expansion_dim, args.num_classes = "micro", 256, 10
        args.train_batch, args.eval_batch, args.eval_batches = 8, 16, 2
        args.online_iter, args.rounds, args.warmup_rounds, args.num_experts = 2, 1, 0, 2
        args.block_batches = args.block_batches or 2
    small_cpu = args.device == "cpu" and args.vit == "base"
    args.train_batch = args.train_batch or (8 if small_cpu else 64)
    args.eval_batch = args.eval_batch or (16 if small_cpu else 128)
    args.eval_batches = args.eval_batches or (1 if small_cpu else 40 if args.device == "cuda" else 10)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    # Checked before anything is built, each a one-line message.
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"bench_vs_reference: --device cuda, but CUDA is not available to torch {torch.__version__}")
    if args.clock == "process" and args.device != "cpu":
        raise SystemExit("bench_vs_reference: --clock process counts CPU time only; use it with --device cpu")
    if args.amp and args.device != "cuda":
        raise SystemExit("bench_vs_reference: --amp is the official CUDA autocast; use it with --device cuda")
    try:
        checkout = ref.load_checkout(args.reference_repo)
    except FileNotFoundError as error:
        raise SystemExit(f"bench_vs_reference: {error}") from None
    args.device = torch.device(args.device)
    args.threads = configure_threads(args.threads)
    # The official trainers use torch.cuda.amp.autocast, deprecated in recent torch (warns every call).
    warnings.filterwarnings("ignore", message=r".*torch\.cuda\.amp\..* is deprecated", category=FutureWarning)
    import timm

    device_name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "CPU"
    print_header("fly-modules vs the official FlyPrompt code (FlyGCL), same model, side by side", {
        "reference checkout": f"{checkout.path} (commit {reference_commit(str(checkout.path))})",
        "device": f"{args.device} ({device_name})", "timm": timm.__version__,
        "ViT (random weights)": f"{args.vit}: " + ", ".join(f"{k}={v}" for k, v in ref.VIT_PRESETS[args.vit].items()),
        "methods": ", ".join(args.methods), "classes / experts (steps)": f"{args.num_classes} / {args.num_experts}",
        "router M / ridge": f"{args.expansion_dim} / {args.ridge:g}",
        "train batch / online iterations": f"{args.train_batch} / {args.online_iter}",
        "eval batch x batches": f"{args.eval_batch} x {args.eval_batches}",
        "precision": "fp16 autocast (official --use_amp)" if args.amp else "fp32",
        "clock": "wall time" if args.clock == "wall" else "process CPU time (time.process_time)",
        "rounds (+ warm-up)": f"{args.rounds} (+ {args.warmup_rounds}), warm-up stream: "
                              f"{args.warmup_batches} batch(es) per expert",
        "MVP router features (ours)": args.mvp_router_features,
        "mode": "quick (smoke test)" if args.quick else "full",
    })
    report = Report()
    gemm_size = 512 if args.quick else 2048
    args.gemm_rates = gemm_rates(args.device, CLOCKS[args.clock], size=gemm_size)
    print(f"square GEMM, {gemm_size}: " + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in args.gemm_rates.items()), flush=True)
    results: Dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}, "environment": {
        "device": device_name, "torch": torch.__version__, "timm": timm.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "load_average_start": os.getloadavg(),
        "reference_commit": reference_commit(str(checkout.path)), "gemm_gflops": args.gemm_rates,
    }}
    for method in args.methods:
        print(f"\n== {method} ==", flush=True)
        variants = build_variants(checkout, method, args)
        args.block_batches = args.block_batches or block_batches(variants["ours"].handle, args.train_batch)
        generator = torch.Generator().manual_seed(args.seed + 3)
        test_set = EvalBatches([make_batch(generator, args.eval_batch, args) for _ in range(args.eval_batches)])
        timings = run_rounds(variants, test_set, args)
        results[method] = {
            "timing": report_timings(method, timings, test_set, args, report),
            "training_equivalence": compare_training(method, variants, args),
        }
        if args.train_only:
            print("inference with identical state: not checked (--train-only)")
        else:
            results[method]["inference_agreement"] = compare_inference(method, variants, test_set, args)
        if args.profile:
            profile(variants, test_set, args)
        del variants, test_set
        gc.collect()
        if args.device.type == "cuda":
            torch.cuda.empty_cache()
    failed = report.summary()
    results["environment"]["load_average_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True))
    return 1 if (failed and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
