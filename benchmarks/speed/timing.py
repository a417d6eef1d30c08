"""Timing and reporting helpers shared by the micro-benchmarks (``benchmarks.speed.router``,
``benchmarks.speed.ensemble``).

The benchmark machines are shared, so absolute times are noisy; every target is therefore a *ratio*
of two approaches timed side by side in the same process: the candidates are called in interleaved
rounds (the order rotates every round, so neither side systematically runs first after a pause) and
each side's median over the rounds is compared.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional

import torch

from benchmarks.flags import add_common_flag, add_output_flag
from fly_modules._validation import check_int

__all__ = [
    "available_cpus", "configure_threads", "load_average", "print_header", "time_side_by_side", "median", "best_ratio",
    "format_seconds", "Report", "resolve_device", "describe_device", "synchronizer", "add_run_options", "start_run",
]


def available_cpus() -> int:
    """CPUs this process may run on (the affinity mask, not the host's core count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def configure_threads(threads: Optional[int]) -> int:
    """``torch.set_num_threads`` to ``threads`` (default: every CPU the process may use); returns it."""
    threads = threads or available_cpus()
    torch.set_num_threads(threads)
    return threads


def resolve_device(name: str) -> torch.device:
    """``torch.device(name)``; a one-line error when it is CUDA and no CUDA device is available."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {name}: no CUDA device is available (torch {torch.__version__})")
    return device


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"{device} ({torch.cuda.get_device_name(index)}, CUDA {torch.version.cuda})"
    return str(device)


def synchronizer(device: torch.device) -> Optional[Callable[[], None]]:
    """What to call before reading the clock on ``device``: CUDA kernels run asynchronously."""
    return torch.cuda.synchronize if device.type == "cuda" else None


def add_run_options(parser: argparse.ArgumentParser, *, placed: str) -> None:
    """The options every micro-benchmark takes (``--seed --threads --device --quick --strict --json``);
    ``placed`` names what ``--device`` places, for its help."""
    add_common_flag(parser, "seed", default=0)
    add_common_flag(parser, "threads", default=None, help="torch threads (default: all available CPUs)")
    parser.add_argument("--device", default="cpu", help=f"where {placed} run: cpu or cuda[:N]")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke test (seconds)")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target fails")
    add_output_flag(parser, "--json", "file", default=None, metavar="PATH",
                    help="also write every target and figure to this JSON file")


def start_run(args: argparse.Namespace) -> None:
    """Applies ``--threads`` and ``--device``: ``args.threads`` becomes the torch threads used, ``args.device``
    a ``torch.device`` and ``args.synchronize`` what to call before reading the clock."""
    args.threads = configure_threads(args.threads)
    args.device = resolve_device(args.device)
    args.synchronize = synchronizer(args.device)


def print_header(title: str, settings: Mapping[str, object]) -> None:
    """Title, machine description and the run's settings, one ``key: value`` per line."""
    print(f"== {title} ==")
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}, "
          f"torch threads {torch.get_num_threads()} (CPUs available: {available_cpus()}), {load_average()}")
    for key, value in settings.items():
        print(f"  {key}: {value}")
    warn_if_busy()
    print(flush=True)


def warn_if_busy() -> None:
    """Warn (before the run starts) when other jobs keep the CPUs busy: ratios then depend on how each
    side copes with contention (the many small ops of a per-sample loop suffer most with 2+ threads)."""
    try:
        one_minute = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not available
        return
    if one_minute > available_cpus() - 0.5:
        print(f"  WARNING: the machine is busy (1-minute load {one_minute:.2f} on {available_cpus()} CPUs): "
              f"multi-threaded timings are disturbed; compare with --threads 1 or rerun when it is idle")


def load_average() -> str:
    """The host's 1/5/15-minute load averages (other jobs on a shared machine skew absolute times)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:  # pragma: no cover - not available
        return "load average unavailable"
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f}"


def median(values: List[float]) -> float:
    return float(statistics.median(values))


def best_ratio(times: Mapping[str, List[float]], slower: str, faster: str) -> str:
    """``min(times[slower]) / min(times[faster])`` formatted: the ratio on the least disturbed rounds.

    Contention on a shared machine only ever adds time, so the best rounds approximate a quiet
    machine; the targets themselves use the medians.
    """
    return f"{min(times[slower]) / min(times[faster]):.2f}x"


def time_side_by_side(
    candidates: Mapping[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int = 1,
    inner: Optional[Mapping[str, int]] = None,
    synchronize: Optional[Callable[[], None]] = None,
) -> Dict[str, List[float]]:
    """Seconds per call of each candidate, measured in ``repeats`` interleaved rounds.

    Args:
        candidates: name -> zero-argument callable.
        repeats: measured rounds; each round calls every candidate once (``inner[name]`` times in a
            row for fast candidates, reporting the mean of those calls).
        warmup: unmeasured rounds run first (library initialisation, allocator warm-up).
        inner: calls per round for each name (default 1).
        synchronize: called before starting and before stopping the clock (``torch.cuda.synchronize``
            on a GPU, so each timing covers the work it queued).

    Returns:
        name -> list of ``repeats`` per-call times in seconds (take the median).
    """
    repeats = check_int(repeats, "repeats", caller="time_side_by_side", minimum=1)
    names = list(candidates)
    inner = dict(inner or {})
    times: Dict[str, List[float]] = {name: [] for name in names}
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            calls = inner.get(name, 1)
            fn = candidates[name]
            if synchronize is not None:
                synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if synchronize is not None:
                synchronize()
            elapsed = (time.perf_counter() - start) / calls
            if round_index >= warmup:
                times[name].append(elapsed)
    return times


@dataclass
class Report:
    """Collects target checks and prints one ``[PASS]``/``[FAIL]`` line per target.

    Every target line has the form ``[PASS] <key>: <value> (target <op> <bound>) -- <detail>``, so a
    test or a log scraper can find each target by its key.
    """

    results: List[bool] = field(default_factory=list)

    def check(self, key: str, value: float, op: str, bound: float, *, unit: str = "", fmt: str = ".2f",
              detail: str = "") -> bool:
        if op == ">=":
            passed = value >= bound
        elif op == "<=":
            passed = value <= bound
        else:
            raise ValueError(f"Report.check: op must be '>=' or '<=', got {op!r}")
        self.results.append(passed)
        status = "PASS" if passed else "FAIL"
        text = f"[{status}] {key}: {value:{fmt}}{unit} (target {op} {bound:{fmt}}{unit})"
        if detail:
            text += f" -- {detail}"
        print(text, flush=True)
        return passed

    @staticmethod
    def info(text: str) -> None:
        print(f"       {text}", flush=True)

    def summary(self) -> int:
        """Prints ``N/M targets passed``; returns the number of failed targets."""
        failed = self.results.count(False)
        passed = len(self.results) - failed
        print(f"\n{passed}/{len(self.results)} targets passed ({load_average()} at the end, this run included)",
              flush=True)
        return failed


def format_seconds(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"

