"""The router's solve against the reference's LU solve and explicit inverse, on the same statistics.

Targets: solve >= 1.8x LU and >= 4x inv with the same accuracy (on a GPU >= 2x the float32 LU,
``--float32-lu``); cached routing >= 100x re-solving. The path ``solver="auto"`` did not choose on this device
is timed beside it, which checks the device rule (``fly_modules/_ridge.py``, ``preferred_solver``).
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor

from benchmarks.speed.router_baselines import (
    clustered_features,
    float32_lu_solve,
    largest_eigenvalue,
    max_relative_difference,
    reference_inv_solve,
    reference_lu_solve,
    relative_residual,
)
from benchmarks.speed.router_memory import bench_memory_cuda
from benchmarks.speed.timing import Report, best_ratio, format_seconds, median, time_side_by_side
from fly_modules import _ridge  # private but supported: the solvers
from fly_modules.router import AnalyticRouter

TARGET_SOLVE_VS_LU = 1.8
TARGET_SOLVE_VS_INV = 4.0
TARGET_SOLVE_VS_LU32 = 2.0  # the official code's own solve: float32 LU at every routing (--float32-lu)
TARGET_W_RELATIVE_DIFF = 1e-6  # float64-level agreement (a float32 solve differs by ~cond * 6e-8)
TARGET_RESIDUAL_FACTOR = 10.0  # our relative residual within this factor of LU's
TARGET_CACHED_ROUTING = 100.0


def build_statistics(args: argparse.Namespace) -> AnalyticRouter:
    router = AnalyticRouter(args.dim, args.experts, expansion_dim=args.expansion_dim, ridge=args.ridge,
                            seed=args.seed, solver="auto", device=args.device)
    features, expert_ids = clustered_features(args.samples, args.dim, args.experts, seed=args.seed + 2, device=args.device)
    chunk = 512
    for start in range(0, args.samples, chunk):
        router.update(features[start:start + chunk], expert_ids[start:start + chunk])
    return router


class SolveSetting:
    """The statistics, the routing queries and the solves the solve benchmark times; each solve keeps its
    weights in ``outputs`` for the accuracy checks."""

    def __init__(self, args: argparse.Namespace, router: AnalyticRouter, gram: Tensor, cross: Tensor) -> None:
        self.router, self.gram, self.cross, self.ridge = router, gram, cross, args.ridge
        self.queries, _ = clustered_features(args.batch, args.dim, args.experts, seed=args.seed + 3, device=args.device)
        self.small_g, self.small_q = gram[:256, :256].clone(), cross[:256].clone()  # the warm-up's system
        self.outputs: Dict[str, Tensor] = {}
        # The device rule of solver="auto", checked here: the path it did not choose is timed beside it.
        self.chosen = _ridge.preferred_solver(args.device, router.expansion_dim)
        self.other = "cholesky" if self.chosen == "mixed" else "mixed"

    def warm_up(self) -> None:
        """Warm-up on a small system (LAPACK initialisation) so no full-size round has to be discarded."""
        small_g, small_q = self.small_g, self.small_q
        reference_lu_solve(small_g, small_q, self.ridge), reference_inv_solve(small_g, small_q, self.ridge)
        small_system = small_g.clone()
        small_system.diagonal().add_(self.ridge)
        torch.cholesky_solve(small_q.float(), torch.linalg.cholesky(small_system.float()))

    def ours(self) -> None:
        self.outputs["ours"] = self.router.solve()

    def lu(self) -> None:
        self.outputs["lu"] = reference_lu_solve(self.gram, self.cross, self.ridge)

    def inv(self) -> None:
        self.outputs["inv"] = reference_inv_solve(self.gram, self.cross, self.ridge)

    def cached_route(self) -> None:
        self.router(self.queries)

    def other_path(self) -> None:
        router = self.router
        if self.other == "cholesky":
            self.outputs["other"] = _ridge.solve_cholesky(router.gram, router.cross, self.ridge).weights
        else:
            result = _ridge.solve_mixed(router.gram, router.cross, self.ridge)
            self.outputs["other"] = (result.weights if result is not None
                                     else reference_lu_solve(self.gram, self.cross, self.ridge))

    def candidates(self, float32_lu: bool) -> Dict[str, Callable[[], object]]:
        """The timed sides, in the order the rounds interleave them (``lu32``: the official code's float32 LU,
        which keeps float32 statistics and LU-solves them at every routing)."""
        candidates: Dict[str, Callable[[], object]] = {
            "ours": self.ours, "other": self.other_path, "lu": self.lu, "inv": self.inv, "cached": self.cached_route,
        }
        if float32_lu:
            gram32, cross32 = self.gram.float(), self.cross.float()
            reference_lu_solve(self.small_g.float(), self.small_q.float(), self.ridge)  # float32 LAPACK/cuSOLVER warm-up
            candidates["lu32"] = lambda: reference_lu_solve(gram32, cross32, self.ridge)
        return candidates


def bench_solve(args: argparse.Namespace, report: Report, stats_file: Optional[str] = None) -> None:
    print(f"-- solve: M={args.expansion_dim}, {args.samples} samples of ReLU-expanded clustered features (d={args.dim}, "
          f"T={args.experts}), ridge {args.ridge:g}, float64 statistics --", flush=True)
    router = build_statistics(args)
    gram = router.gram_matrix()  # full symmetric float64 G for the baselines and the residuals
    cross = router.cross.clone()
    report_conditioning(args, report, router, gram)
    setting = SolveSetting(args, router, gram, cross)
    setting.warm_up()
    times = time_side_by_side(
        setting.candidates(args.float32_lu), repeats=args.solve_repeats, warmup=0, inner={"cached": 10},
        synchronize=args.synchronize,
    )
    report_solve_speed(args, report, setting, times)
    report_solver_rule(args, report, setting, times)
    report_solve_accuracy(report, setting)
    report_cached_routing(args, report, times)
    if stats_file is not None:  # the statistics for the peak-memory subprocesses
        torch.save(router.state_dict(), stats_file)
    if args.device.type == "cuda" and not args.no_memory:
        bench_memory_cuda(report, router, gram, cross, args.ridge)
    print(flush=True)


def report_conditioning(args: argparse.Namespace, report: Report, router: AnalyticRouter, gram: Tensor) -> None:
    """The system's condition number, and the path our mixed-precision solver takes on it."""
    m, ridge = args.expansion_dim, args.ridge
    top = largest_eigenvalue(gram, seed=args.seed)
    bound = "exact: lambda_min(G) = 0 since samples < M" if args.samples < m else "upper bound: lambda_min(G) >= 0"
    report.info(f"cond(G + lambda I) ~ {(top + ridge) / ridge:.2e} (lambda_max(G) = {top:.3e} by power "
                f"iteration; {bound}); max diag(G) = {float(gram.diagonal().max()):.3e}")
    mixed = _ridge.solve_mixed(router.gram, router.cross, ridge)
    if mixed is None:
        report.info("our solver path: mixed precision did not converge  <- float64 fallback taken")
    else:
        report.info(f"our solver path: 'mixed', {mixed.refinement_steps} float64 residual products (refinement "
                    f"steps); condition estimate from the float32 factor {mixed.condition:.2e}")


