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
one solve <= 1.5x the size of G.

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
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.flags import Parser, add_flag, add_shared_flag
from benchmarks.speed.figures import FigureReport
from benchmarks.speed.timing import (
    Report,
    add_run_options,
    best_ratio,
    describe_device,
    format_seconds,
    median,
    print_header,
    start_run,
    time_side_by_side,
)
from fly_modules import _blocked, _ridge  # private but supported: the kernels and solvers
from fly_modules._validation import Integer, Real
from fly_modules.router import AnalyticRouter

_REPOSITORY = Path(__file__).resolve().parents[2]

STATS_DTYPE = torch.float64
TARGET_UPDATE = 2.5  # amortised update vs the dense float64 update (a CPU's target)
TARGET_UPDATE_VS_FLOAT32 = 3.0  # amortised update vs the official float32 dense update (a GPU's target)
TARGET_SOLVE_VS_LU = 1.8
TARGET_SOLVE_VS_INV = 4.0
TARGET_SOLVE_VS_LU32 = 2.0  # the official code's own solve: float32 LU at every routing (--float32-lu)
TARGET_W_RELATIVE_DIFF = 1e-6  # float64-level agreement (a float32 solve differs by ~cond * 6e-8)
TARGET_RESIDUAL_FACTOR = 10.0  # our relative residual within this factor of LU's
TARGET_CACHED_ROUTING = 100.0
TARGET_PEAK_MEMORY = 1.5  # peak extra memory of one solve, in units of the size of G


