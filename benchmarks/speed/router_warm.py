#!/usr/bin/env python
"""The router's warm solves and fold precision, measured on a stream of clustered features.

Warm solves: ``--base`` samples and a solve, then ``--rounds`` rounds of ``--step`` new samples, each followed
by a solve; after the first, one residual product's kernel beside a dense product, and the cost of the stopping
test's norm (one more column of that product, or a pass over ``|G|``); per round the path
``solver="auto"`` took (``router.solver_``), its float64 steps and seconds,
beside a full solve of the same statistics (the path ``preferred_solver`` picks, no factor reused) and the
largest gap between the two answers relative to the largest weight.

Fold precision: the stream's rows folded into ``G`` in folds of ``--fold-rows`` rows with float64 products and
with each lower precision (float32, bfloat16): seconds of one fold and, against the float64 fold,
max|dG| / max|G|, max|dW| / max|W| and the share of held-out queries routed alike. Fold layouts: one fold of
float32 rows in the library's row panels, in other panel heights, in column panels, into a float32 accumulator
(and its flush), and the products alone, beside a square float32 GEMM's rate. Times are this process's
CPU time on a CPU (steady on a shared machine with ``--threads 1``), wall time on a GPU.

Run from the repository root::

    python -m benchmarks.speed.router_warm --threads 1 --expansion-dim 4000 --step 256
    python -m benchmarks.speed.router_warm --threads 1 --expansion-dim 10000 --step 512 --rounds 4
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.flags import Parser, add_flag, add_shared_flag
from benchmarks.speed.router_baselines import clustered_features
from benchmarks.speed.timing import add_run_options, print_header, start_run
from benchmarks.speed.vs_reference import fold_flops, gemm_rates
from fly_modules import _ridge  # private but supported: the solvers and the fold kernel
from fly_modules._validation import Integer, Real
from fly_modules.router import AnalyticRouter

FOLD_PRECISIONS = (torch.float64, torch.float32, torch.bfloat16)


def clock_of(args: argparse.Namespace) -> Callable[[], float]:
    """This process's CPU time on a CPU (steady on a shared machine), wall time on a GPU."""
    return time.process_time if args.device.type == "cpu" else time.perf_counter


def timed(call: Callable[[], object], args: argparse.Namespace) -> Tuple[object, float]:
    clock = clock_of(args)
    sync = args.synchronize or (lambda: None)
    sync()
    start = clock()
    result = call()
    sync()
    return result, clock() - start


def feed(router: AnalyticRouter, features: Tensor, ids: Tensor, start: int, stop: int, batch: int) -> None:
    for first in range(start, stop, batch):
        router.update(features[first:min(first + batch, stop)], ids[first:min(first + batch, stop)])
    router.flush()


def full_solve(router: AnalyticRouter) -> _ridge.RidgeSolution:
    if _ridge.preferred_solver(router.device, router.expansion_dim) == "cholesky":
        return _ridge.solve_cholesky(router.gram, router.cross, router.ridge)
    return _ridge.solve_mixed(router.gram, router.cross, router.ridge) or _ridge.solve_cholesky(
        router.gram, router.cross, router.ridge)


def bench_warm(args: argparse.Namespace) -> None:
    total = args.base + args.rounds * args.step
    features, ids = clustered_features(total, args.dim, args.experts, seed=args.seed, device=str(args.device))
    router = AnalyticRouter(args.dim, args.experts, expansion_dim=args.expansion_dim, ridge=args.ridge,
                            device=args.device)
    feed(router, features, ids, 0, args.base, args.batch)
    _, seconds = timed(router.solve, args)
    print(f"\nwarm solves: M = {args.expansion_dim}, {args.base} samples, then rounds of {args.step}")
    print(f"  first solve: {router.solver_}, {router.solve_steps_} steps, {seconds:.3f} s")
    bench_product(router, args)
    for round_index in range(args.rounds):
        start = args.base + round_index * args.step
        feed(router, features, ids, start, start + args.step, args.batch)
        weights, seconds = timed(router.solve, args)
        path, steps = router.solver_, router.solve_steps_
        reference, full_seconds = timed(lambda: full_solve(router), args)
        gap = float((weights - reference.weights).abs().max() / reference.weights.abs().max())
        print(f"  +{args.step * (round_index + 1)} samples: {path}, {steps} steps, {seconds:.3f} s; full solve "
              f"({reference.solver}) {full_seconds:.3f} s = {full_seconds / seconds:.2f}x; max|dW|/max|W| {gap:.1e}",
              flush=True)


