"""Seconds per batch of the routing study's five routers, side by side at the paper's sizes.

    python -m benchmarks.speed.router_timing [--device cuda] [--quick] [--json FILE]

The routing study's runs time the four alternative routers inside the training, on the expanded
features the run already computed; the analytic router (``ridge``) is not timed there, since a
method feeds it itself. Here all five learn and route the same batches of clustered, ViT-like CLS
features (``benchmarks.speed.router_baselines.clustered_features``) in interleaved rounds
(``benchmarks.speed.timing.time_side_by_side``), each cost counted as a user of that router alone pays
it: the random expansion ``relu(h R)`` is in every row. The ridge's system is solved at most once per
evaluation, not per batch, so its solve is a row of its own; its statistics are folded in blocks of
``--fold-rows`` rows, so its update is timed over one block of batches and divided by their number.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from fly_modules import AnalyticRouter
from fly_modules._validation import Integer

from ..flags import Parser, add_flag, add_shared_flag
from ..studies.router_set import RIDGE, ROUTERS, RouterSet
from .router_baselines import clustered_features
from .timing import add_run_options, median, print_header, start_run, time_side_by_side

__all__ = ["RouterCosts", "build_routers", "multiply_adds", "time_routers", "main"]

#: router -> multiply-adds of routing one sample from its expanded features, as a function of the
#: expansion width M, the experts E and the router (its hidden width H, its K centres per expert)
MULTIPLY_ADDS: Dict[str, Callable[[int, int, object], int]] = {
    RIDGE: lambda m, e, router: m * e,
    "prototype": lambda m, e, router: m * e,
    "naive_bayes": lambda m, e, router: 2 * m * e,
    "mlp": lambda m, e, router: m * router.network[0].out_features + router.network[0].out_features * e,
    "kmeans": lambda m, e, router: m * router.k * e,
}


def multiply_adds(name: str, expansion_dim: int, num_experts: int, router: object = None) -> int:
    """Multiply-adds per sample of ``name``'s routing after the expansion (which costs ``d * M`` more)."""
    return int(MULTIPLY_ADDS[name](expansion_dim, num_experts, router))


@dataclass
class RouterCosts:
    """Median seconds per batch of one router: ``update`` (learn a batch) and ``route`` (route one)."""

    name: str
    update: float
    route: float
    multiply_adds: int


def build_routers(features: Tensor, experts: Tensor, args: argparse.Namespace):
    """The analytic router and the study's other routers on its expansion, each fed the first
    ``args.batches`` batches of ``features`` with their experts."""
    ridge = AnalyticRouter(features.shape[1], args.experts, expansion_dim=args.expansion_dim, ridge=args.ridge,
                           seed=args.seed, fold_rows=args.fold_rows, device=args.device)
    others = RouterSet(ridge.expansion, [name for name in ROUTERS if name != RIDGE], args.experts,
                       seed=args.seed, device=args.device)
    for rows, ids in zip(features.split(args.batch_size), experts.split(args.batch_size)):
        ridge.update(rows, ids)
        others.update(rows, ids)
    ridge.solve()
    return ridge, others


