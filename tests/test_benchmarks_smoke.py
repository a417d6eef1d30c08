"""Smoke tests of the micro-benchmarks: each script runs with --quick and prints every target line.

No timing is asserted (the figures only mean something at full size on a quiet machine); the tests
check that the scripts run from the repository root as documented and report each target.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ROUTER_TARGETS = [
    "router.update_speedup",
    "router.update_vs_float32",
    "router.solve_vs_lu",
    "router.solve_vs_inv",
    "router.solve_accuracy",
    "router.solve_residual_vs_lu",
    "router.cached_routing_speedup",
    "router.solve_peak_memory",
]
ENSEMBLE_TARGETS = ["ensemble.speedup_batch8", "ensemble.speedup_batch32", "ensemble.scores_match"]
TARGET_LINE = re.compile(r"^\[(PASS|FAIL)\] (?P<key>[\w.]+): \S+ \(target (>=|<=) [^)]+\)", re.MULTILINE)


def run_script(name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.speed.{name}", "--quick", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"{name} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def reported_targets(output: str) -> list:
    return [match.group("key") for match in TARGET_LINE.finditer(output)]


def test_bench_router_quick_prints_every_target():
    output = run_script("router", "--threads", "2")
    assert reported_targets(output) == ROUTER_TARGETS, output
    assert re.search(r"cond\(G \+ lambda I\) ~ \S+", output), output
    assert "solver_=" in output and "VmHWM" in output, output
    assert re.search(r"^\d+/8 targets passed", output, re.MULTILINE), output


def test_bench_ensemble_quick_prints_every_target():
    output = run_script("ensemble")
    assert reported_targets(output) == ENSEMBLE_TARGETS, output
    # The batched and the per-sample implementations agree regardless of timing noise.
    assert "[PASS] ensemble.scores_match" in output, output
    assert re.search(r"^\d+/3 targets passed", output, re.MULTILINE), output


def test_bench_router_warm_quick_prints_every_section():
    output = run_script("router_warm", "--threads", "1")
    assert re.search(r"\+\d+ samples: (warm|mixed|cholesky), \d+ steps", output), output
    assert "G's infinity norm: one more column of the first product" in output, output
    assert re.search(r"float32 +one fold .* routes alike", output), output
    table = output.split("\nfold layouts:")[1].split("\n", 1)[1]  # the lines below the section's header
    layouts = re.findall(r"^ +(\S.*?) +(\d+\.\d{3}) s$", table, re.MULTILINE)
    assert len(layouts) == 7 and layouts[0][0] == "row panels of 128 rows (the library's)", output


def test_report_marks_a_missed_target_as_fail():
    code = (
        "import sys; sys.argv = ['x']\n"
        "from benchmarks.speed.timing import Report\n"
        "report = Report(); report.check('demo.ratio', 1.0, '>=', 2.0, unit='x')\n"
        "assert report.summary() == 1\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert TARGET_LINE.search(result.stdout).group(1) == "FAIL", result.stdout