def bench_product(router: AnalyticRouter, args: argparse.Namespace) -> None:
    """One residual product's kernel, ``G`` times the solution's columns from the lower triangle in panels,
    beside a dense product with the full symmetric matrix (what storing both triangles would cost)."""
    vectors, full = router.weight.t().contiguous(), router.gram_matrix()
    product = functools.partial(_ridge.symmetric_matmul, router.gram, vectors, _ridge.PRODUCT_PANEL_ROWS)
    panelled = min(timed(product, args)[1] for _ in range(3))
    dense = min(timed(lambda: full @ vectors, args)[1] for _ in range(3))
    print(f"  one product with {vectors.shape[1]} columns: lower triangle in panels of {_ridge.PRODUCT_PANEL_ROWS} "
          f"rows {panelled:.4f} s; dense product with the full matrix {dense:.4f} s = {dense / panelled:.2f}x")
    # The stopping test's ||G||_inf: one more column of the first product (ReLU features) or a pass over |G|.
    def product_with_norm() -> Tensor:
        return _ridge.ResidualProducts(router.gram, _ridge.PRODUCT_PANEL_ROWS, nonnegative=True)(vectors)

    with_norm = min(timed(product_with_norm, args)[1] for _ in range(3))
    norm_pass = min(timed(lambda: _ridge.symmetric_abs_row_sums(router.gram, _ridge.PRODUCT_PANEL_ROWS), args)[1]
                    for _ in range(3))
    print(f"  G's infinity norm: one more column of the first product {with_norm - panelled:+.4f} s "
          f"(nonnegative G); a pass over |G| {norm_pass:.4f} s")


def bench_folds(args: argparse.Namespace) -> None:
    total = args.base + args.rounds * args.step
    features, ids = clustered_features(total + args.queries, args.dim, args.experts, seed=args.seed + 1,
                                       device=str(args.device))
    router = AnalyticRouter(args.dim, args.experts, expansion_dim=args.expansion_dim, ridge=args.ridge,
                            device=args.device)
    phi, queries = router.expansion(features[:total]), router.expansion(features[total:])
    cross = phi.t() @ F.one_hot(ids[:total], args.experts).to(phi.dtype)
    print(f"\nfold precision: M = {args.expansion_dim}, {total} float32 feature rows in folds of {args.fold_rows}")
    reference = None
    for dtype in FOLD_PRECISIONS:
        panel = _ridge.fold_panel_rows(dtype)
        gram = torch.zeros(args.expansion_dim, args.expansion_dim, dtype=torch.float64, device=args.device)
        seconds = []
        for start in range(0, total, args.fold_rows):
            rows = phi[start:start + args.fold_rows]
            fold = functools.partial(_ridge.accumulate_lower_gram, gram, rows, panel, dtype)
            _, spent = timed(fold, args)
            seconds.append(spent)
        name = str(dtype).replace("torch.", "")
        try:
            solution = _ridge.solve_cholesky(gram, cross, args.ridge).weights
        except _ridge.RouterSolveError:
            print(f"  {name:<9} one fold {max(seconds):.3f} s; G + ridge I is no longer positive definite: no solution")
            continue
        routes = (queries @ solution).argmax(dim=1)
        if reference is None:
            reference = (torch.tril(gram), solution, routes, max(seconds))
            print(f"  {name:<9} one fold {max(seconds):.3f} s (the slowest, a full fold)")
            continue
        dg = float((torch.tril(gram) - reference[0]).abs().max() / reference[0].abs().max())
        dw = float((solution - reference[1]).abs().max() / reference[1].abs().max())
        alike = 100.0 * float((routes == reference[2]).double().mean())
        print(f"  {name:<9} one fold {max(seconds):.3f} s = {reference[3] / max(seconds):.2f}x faster; "
              f"max|dG|/max|G| {dg:.1e}, max|dW|/max|W| {dw:.1e}, routes alike {alike:.1f}% of {args.queries}")


# ======================================================================== fold layouts
class FoldLayouts:
    """Ways to add ``phi^T phi`` (float32 products) to a float64 ``G``'s lower triangle, on the same rows: the
    library's row panels beside the alternatives measured for it (``docs/router.md``, "Fold precision")."""

    def __init__(self, width: int, rows: Tensor) -> None:
        self.gram = torch.zeros(width, width, dtype=torch.float64, device=rows.device)
        self.gram.fill_(0.0)  # written once, so no layout pays for the first touch of G's pages
        self.phi, self.low = rows.double(), rows.float()
        self.accumulator: Optional[Tensor] = None  # float32, allocated by the accumulator's layout only

    def row_panels(self, panel_rows: int) -> None:
        _ridge.accumulate_lower_gram(self.gram, self.phi, panel_rows, torch.float32)

    def column_panels(self, panel_rows: int = _ridge.LOW_PRECISION_PANEL_ROWS) -> None:
        for start, stop in _ridge.panels(self.gram.shape[0], panel_rows):
            self.gram[start:, start:stop] += self.low[:, start:].t() @ self.low[:, start:stop]

    def products_only(self, panel_rows: int = _ridge.LOW_PRECISION_PANEL_ROWS) -> None:
        for start, stop in _ridge.panels(self.gram.shape[0], panel_rows):
            self.low[:, start:stop].t() @ self.low[:, :stop]

    def float32_accumulator(self, panel_rows: int = _ridge.LOW_PRECISION_PANEL_ROWS) -> None:
        if self.accumulator is None:
            self.accumulator = torch.zeros_like(self.gram, dtype=torch.float32)
        for start, stop in _ridge.panels(self.gram.shape[0], panel_rows):
            self.accumulator[start:stop, :stop].addmm_(self.low[:, start:stop].t(), self.low[:, :stop])

    def flush_accumulator(self, panel_rows: int = _ridge.PANEL_ROWS) -> None:
        for start, stop in _ridge.panels(self.gram.shape[0], panel_rows):
            self.gram[start:stop, :stop] += self.accumulator[start:stop, :stop]
            self.accumulator[start:stop, :stop].zero_()