# =================================================================================== inputs
def clustered_features(
    n: int, dim: int, experts: int, *, seed: int, classes_per_expert: int = 4, device: str = "cpu"
) -> Tuple[Tensor, Tensor]:
    """ViT-like query features: a clustered Gaussian mixture passed through a final LayerNorm.

    Every sample shares a common direction (CLS tokens of a pretrained ViT are strongly correlated),
    each expert (task) has a centre, each class a sub-centre around it, plus isotropic noise; the
    final ``layer_norm`` gives every sample zero mean and unit variance over its ``dim`` entries
    (``||h|| = sqrt(dim)``, about 27.7 at ``dim=768``), the scale a ViT's final LayerNorm produces.
    Returns float32 features ``(n, dim)`` and the expert id of each sample ``(n,)``, on ``device``
    (drawn on the CPU: the same numbers on every device).
    """
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(dim, generator=generator)
    expert_centres = 0.8 * torch.randn(experts, dim, generator=generator)
    class_centres = expert_centres.repeat_interleave(classes_per_expert, 0)
    class_centres = class_centres + 0.6 * torch.randn(class_centres.shape, generator=generator)
    labels = torch.randint(experts * classes_per_expert, (n,), generator=generator)
    features = shared + class_centres[labels] + 0.7 * torch.randn(n, dim, generator=generator)
    return F.layer_norm(features, (dim,)).to(device), (labels // classes_per_expert).to(device)


# ============================================================ the reference approach, re-implemented
class DenseStatistics:
    """The reference's statistics update: dense ``G += Phi^T Phi`` and ``Q += Phi^T Y`` (here float64)."""

    def __init__(self, projection: Tensor, experts: int) -> None:
        self.projection = projection  # (dim, M), phi = relu(h @ projection)
        width = projection.shape[1]
        self.gram = torch.zeros(width, width, dtype=projection.dtype, device=projection.device)
        self.cross = torch.zeros(width, experts, dtype=projection.dtype, device=projection.device)
        self.experts = experts

    def update(self, features: Tensor, expert_ids: Tensor) -> None:
        phi = torch.relu(features.to(self.projection.dtype) @ self.projection)
        self.gram.addmm_(phi.t(), phi)
        self.cross.addmm_(phi.t(), F.one_hot(expert_ids, self.experts).to(phi.dtype))


def full_symmetric(block_lower: Tensor) -> Tensor:
    """The full symmetric matrix from storage whose lower triangle is valid (for the baselines)."""
    full = torch.tril(block_lower)
    full += torch.tril(block_lower, -1).t()
    return full


def reference_lu_solve(gram: Tensor, cross: Tensor, ridge: float) -> Tensor:
    """``(G + lambda I)^-1 Q`` with a general LU solve (the reference's ``torch.linalg.solve``).

    The system is built with one copy and an in-place diagonal add (cheaper than the reference's
    fresh identity), so the baseline is not handicapped.
    """
    system = gram.clone()
    system.diagonal().add_(ridge)
    return torch.linalg.solve(system, cross)


def reference_inv_solve(gram: Tensor, cross: Tensor, ridge: float) -> Tensor:
    """``inv(G + lambda I) @ Q`` with an explicit float64 inverse."""
    system = gram.clone()
    system.diagonal().add_(ridge)
    return torch.linalg.inv(system) @ cross


# ================================================================================ diagnostics
def largest_eigenvalue(gram: Tensor, *, iterations: int = 60, seed: int = 0) -> float:
    """Largest eigenvalue of a symmetric PSD matrix by power iteration (Rayleigh quotient)."""
    generator = torch.Generator().manual_seed(seed)
    vector = torch.rand(gram.shape[0], 1, generator=generator, dtype=gram.dtype).to(gram.device)
    value = 0.0
    for _ in range(iterations):
        product = gram @ vector
        value = float((vector * product).sum() / (vector * vector).sum())
        vector = product / product.norm()
    return value


def relative_residual(gram: Tensor, cross: Tensor, ridge: float, solution: Tensor) -> float:
    """``||Q - (G + lambda I) W||_F / ||Q||_F`` in float64 (``gram`` full and symmetric)."""
    residual = cross - gram @ solution - ridge * solution
    return float(residual.norm() / cross.norm())


def max_relative_difference(value: Tensor, reference: Tensor) -> float:
    return float((value - reference).abs().max() / reference.abs().max())


# ================================================================================ peak memory
_STATUS_FIELD = re.compile(r"^(VmRSS|VmHWM):\s+(\d+)\s+kB", re.MULTILINE)


def _memory_status_kb() -> Dict[str, int]:
    with open("/proc/self/status") as status:
        return {name: int(value) for name, value in _STATUS_FIELD.findall(status.read())}


def _reset_peak_rss() -> None:
    # Writing 5 to clear_refs resets VmHWM (the peak resident set) to the current VmRSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def memory_child(method: str, stats_file: str, ridge: float) -> None:
    """Runs in a fresh process: load the statistics, pre-touch them, solve once, print the peak.

    Prints one JSON line: the resident set just before the solve, its peak during the solve (after
    resetting the high-water mark) and the size of G.
    """
    # mmap (torch >= 2.1) maps the file rather than reading it; the peak is reset after loading either way.
    mapped = {"mmap": True} if "mmap" in inspect.signature(torch.load).parameters else {}
    state = torch.load(stats_file, weights_only=True, **mapped)
    width, dim = state["expansion.weight"].shape
    experts = state["cross"].shape[1]
    # Library warm-up on a tiny system so one-time LAPACK/allocator set-up is not counted.
    small = torch.eye(8, dtype=STATS_DTYPE) * 2
    torch.linalg.cholesky_ex(small.float())
    torch.linalg.solve(small, small)
    torch.linalg.inv(small)
    if method == "ours":
        router = AnalyticRouter(dim, experts, expansion_dim=width, ridge=ridge, solver="auto")
        router.load_state_dict(state)
        del state
        gram_bytes = router.gram.numel() * router.gram.element_size()
        run = router.solve
    else:
        gram = full_symmetric(state["gram"])
        cross = state["cross"].clone()
        del state
        gram_bytes = gram.numel() * gram.element_size()
        solve = reference_lu_solve if method == "lu" else reference_inv_solve
        run = lambda: solve(gram, cross, ridge)  # noqa: E731
    gc.collect()
    touched = float(router.gram.sum()) if method == "ours" else float(gram.sum())  # pre-touch every page
    _reset_peak_rss()
    before = _memory_status_kb()
    run()
    after = _memory_status_kb()
    print(json.dumps({
        "method": method, "rss_before_kb": before["VmRSS"], "peak_kb": after["VmHWM"], "gram_bytes": gram_bytes,
        "checksum": touched,
    }))


def measure_peak_memory(method: str, stats_file: str, ridge: float, threads: int) -> Dict[str, float]:
    command = [
        sys.executable, "-m", "benchmarks.speed.router", "--memory-child", method, "--stats-file", stats_file,
        "--ridge", repr(ridge), "--threads", str(threads),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=_REPOSITORY)
    if done.returncode != 0:
        raise RuntimeError(f"memory child {method!r} failed ({done.returncode}):\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["extra_bytes"] = (result["peak_kb"] - result["rss_before_kb"]) * 1024
    return result


# ==================================================================================== benches
def bench_update(args: argparse.Namespace, report: Report) -> None:
    """The statistics update, amortised over a whole fold cycle, against the dense per-batch updates.

    One round of ``ours`` is ``cycle`` batches: exactly enough to fill the buffer once, so every round
    pays one fold and its time / ``cycle`` is the amortised cost per batch. The references update per
    batch: ``relu(hR)`` and a dense ``addmm_`` of ``G`` and ``Q``, in float64 (the reference approach
    at our precision) and in float32 (the official code's own precision).
    """
    m, batch = args.expansion_dim, args.batch
    print(f"-- statistics update: batch {batch}, d={args.dim}, M={m}, float64 --", flush=True)
    settings = dict(expansion_dim=m, ridge=args.ridge, seed=args.seed, device=args.device)
    router = AnalyticRouter(args.dim, args.experts, **settings)  # blocked (the default)
    per_batch = AnalyticRouter(args.dim, args.experts, fold_rows=1, **settings)  # every batch folded at once
    rows = _blocked.default_fold_rows(router.expansion_dim, args.device)
    cycle = max(1, rows // batch)
    dense = DenseStatistics(router.expansion.weight.t(), args.experts)
    dense32 = DenseStatistics(router.expansion.weight.t().float(), args.experts)
    features, expert_ids = clustered_features(batch * cycle, args.dim, args.experts, seed=args.seed + 1,
                                              device=args.device)
    batches = [(features[i * batch:(i + 1) * batch], expert_ids[i * batch:(i + 1) * batch]) for i in range(cycle)]
    first, first_ids = batches[0]

    def blocked_cycle() -> None:
        for chunk, ids in batches:
            router.update(chunk, ids)
        router.flush()  # a no-op when the cycle filled the buffer exactly; otherwise the fold is counted

    phi = router.expansion(first)
    phi_block = router.expansion(features[: cycle * batch])
    ids_block = expert_ids[: cycle * batch]
    kernel_gram, kernel_cross = torch.zeros_like(router.gram), torch.zeros_like(router.cross)
    kernel_dense = torch.zeros_like(router.gram)
    times = time_side_by_side(
        {
            "ours": blocked_cycle,
            "per_batch": lambda: per_batch.update(first, first_ids),
            "reference": lambda: dense.update(first, first_ids),
            "reference32": lambda: dense32.update(first, first_ids),
            "fold": lambda: _blocked.add_rows(kernel_gram, kernel_cross, phi_block, ids_block),
            "kernel: block-lower": lambda: _ridge.accumulate_lower_gram(kernel_gram, phi, _ridge.PANEL_ROWS),
            "kernel: dense addmm_": lambda: kernel_dense.addmm_(phi.t(), phi),
        },
        repeats=args.repeats,
        warmup=2,
        synchronize=args.synchronize,
    )
    times["ours"] = [t / cycle for t in times["ours"]]
    ours, ref, ref32 = median(times["ours"]), median(times["reference"]), median(times["reference32"])
    unblocked, fold = median(times["per_batch"]), median(times["fold"])
    k_ours, k_ref = median(times["kernel: block-lower"]), median(times["kernel: dense addmm_"])
    flops = 2.0 * batch * m**2
    # Two targets side by side: >= 2.5x the dense float64 update (set for a CPU) and >= 3x the dense
    # float32 update, the official code's own (set for a GPU). Both are printed on every device.
    report.check(
        "router.update_speedup", ref / ours, ">=", TARGET_UPDATE, unit="x",
        detail=f"dense float64 update {format_seconds(ref)} vs ours {format_seconds(ours)} per batch, amortised over "
        f"a fold of {cycle} batches (median of {args.repeats}; ours {batch / ours:.0f} samples/s, reference "
        f"{batch / ref:.0f}; ratio of the best times {best_ratio(times, 'reference', 'ours')}; the CPU's target)",
    )
    report.check(
        "router.update_vs_float32", ref32 / ours, ">=", TARGET_UPDATE_VS_FLOAT32, unit="x",
        detail=f"dense float32 update (the official code's) {format_seconds(ref32)} vs ours {format_seconds(ours)} "
        f"per batch, amortised (ratio of the best times {best_ratio(times, 'reference32', 'ours')}; the GPU's target)",
    )
    buffer_bytes = router.pending_bytes
    gram_bytes = router.gram.numel() * router.gram.element_size()
    report.info(
        f"blocked update: buffer of {rows} rows ({buffer_bytes / 2**20:.1f} MiB = {buffer_bytes / gram_bytes:.3f}x G's "
        f"{gram_bytes / 2**20:.0f} MiB); one fold of {cycle * batch} rows {format_seconds(fold)} "
        f"({2.0 * cycle * batch * m**2 / fold / 1e9:.1f} dense-equivalent GFLOP/s); amortised {format_seconds(ours)} "
        f"per batch vs {format_seconds(unblocked)} folded every batch (fold_rows=1) -> {unblocked / ours:.2f}x "
        f"from blocking alone"
    )
    report.info(
        f"kernel only (same phi, batch {batch}): dense addmm_ {format_seconds(k_ref)} ({flops / k_ref / 1e9:.1f} "
        f"GFLOP/s) vs block-lower {format_seconds(k_ours)} -> {k_ref / k_ours:.2f}x"
    )
    # The block-lower kernel issues one smaller GEMM per row panel; with every CPU busy elsewhere their thread
    # barriers cost more than the one big dense GEMM's, so show the single-threaded kernel ratio as well.
    threads = torch.get_num_threads()
    if threads > 1 and args.device.type == "cpu":
        torch.set_num_threads(1)
        try:
            single = time_side_by_side(
                {"block": lambda: _ridge.accumulate_lower_gram(kernel_gram, phi, _ridge.PANEL_ROWS),
                 "dense": lambda: kernel_dense.addmm_(phi.t(), phi)},
                repeats=max(3, args.repeats // 2), warmup=1, synchronize=args.synchronize,
            )
        finally:
            torch.set_num_threads(threads)
        s_ours, s_ref = median(single["block"]), median(single["dense"])
        report.info(f"kernel only, 1 thread: dense addmm_ {format_seconds(s_ref)} vs block-lower "
                    f"{format_seconds(s_ours)} -> {s_ref / s_ours:.2f}x")
    # Same statistics: every timed call added the same batches to ours and to the dense float64 reference
    # (ours: the cycle's batches, the reference: the first batch each time), so compare fresh routers.
    check_router = AnalyticRouter(args.dim, args.experts, **settings)
    check_dense = DenseStatistics(check_router.expansion.weight.t(), args.experts)
    for chunk, ids in batches:
        check_router.update(chunk, ids)
        check_dense.update(chunk, ids)
    agree = max_relative_difference(check_router.gram_matrix(), check_dense.gram)
    report.info(f"statistics agree (blocked vs dense float64, {cycle} batches): max |G_ours - G_dense| / max |G| = "
                f"{agree:.1e}, Q: {max_relative_difference(check_router.cross, check_dense.cross):.1e}")
    print(flush=True)


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


def build_statistics(args: argparse.Namespace) -> AnalyticRouter:
    router = AnalyticRouter(args.dim, args.experts, expansion_dim=args.expansion_dim, ridge=args.ridge,
                            seed=args.seed, solver="auto", device=args.device)
    features, expert_ids = clustered_features(args.samples, args.dim, args.experts, seed=args.seed + 2, device=args.device)
    chunk = 512
    for start in range(0, args.samples, chunk):
        router.update(features[start:start + chunk], expert_ids[start:start + chunk])
    return router


def bench_solve(args: argparse.Namespace, report: Report, stats_file: Optional[str] = None) -> None:
    m, ridge = args.expansion_dim, args.ridge
    print(f"-- solve: M={m}, {args.samples} samples of ReLU-expanded clustered features (d={args.dim}, "
          f"T={args.experts}), ridge {ridge:g}, float64 statistics --", flush=True)
    router = build_statistics(args)
    gram = router.gram_matrix()  # full symmetric float64 G for the baselines and the residuals
    cross = router.cross.clone()
    top = largest_eigenvalue(gram, seed=args.seed)
    bound = "exact: lambda_min(G) = 0 since samples < M" if args.samples < m else "upper bound: lambda_min(G) >= 0"
    report.info(f"cond(G + lambda I) ~ {(top + ridge) / ridge:.2e} (lambda_max(G) = {top:.3e} by power "
                f"iteration; {bound}); max diag(G) = {float(gram.diagonal().max()):.3e}")
    mixed = _ridge.solve_mixed(router.gram, router.cross, ridge, panel_rows=_ridge.PANEL_ROWS)
    if mixed is None:
        report.info("our solver path: mixed precision did not converge  <- float64 fallback taken")
    else:
        report.info(f"our solver path: 'mixed', {mixed.refinement_steps} float64 residual products (refinement "
                    f"steps); condition estimate from the float32 factor {mixed.condition:.2e}")

    queries, _ = clustered_features(args.batch, args.dim, args.experts, seed=args.seed + 3, device=args.device)
    # Warm-up on a small system (LAPACK initialisation) so no full-size round has to be discarded.
    small_g, small_q = gram[:256, :256].clone(), cross[:256].clone()
    reference_lu_solve(small_g, small_q, ridge), reference_inv_solve(small_g, small_q, ridge)
    small_system = small_g.clone()
    small_system.diagonal().add_(ridge)
    torch.cholesky_solve(small_q.float(), torch.linalg.cholesky(small_system.float()))

    outputs: Dict[str, Tensor] = {}

    def ours() -> None:
        outputs["ours"] = router.solve()

    def lu() -> None:
        outputs["lu"] = reference_lu_solve(gram, cross, ridge)

    def inv() -> None:
        outputs["inv"] = reference_inv_solve(gram, cross, ridge)

    def cached_route() -> None:
        router(queries)

    # The device rule of solver="auto" (fly_modules/_ridge.py, preferred_solver), checked here: the path it
    # did not choose is timed beside it.
    chosen = _ridge.preferred_solver(args.device, router.expansion_dim)
    other = "cholesky" if chosen == "mixed" else "mixed"

    def other_path() -> None:
        if other == "cholesky":
            outputs["other"] = _ridge.solve_cholesky(router.gram, router.cross, ridge).weights
        else:
            result = _ridge.solve_mixed(router.gram, router.cross, ridge, panel_rows=_ridge.PANEL_ROWS)
            outputs["other"] = result.weights if result is not None else reference_lu_solve(gram, cross, ridge)

    candidates = {"ours": ours, "other": other_path, "lu": lu, "inv": inv, "cached": cached_route}
    if args.float32_lu:  # the official code keeps float32 statistics and LU-solves them at every routing
        gram32, cross32 = gram.float(), cross.float()
        reference_lu_solve(small_g.float(), small_q.float(), ridge)  # float32 LAPACK/cuSOLVER warm-up
        candidates["lu32"] = lambda: reference_lu_solve(gram32, cross32, ridge)
    times = time_side_by_side(
        candidates, repeats=args.solve_repeats, warmup=0, inner={"cached": 10}, synchronize=args.synchronize,
    )
    t_ours, t_lu, t_inv, t_cached = (median(times[k]) for k in ("ours", "lu", "inv", "cached"))
    report.check("router.solve_vs_lu", t_lu / t_ours, ">=", TARGET_SOLVE_VS_LU, unit="x",
                 detail=f"LU {format_seconds(t_lu)} vs ours {format_seconds(t_ours)} (solver_={router.solver_!r}, "
                 f"median of {args.solve_repeats}; ratio of the best times {best_ratio(times, 'lu', 'ours')})")
    report.check("router.solve_vs_inv", t_inv / t_ours, ">=", TARGET_SOLVE_VS_INV, unit="x",
                 detail=f"inv {format_seconds(t_inv)} vs ours {format_seconds(t_ours)} "
                 f"(ratio of the best times {best_ratio(times, 'inv', 'ours')})")
    if args.float32_lu:
        t_lu32 = median(times["lu32"])
        report.check("router.solve_vs_lu32", t_lu32 / t_ours, ">=", TARGET_SOLVE_VS_LU32, unit="x",
                     detail=f"float32 LU (the official code's solve) {format_seconds(t_lu32)} vs ours "
                     f"{format_seconds(t_ours)} (ratio of the best times {best_ratio(times, 'lu32', 'ours')})")

    t_other = median(times["other"])
    verdict = "confirmed" if t_other >= t_ours else "CONTRADICTED: the other path is faster on this device"
    report.info(f"solver rule (auto on {args.device.type}: {chosen!r}): {other!r} {format_seconds(t_other)} vs "
                f"{chosen!r} {format_seconds(t_ours)} -> {t_other / t_ours:.2f}x, rule {verdict}; {other!r} vs LU "
                f"{t_lu / t_other:.2f}x, accuracy {max_relative_difference(outputs['other'], outputs['lu']):.1e}")
    w_ours, w_lu, w_inv = outputs["ours"], outputs["lu"], outputs["inv"]
    res_ours, res_lu, res_inv = (relative_residual(gram, cross, ridge, w) for w in (w_ours, w_lu, w_inv))
    report.check("router.solve_accuracy", max_relative_difference(w_ours, w_lu), "<=", TARGET_W_RELATIVE_DIFF,
                 fmt=".1e", detail=f"max |W_ours - W_LU| / max |W_LU|; inv: {max_relative_difference(w_inv, w_lu):.1e}"
                 f"; float32 LU for scale: {max_relative_difference(_float32_lu(gram, cross, ridge), w_lu):.1e}")
    report.check("router.solve_residual_vs_lu", res_ours / res_lu, "<=", TARGET_RESIDUAL_FACTOR, unit="x",
                 detail=f"||Q - (G + lambda I) W||_F / ||Q||_F: ours {res_ours:.2e}, LU {res_lu:.2e}, "
                 f"inv {res_inv:.2e}")

    resolve = t_ours + t_cached
    report.check("router.cached_routing_speedup", resolve / t_cached, ">=", TARGET_CACHED_ROUTING, unit="x",
                 fmt=".0f", detail=f"re-solve + route {format_seconds(resolve)} vs cached route "
                 f"{format_seconds(t_cached)} (batch {args.batch}); vs the reference's LU re-solve "
                 f"{(t_lu + t_cached) / t_cached:.0f}x")
    if stats_file is not None:  # the statistics for the peak-memory subprocesses
        torch.save(router.state_dict(), stats_file)
    if args.device.type == "cuda" and not args.no_memory:
        bench_memory_cuda(report, router, gram, cross, ridge)
    print(flush=True)


def peak_cuda_memory(run) -> int:  # noqa: ANN001 - a zero-argument callable
    """Bytes allocated on the GPU at the peak of ``run()`` beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def bench_memory_cuda(report: Report, router: AnalyticRouter, gram: Tensor, cross: Tensor, ridge: float) -> None:
    """Peak extra GPU memory of one solve (torch's allocator statistics; the results stay allocated)."""
    gram_bytes = router.gram.numel() * router.gram.element_size()
    extra = {
        "ours": peak_cuda_memory(router.solve),
        "lu": peak_cuda_memory(lambda: reference_lu_solve(gram, cross, ridge)),
        "inv": peak_cuda_memory(lambda: reference_inv_solve(gram, cross, ridge)),
    }
    mib = {method: value / 2**20 for method, value in extra.items()}
    report.check("router.solve_peak_memory", extra["ours"] / gram_bytes, "<=", TARGET_PEAK_MEMORY, unit="x",
                 detail=f"peak extra GPU memory / size of G: ours +{mib['ours']:.0f} MiB, LU +{mib['lu']:.0f} MiB, "
                 f"inv +{mib['inv']:.0f} MiB; G = {gram_bytes / 2**20:.0f} MiB (torch.cuda.max_memory_allocated)")


def bench_memory(args: argparse.Namespace, report: Report, stats_file: str) -> None:
    print(f"-- peak extra memory of one solve: M={args.expansion_dim} --", flush=True)
    peaks = {method: measure_peak_memory(method, stats_file, args.ridge, args.threads)
             for method in ("ours", "lu", "inv")}
    gram_bytes = peaks["ours"]["gram_bytes"]
    ratio = {method: peak["extra_bytes"] / gram_bytes for method, peak in peaks.items()}
    mib = {method: peak["extra_bytes"] / 2**20 for method, peak in peaks.items()}
    report.check("router.solve_peak_memory", ratio["ours"], "<=", TARGET_PEAK_MEMORY, unit="x",
                 detail=f"peak extra memory / size of G: ours +{mib['ours']:.0f} MiB, LU +{mib['lu']:.0f} MiB "
                 f"({ratio['lu']:.2f}x), inv +{mib['inv']:.0f} MiB ({ratio['inv']:.2f}x); "
                 f"G = {gram_bytes / 2**20:.0f} MiB")
    report.info("method: one fresh subprocess per solve; statistics loaded and every page of G pre-touched, "
                "peak RSS reset (/proc/self/clear_refs = 5), extra = VmHWM after the solve - VmRSS before it")


def _float32_lu(gram: Tensor, cross: Tensor, ridge: float) -> Tensor:
    """The reference's own precision (float32 LU), only to show the scale of the accuracy figure."""
    system = gram.float()
    system.diagonal().add_(ridge)
    return torch.linalg.solve(system, cross.float()).double()


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
    parser.add_argument("--stats-file", help=argparse.SUPPRESS)
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
