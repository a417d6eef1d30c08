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
import functools
import gc
import json
import os
import platform
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from benchmarks.core import reference_checkout as ref
from benchmarks.core.checkout_commit import checkout_commit
from benchmarks.core.errors import UsageError
from benchmarks.core.reference_checkout import EvalBatches
from benchmarks.core.results import write_text_atomic
from benchmarks.flags import Parser, add_common_flag, add_flag, add_input_flag, add_output_flag, add_shared_flag
from benchmarks.speed.timing import Report, configure_threads, format_seconds, median, print_header
from benchmarks.speed.vs_reference_agreement import compare_inference, compare_training
from benchmarks.speed.vs_reference_variants import (
    CLOCKS,
    Variant,
    block_batches,
    build_variants,
    evaluate,
    make_batch,
    stream_batch,
    stream_block,
    synchronizer,
)
from fly_modules._ridge import PANEL_ROWS, fold_panel_rows, fold_product_choice, panels
from fly_modules._validation import Integer, Real

# The parts, one module each: the variants and their batches, and the agreement checks; tests read
# block_batches here.
__all__ = ["block_batches", "fold_flops", "main"]

# % of the baseline's training step, router + ensemble together: ViT-B/16 on a GPU, the tiny ViT on a CPU
# (whose step is so cheap that the router's float64 update weighs more; see fold_arithmetic).
TARGET_TRAIN_OVERHEAD = {"cuda": 5.0, "cpu": 10.0}
TARGET_EVAL_SPEEDUP = 3.0     # our evaluation throughput / the official code's
VARIANTS = ("baseline", "official", "ours")


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
    solver_paths: List[str] = field(default_factory=list)  # ours: router.solver_ and its steps, each fresh evaluation


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
                    if phase == "fresh" and variant.name == "ours":
                        router = variant.handle.router
                        timings.solver_paths.append(f"{router.solver_} ({router.solve_steps_} steps)")
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
        "solving_share_percent": solving_share(timings, args),
    }


def solving_share(timings: Timings, args: argparse.Namespace) -> Dict[str, float]:
    """Per variant, the share of an anytime-evaluation run spent solving: one round is a block of
    ``block_batches`` stream batches then an evaluation after the new statistics (medians of rounds)."""
    share = {}
    for name in ("official", "ours"):
        rounds = zip(timings.train[name], timings.eval_fresh[name], timings.solve_fresh[name])
        share[name] = 100.0 * median([solve / (train * args.block_batches + total) for train, total, solve in rounds])
    print(f"  share of an anytime-evaluation run spent solving (a block of {args.block_batches} stream batches, then an "
          f"evaluation): official {share['official']:.1f}%, ours {share['ours']:.1f}%; our solves after new "
          f"statistics, round by round: {', '.join(timings.solver_paths)} (router.solver_, router.solve_steps_)")
    return share


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


def fold_flops(rows: int, width: int, panel_rows: int = PANEL_ROWS) -> float:
    """Flops of adding ``rows`` expanded rows to ``G``'s lower triangle in panels, as the router does
    (``accumulate_lower_gram``): ``2 rows sum_i panel_i end_i``, about ``rows (M^2 + panel_rows M)``."""
    return sum(2.0 * rows * (stop - start) * stop for start, stop in panels(width, panel_rows))


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
    # The fold's GEMM precision for float32 features (the expansion's product of fp32 and autocast CLS tokens)
    product_dtype = fold_product_choice(args.device, args.expansion_dim)
    product, panel_rows = str(product_dtype).replace("torch.", ""), fold_panel_rows(product_dtype)
    flops = fold_flops(args.train_batch, args.expansion_dim, panel_rows)
    result = {
        "gflop_per_batch": flops / 1e9,
        "gflops": flops / max(seconds, 1e-12) / 1e9 if seconds > 0 else 0.0,
        "percent_of_baseline": 100.0 * median([timings.train_folds["ours"][i] / base[i] for i in rounds]),
        "gemm_gflops_float64": args.gemm_rates["float64"],
        "gemm_gflops_float32": args.gemm_rates["float32"], "product_dtype": product,
    }
    # The floor: the same flops at the square GEMM's rate in the products' dtype, against the baseline's step
    floor_seconds = flops / (result["gemm_gflops_" + product] * 1e9)
    result["floor_percent_of_baseline"] = 100.0 * floor_seconds / median(base)
    if seconds > 0:
        print(f"  router folds as arithmetic: {result['gflop_per_batch']:.2f} GFLOP per stream batch, products in "
              f"{product} (G's lower triangle, {args.train_batch} rows at M = {args.expansion_dim}) at "
              f"{result['gflops']:.1f} GFLOP/s = {result['percent_of_baseline']:.1f}% of the baseline step; a square "
              f"float64 GEMM runs at {result['gemm_gflops_float64']:.1f} GFLOP/s here (float32 "
              f"{result['gemm_gflops_float32']:.1f}), so the fold is "
              f"{100 * result['gflops'] / result['gemm_gflops_' + product]:.0f}% of this machine's {product} rate; "
              f"at that rate the folds alone would be {result['floor_percent_of_baseline']:.1f}% of the baseline step "
              f"(the floor of ours' training overhead at this M)")
    return result