def bench_fold_layouts(args: argparse.Namespace) -> None:
    """One fold of ``--fold-rows`` float32 rows in each layout, and the square float32 GEMM's rate beside it."""
    rows = torch.relu(torch.randn(args.fold_rows, args.expansion_dim, generator=torch.Generator().manual_seed(2)))
    layouts = FoldLayouts(args.expansion_dim, rows.to(args.device))
    chosen = _ridge.LOW_PRECISION_PANEL_ROWS
    cases = [(f"row panels of {chosen} rows (the library's)", functools.partial(layouts.row_panels, chosen))]
    cases += [(f"row panels of {height} rows", functools.partial(layouts.row_panels, height)) for height in (64, 256)]
    cases += [("column panels (G[a:, a:b] += ...)", layouts.column_panels),
              ("float32 accumulator (GEMM adds in place; flushed below)", layouts.float32_accumulator),
              ("  ... its flush into the float64 G (lower triangle)", layouts.flush_accumulator),
              ("the panels' products alone (nothing added to G)", layouts.products_only)]
    flops = fold_flops(args.fold_rows, args.expansion_dim, chosen)
    rate = gemm_rates(args.device, clock_of(args))["float32"]  # GFLOP/s
    print(f"\nfold layouts: M = {args.expansion_dim}, one fold of {args.fold_rows} float32 rows, best of 3; "
          f"a square 2048 float32 GEMM runs at {rate:.1f} GFLOP/s, at which the fold's "
          f"{flops / 1e9:.2f} GFLOP take {flops / 1e9 / rate:.3f} s")
    for name, call in cases:
        seconds = min(timed(call, args)[1] for _ in range(3))
        print(f"  {name:<58} {seconds:.3f} s")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_shared_flag(parser, "expansion_dim", narrower=[Integer(minimum=1)], help="random expansion width M")
    add_shared_flag(parser, "ridge", narrower=[Real(above=0)], help="ridge lambda > 0")
    add_flag(parser, "--dim", Integer(minimum=1), default=192, help="query feature width d (the tiny ViT's)")
    add_flag(parser, "--experts", Integer(minimum=1), default=5, help="experts T")
    add_flag(parser, "--batch", Integer(minimum=1), default=64, help="batch of each update")
    add_flag(parser, "--base", Integer(minimum=1), default=320, help="samples before the first solve")
    add_flag(parser, "--step", Integer(minimum=1), default=512, help="samples added between two solves")
    add_flag(parser, "--rounds", Integer(minimum=1), default=3, help="solves after the first")
    add_flag(parser, "--fold-rows", Integer(minimum=1), default=512, help="rows per fold of the precision comparison")
    add_flag(parser, "--queries", Integer(minimum=1), default=2000, help="held-out queries of the precision comparison")
    parser.add_argument("--sections", choices=("warm", "folds", "layouts", "both"), default="both",
                        help="what to measure: warm solves, fold precision, fold layouts; both: all three")
    add_run_options(parser, placed="the router and its kernels")
    args = parser.parse_args(argv)
    if args.quick:
        args.expansion_dim, args.dim, args.base, args.step, args.rounds, args.queries = 256, 32, 200, 20, 2, 100
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    start_run(args)
    print_header("router warm solves and fold precision", {
        "M / ridge / experts": f"{args.expansion_dim} / {args.ridge:g} / {args.experts}",
        "device / threads": f"{args.device} / {args.threads}",
        "clock": "process CPU time" if args.device.type == "cpu" else "wall time",
    })
    if args.sections in ("warm", "both"):
        bench_warm(args)
    if args.sections in ("folds", "both"):
        bench_folds(args)
    if args.sections in ("layouts", "both"):
        bench_fold_layouts(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
