#!/usr/bin/env python
"""Micro-benchmark of :class:`fly_modules.router.AnalyticRouter` against the reference's approach.

Every figure is a ratio of two approaches timed side by side in this one run (interleaved rounds,
median per side), so a busy shared machine slows both sides alike. The reference approach is
re-implemented here from the protocol (docs/protocol.md, sections 3.5 and 6.1):

* statistics: ``phi = relu(h R)``, a dense ``G.addmm_(phi^T, phi)`` and ``Q += phi^T onehot(expert)``;
* solve: a general dense LU solve ``torch.linalg.solve(G + lambda I, Q)`` (and, as a second baseline,
  an explicit inverse ``inv(G + lambda I) @ Q``), both in float64 here, recomputed at every evaluation.

Targets: the update, amortised over the blocked fold, >= 2.5x the dense float64 update on a CPU and
>= 3x the dense float32 update on a GPU; solve >= 1.8x LU and >= 4x inv with the same accuracy (on a
GPU >= 2x the float32 LU, ``--float32-lu``); cached routing >= 100x re-solving; peak extra memory of
one solve <= 1.5x the size of G. The parts, one module each: ``router_baselines.py`` (the inputs, the
reference approach, the measures), ``router_update.py``, ``router_solve.py``, ``router_memory.py``.

Run from the repository root::

    python -m benchmarks.speed.router            # full sizes: M = 10,000 (many minutes on 2 cores)
    python -m benchmarks.speed.router --quick    # small smoke test (seconds)
    python -m benchmarks.speed.router --device cuda   # on a GPU (timings synchronise the device)
    python -m benchmarks.speed.router --float32-lu --json router.json   # + the float32 LU; figures as JSON
    python -m benchmarks.speed.router --sections update,solve           # a subset (update, precision, solve)
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from typing import Optional, Sequence, Tuple

import torch

from benchmarks.flags import Parser, add_flag, add_shared_flag
from benchmarks.speed.figures import FigureReport
from benchmarks.speed.router_baselines import clustered_features, max_relative_difference
from benchmarks.speed.router_memory import bench_memory, memory_child
from benchmarks.speed.router_solve import TARGET_SOLVE_VS_LU32, bench_solve
from benchmarks.speed.router_update import bench_update
from benchmarks.speed.timing import (
    Report,
    add_run_options,
    describe_device,
    format_seconds,
    median,
    print_header,
    start_run,
    time_side_by_side,
)
from fly_modules._validation import Integer, Real
from fly_modules.router import AnalyticRouter

__all__ = ["main"]


# ==================================================================================== benches
def bench_expansion_precision(args: argparse.Namespace, report: Report) -> None:
    """The expansion of float32 features computed in float32 (widened to float64) against float64.

    Two routers with the same expansion follow the same stream: one is fed the features upcast to
    float64 (exact; the float64 product), the other the float32 features themselves (the float32
    product). Their statistics, weights and routing of held-out queries are compared, then the
    three operations that expand are timed side by side.
    """
    n, m = args.stream_samples, args.expansion_dim
    print(f"-- expansion precision: float32 vs float64 product, stream of {n} samples, d={args.dim}, M={m} --",
          flush=True)
    settings = dict(expansion_dim=m, ridge=args.ridge, seed=args.seed, device=args.device)
    exact = AnalyticRouter(args.dim, args.experts, **settings)
    fast = AnalyticRouter(args.dim, args.experts, **settings)
    features, expert_ids = clustered_features(n, args.dim, args.experts, seed=args.seed + 4, device=args.device)
    chunk = 512
    for start in range(0, n, chunk):
        batch, ids = features[start:start + chunk], expert_ids[start:start + chunk]
        exact.update(batch.double(), ids)
        fast.update(batch, ids)
    exact.flush()
    fast.flush()
    gram_error = max_relative_difference(torch.tril(fast.gram), torch.tril(exact.gram))
    cross_error = max_relative_difference(fast.cross, exact.cross)
    queries, _ = clustered_features(args.queries, args.dim, args.experts, seed=args.seed + 5, device=args.device)
    reference = exact(queries.double())
    scores = fast(queries)
    stats_only = fast(queries.double())  # float32 statistics, float64 query expansion
    weight_error = max_relative_difference(fast.weight, exact.weight)
    top2 = reference.topk(2, dim=1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    agree = float((scores.argmax(1) == reference.argmax(1)).double().mean())
    score_error = float((scores - reference).abs().max())
    report.info(f"statistics: max |G_32 - G_64| / max |G_64| = {gram_error:.1e}, Q: {cross_error:.1e}")
    report.info(f"weights: max |W_32 - W_64| / max |W_64| = {weight_error:.1e} "
                f"(solver {exact.solver_!r}; float32 rounding of phi amplified by cond(G + lambda I))")
    report.info(f"scores of {args.queries} queries: max |s_32 - s_64| = {score_error:.1e} "
                f"({score_error / float(reference.abs().max()):.1e} of max |s|; statistics alone "
                f"{float((stats_only - reference).abs().max()):.1e}); smallest top-2 margin {margin:.1e}")
    report.info(f"routes equal to the float64 product's on {agree:.2%} of {args.queries} queries; largest score "
                f"error / smallest top-2 margin = {score_error / margin:.2g} (below 1: no route can flip)")
    batch, _ = clustered_features(args.batch, args.dim, args.experts, seed=args.seed + 6, device=args.device)
    wide = batch.double()
    times = time_side_by_side(
        {"expand64": lambda: exact.expansion(wide), "expand32": lambda: fast.expansion(batch),
         "route64": lambda: exact(wide), "route32": lambda: fast(batch)},
        repeats=args.repeats, warmup=2, inner={"expand64": 3, "expand32": 3, "route64": 3, "route32": 3},
        synchronize=args.synchronize,
    )
    expand64, expand32 = median(times["expand64"]), median(times["expand32"])
    route64, route32 = median(times["route64"]), median(times["route32"])
    report.info(f"time, batch {args.batch}: expansion float64 {format_seconds(expand64)} vs float32 "
                f"{format_seconds(expand32)} -> {expand64 / expand32:.2f}x; cached routing {format_seconds(route64)} "
                f"vs {format_seconds(route32)} -> {route64 / route32:.2f}x")
    print(flush=True)


# ======================================================================================= main
SECTIONS = ("update", "precision", "solve")


def _sections(text: str) -> Tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [part for part in chosen if part not in SECTIONS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(SECTIONS)}, got {text!r}")
    return chosen


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_shared_flag(parser, "expansion_dim", narrower=[Integer(minimum=1)], help="random expansion width M")
    add_flag(parser, "--dim", Integer(minimum=1), default=768, help="query feature width d")
    add_flag(parser, "--batch", Integer(minimum=1), default=64, help="batch of the update and of the routing query")
    add_flag(parser, "--repeats", Integer(minimum=1), default=15, help="measured rounds of the update benchmark")
    add_flag(parser, "--solve-repeats", Integer(minimum=1), default=3, help="measured rounds of the solve benchmark")
    add_flag(parser, "--samples", Integer(minimum=1), default=4000, help="samples accumulated before the solve")
    add_flag(parser, "--experts", Integer(minimum=1), default=5, help="experts T")
    add_flag(parser, "--stream-samples", Integer(minimum=1), default=20_000, help="stream length of the expansion-precision comparison")
    add_flag(parser, "--queries", Integer(minimum=1), default=2000, help="held-out queries of the precision comparison")
    add_shared_flag(parser, "ridge", narrower=[Real(above=0)], help="ridge lambda > 0")
    add_run_options(parser, placed="the routers and the baselines")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--float32-lu", action="store_true",
                        help=f"also time the official code's float32 LU solve (target >= {TARGET_SOLVE_VS_LU32:g}x)")
    parser.add_argument("--sections", type=_sections, default=SECTIONS, metavar="LIST",
                        help=f"comma-separated subset of {','.join(SECTIONS)} (solve includes the peak memory)")
    parser.add_argument("--memory-child", choices=("ours", "lu", "inv"), help=argparse.SUPPRESS)
    parser.add_argument("--stats-file", help=argparse.SUPPRESS)  # the parent's statistics: read
    args = parser.parse_args(argv)
    if args.quick:
        args.expansion_dim, args.dim, args.batch = 512, 64, 16
        args.repeats, args.solve_repeats, args.samples = 5, 3, 400
        args.stream_samples, args.queries = 2000, 200
    return args


def solve_and_memory(args: argparse.Namespace, report: Report) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_router_") as folder:
        # The peak resident memory of a CPU solve is measured in fresh subprocesses; on a GPU in process.
        on_cpu = args.device.type == "cpu"
        stats_file = None if args.no_memory or not on_cpu else os.path.join(folder, "router.pt")
        bench_solve(args, report, stats_file)  # returns with every large tensor freed
        gc.collect()
        if stats_file is not None:
            bench_memory(args, report, stats_file)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    start_run(args)
    if args.memory_child:
        memory_child(args.memory_child, args.stats_file, args.ridge)
        return 0
    torch.manual_seed(args.seed)
    print_header("AnalyticRouter benchmark (ours vs the reference approach, side by side)", {
        "device": describe_device(args.device), "expansion dim M": args.expansion_dim, "feature dim d": args.dim, "batch": args.batch,
        "experts T": args.experts, "ridge": f"{args.ridge:g}", "samples for the solve": args.samples,
        "repeats (update / solve)": f"{args.repeats} / {args.solve_repeats}", "statistics dtype": "float64",
        "mode": "quick (smoke test)" if args.quick else "full",
    })
    report = FigureReport()
    if "update" in args.sections:
        bench_update(args, report)
        gc.collect()
    if "precision" in args.sections:
        bench_expansion_precision(args, report)
        gc.collect()
    if "solve" in args.sections:
        solve_and_memory(args, report)
    return report.finish(args, benchmark="bench_router")


if __name__ == "__main__":
    sys.exit(main())