def report_solve_speed(args: argparse.Namespace, report: Report, setting: SolveSetting,
                       times: Dict[str, List[float]]) -> None:
    t_ours, t_lu, t_inv = (median(times[k]) for k in ("ours", "lu", "inv"))
    report.check("router.solve_vs_lu", t_lu / t_ours, ">=", TARGET_SOLVE_VS_LU, unit="x",
                 detail=f"LU {format_seconds(t_lu)} vs ours {format_seconds(t_ours)} (solver_={setting.router.solver_!r}, "
                 f"median of {args.solve_repeats}; ratio of the best times {best_ratio(times, 'lu', 'ours')})")
    report.check("router.solve_vs_inv", t_inv / t_ours, ">=", TARGET_SOLVE_VS_INV, unit="x",
                 detail=f"inv {format_seconds(t_inv)} vs ours {format_seconds(t_ours)} "
                 f"(ratio of the best times {best_ratio(times, 'inv', 'ours')})")
    if args.float32_lu:
        t_lu32 = median(times["lu32"])
        report.check("router.solve_vs_lu32", t_lu32 / t_ours, ">=", TARGET_SOLVE_VS_LU32, unit="x",
                     detail=f"float32 LU (the official code's solve) {format_seconds(t_lu32)} vs ours "
                     f"{format_seconds(t_ours)} (ratio of the best times {best_ratio(times, 'lu32', 'ours')})")


def report_solver_rule(args: argparse.Namespace, report: Report, setting: SolveSetting,
                       times: Dict[str, List[float]]) -> None:
    chosen, other, outputs = setting.chosen, setting.other, setting.outputs
    t_ours, t_lu, t_other = (median(times[k]) for k in ("ours", "lu", "other"))
    verdict = "confirmed" if t_other >= t_ours else "CONTRADICTED: the other path is faster on this device"
    report.info(f"solver rule (auto on {args.device.type}: {chosen!r}): {other!r} {format_seconds(t_other)} vs "
                f"{chosen!r} {format_seconds(t_ours)} -> {t_other / t_ours:.2f}x, rule {verdict}; {other!r} vs LU "
                f"{t_lu / t_other:.2f}x, accuracy {max_relative_difference(outputs['other'], outputs['lu']):.1e}")


def report_solve_accuracy(report: Report, setting: SolveSetting) -> None:
    gram, cross, ridge = setting.gram, setting.cross, setting.ridge
    w_ours, w_lu, w_inv = setting.outputs["ours"], setting.outputs["lu"], setting.outputs["inv"]
    res_ours, res_lu, res_inv = (relative_residual(gram, cross, ridge, w) for w in (w_ours, w_lu, w_inv))
    report.check("router.solve_accuracy", max_relative_difference(w_ours, w_lu), "<=", TARGET_W_RELATIVE_DIFF,
                 fmt=".1e", detail=f"max |W_ours - W_LU| / max |W_LU|; inv: {max_relative_difference(w_inv, w_lu):.1e}"
                 f"; float32 LU for scale: {max_relative_difference(float32_lu_solve(gram, cross, ridge), w_lu):.1e}")
    report.check("router.solve_residual_vs_lu", res_ours / res_lu, "<=", TARGET_RESIDUAL_FACTOR, unit="x",
                 detail=f"||Q - (G + lambda I) W||_F / ||Q||_F: ours {res_ours:.2e}, LU {res_lu:.2e}, "
                 f"inv {res_inv:.2e}")


def report_cached_routing(args: argparse.Namespace, report: Report, times: Dict[str, List[float]]) -> None:
    t_ours, t_lu, t_cached = (median(times[k]) for k in ("ours", "lu", "cached"))
    resolve = t_ours + t_cached
    report.check("router.cached_routing_speedup", resolve / t_cached, ">=", TARGET_CACHED_ROUTING, unit="x",
                 fmt=".0f", detail=f"re-solve + route {format_seconds(resolve)} vs cached route "
                 f"{format_seconds(t_cached)} (batch {args.batch}); vs the reference's LU re-solve "
                 f"{(t_lu + t_cached) / t_cached:.0f}x")