def _fold_cycle(args: argparse.Namespace) -> int:
    """Batches in one block of the ridge's folded statistics (its update is timed over a block)."""
    return max(1, args.fold_rows // args.batch_size)


def _learn_block(ridge: AnalyticRouter, rows: Tensor, ids: Tensor, batches: int) -> None:
    for _ in range(batches):
        ridge.update(rows, ids)
    ridge.flush()


def _candidates(ridge: AnalyticRouter, others: RouterSet, rows: Tensor, ids: Tensor, cycle: int):
    """``update`` and ``route`` callables of every router on one batch (the ridge's update: ``cycle``
    batches and their fold), the expansion inside each."""
    update = {RIDGE: lambda: _learn_block(ridge, rows, ids, cycle)}
    route = {RIDGE: lambda: ridge.route(rows)}
    for name, router in others.routers.items():
        update[name] = lambda router=router: router.update(others.expand(rows), ids)
        route[name] = lambda router=router: router.route(others.expand(rows))
    return update, route


def time_routers(args: argparse.Namespace) -> List[RouterCosts]:
    """Every router's median seconds per batch, measured side by side; the ridge's solve as ``ridge solve``."""
    features, experts = clustered_features((args.batches + 1) * args.batch_size, args.features, args.experts,
                                           seed=args.seed, device=str(args.device))
    ridge, others = build_routers(features[:-args.batch_size], experts[:-args.batch_size], args)
    rows, ids = features[-args.batch_size:], experts[-args.batch_size:]
    update, route = _candidates(ridge, others, rows, ids, _fold_cycle(args))
    timing = dict(repeats=args.repeats, synchronize=args.synchronize)
    routed = time_side_by_side(route, **timing)  # before the updates: the ridge's solution stays current
    learned = time_side_by_side(update, **timing)
    learned[RIDGE] = [seconds / _fold_cycle(args) for seconds in learned[RIDGE]]
    solved = time_side_by_side({"ridge solve": ridge.solve}, **timing)["ridge solve"]
    routers = {RIDGE: None, **others.routers}
    costs = [RouterCosts(name, median(learned[name]), median(routed[name]),
                         multiply_adds(name, args.expansion_dim, args.experts, routers[name])) for name in update]
    return costs + [RouterCosts("ridge solve", median(solved), 0.0, 0)]


def format_costs(costs: Sequence[RouterCosts]) -> str:
    """The costs as a Markdown table, each router's time also relative to the ridge's."""
    ridge = next(cost for cost in costs if cost.name == RIDGE)
    lines = ["| router | ms / update | x ridge | ms / routed batch | x ridge | multiply-adds / sample (after the expansion) |",
             "|---|---|---|---|---|---|"]
    for cost in costs:
        if cost.name == "ridge solve":
            lines.append(f"| {cost.name} (once per evaluation) | {1000 * cost.update:.3f} | - | - | - | - |")
            continue
        lines.append(f"| {cost.name} | {1000 * cost.update:.3f} | {cost.update / ridge.update:.2f} | "
                     f"{1000 * cost.route:.3f} | {cost.route / ridge.route:.2f} | {cost.multiply_adds:,} |")
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(prog="python -m benchmarks.speed.router_timing", description=__doc__.split("\n")[0])
    add_flag(parser, "--features", Integer(minimum=1), default=768, help="width of the CLS features (ViT-B/16: 768)")
    add_shared_flag(parser, "expansion_dim", help="M, the expansion width (the paper's)")
    add_flag(parser, "--experts", Integer(minimum=1), default=5, help="experts to route among (the paper's 5 sessions)")
    add_flag(parser, "--batch-size", Integer(minimum=1), default=64, help="samples per batch (the paper's 64)")
    add_flag(parser, "--batches", Integer(minimum=1), default=20, help="batches learnt before the timed one")
    add_shared_flag(parser, "ridge", help="the analytic router's lambda, or 'auto'")
    add_flag(parser, "--fold-rows", Integer(minimum=1), default=512, help="rows the analytic router folds at once")
    add_flag(parser, "--repeats", Integer(minimum=1), default=7, help="measured rounds (medians are reported)")
    add_run_options(parser, placed="the routers")
    args = parser.parse_args(argv)
    if args.quick:
        args.features, args.expansion_dim, args.batches, args.repeats = 32, 256, 4, 3
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    start_run(args)
    print_header("routing study: seconds per batch of each router", {
        "features": args.features, "expansion": args.expansion_dim, "experts": args.experts,
        "batch": args.batch_size, "device": args.device, "rounds": args.repeats})
    with torch.no_grad():
        costs = time_routers(args)
    print(format_costs(costs))
    if args.json:
        with open(args.json, "w") as file:
            json.dump([cost.__dict__ for cost in costs], file, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