def paired_ratio(times: Dict[str, List[float]], numerator: str, denominator: str) -> float:
    """Median over rounds of ``numerator``'s time / ``denominator``'s in the same round: the variants of
    a round run back to back, so the ratio is less exposed to load that drifts during the run."""
    return median([a / b for a, b in zip(times[numerator], times[denominator])])


def percent(value: float, base: float) -> str:
    return f"{100.0 * (value / base - 1.0):+.1f}%"


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
def use_quick_sizes(args: argparse.Namespace) -> None:
    """With --quick: a micro ViT and small sizes for a smoke test (seconds)."""
    if not args.quick:
        return
    args.threads = args.threads or 1
    args.vit, args.expansion_dim, args.num_classes = "micro", 256, 10
    args.train_batch, args.eval_batch, args.eval_batches = 8, 16, 2
    args.online_iter, args.rounds, args.warmup_rounds, args.num_experts = 2, 1, 0, 2
    args.block_batches = args.block_batches or 2


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_input_flag(parser, "--reference-repo", "folder", convert=str, required=True,
                   help="a checkout of AnAppleCore/FlyGCL (read only)")
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
    add_output_flag(parser, "--json", "file", default=None, help="also write every figure to this JSON file")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target fails")
    args = parser.parse_args(argv)
    use_quick_sizes(args)
    small_cpu = args.device == "cpu" and args.vit == "base"
    args.train_batch = args.train_batch or (8 if small_cpu else 64)
    args.eval_batch = args.eval_batch or (16 if small_cpu else 128)
    args.eval_batches = args.eval_batches or (1 if small_cpu else 40 if args.device == "cuda" else 10)
    return args


def print_settings(args: argparse.Namespace, checkout: ref.Checkout, device_name: str, timm_version: str) -> None:
    """The run's header: the checkout, the device, the model and every size."""
    print_header("fly-modules vs the official FlyPrompt code (FlyGCL), same model, side by side", {
        "reference checkout": f"{checkout.path} (commit {checkout_commit(checkout.path)})",
        "device": f"{args.device} ({device_name})", "timm": timm_version,
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


def run_method(method: str, checkout: ref.Checkout, args: argparse.Namespace, report: Report) -> Dict[str, Any]:
    """One method's three variants built, timed side by side and compared; its figures."""
    print(f"\n== {method} ==", flush=True)
    variants = build_variants(checkout, method, args)
    args.block_batches = args.block_batches or block_batches(variants["ours"].handle, args.train_batch)
    generator = torch.Generator().manual_seed(args.seed + 3)
    test_set = EvalBatches([make_batch(generator, args.eval_batch, args) for _ in range(args.eval_batches)])
    timings = run_rounds(variants, test_set, args)
    result = {
        "timing": report_timings(method, timings, test_set, args, report),
        "training_equivalence": compare_training(method, variants, args),
    }
    if args.train_only:
        print("inference with identical state: not checked (--train-only)")
    else:
        result["inference_agreement"] = compare_inference(method, variants, test_set, args)
    if args.profile:
        profile(variants, test_set, args)
    del variants, test_set
    gc.collect()
    if args.device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _setting_error(args: argparse.Namespace) -> Optional[str]:
    """What in ``args`` does not fit this machine or the other flags, in one line, or ``None``."""
    if args.device == "cuda" and not torch.cuda.is_available():
        return f"--device cuda, but CUDA is not available to torch {torch.__version__}"
    if args.clock == "process" and args.device != "cpu":
        return "--clock process counts CPU time only; use it with --device cpu"
    if args.amp and args.device != "cuda":
        return "--amp is the official CUDA autocast; use it with --device cuda"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:  # checked before anything is built, each a one-line message
        if error := _setting_error(args):
            raise UsageError(error)
        checkout = ref.load_checkout(args.reference_repo)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.device = torch.device(args.device)
    args.threads = configure_threads(args.threads)
    # The official trainers use torch.cuda.amp.autocast, deprecated in recent torch (warns every call).
    warnings.filterwarnings("ignore", message=r".*torch\.cuda\.amp\..* is deprecated", category=FutureWarning)
    import timm

    device_name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "CPU"
    print_settings(args, checkout, device_name, timm.__version__)
    report = Report()
    gemm_size = 512 if args.quick else 2048
    args.gemm_rates = gemm_rates(args.device, CLOCKS[args.clock], size=gemm_size)
    print(f"square GEMM, {gemm_size}: " + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in args.gemm_rates.items()), flush=True)
    results: Dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}, "environment": {
        "device": device_name, "torch": torch.__version__, "timm": timm.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "load_average_start": os.getloadavg(),
        "reference_commit": checkout_commit(checkout.path), "gemm_gflops": args.gemm_rates,
    }}
    for method in args.methods:
        results[method] = run_method(method, checkout, args, report)
    failed = report.summary()
    results["environment"]["load_average_end"] = os.getloadavg()
    if args.json:
        write_text_atomic(args.json, json.dumps(results, indent=2, sort_keys=True))
    return 1 if (failed and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
