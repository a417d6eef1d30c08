"""Peak extra memory of one router solve against the reference's LU and inverse.

On a CPU each solve runs in a fresh subprocess (``python -m benchmarks.speed.router --memory-child``) that
loads the statistics, pre-touches them, resets the peak resident set and solves once; on a GPU torch's
allocator statistics are read in process.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict

import torch
from torch import Tensor

from benchmarks.speed.router_baselines import full_symmetric, reference_inv_solve, reference_lu_solve
from benchmarks.speed.timing import Report
from fly_modules.router import AnalyticRouter

_REPOSITORY = Path(__file__).resolve().parents[2]

STATS_DTYPE = torch.float64
TARGET_PEAK_MEMORY = 1.5  # peak extra memory of one solve, in units of the size of G


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
