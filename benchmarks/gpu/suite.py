#!/usr/bin/env python
"""Everything to measure on a GPU, in one command: CUDA tests, kernel benchmarks, a GPU-scale proxy
and the end-to-end comparison with the official code, each stage in its own process and time limit.

    python -m benchmarks.gpu.suite --output OUT [--reference-repo PATH]    # one H100: at most 8 minutes
    python -m benchmarks.gpu.suite --device cpu --tiny --output /tmp/gpu_tiny   # every stage at toy sizes

Stages, in order (docs/gpu.md): ``environment`` (versions, device), ``cuda_tests`` (``pytest -m cuda``),
``kernels`` (``benchmarks.speed.router`` and ``benchmarks.speed.ensemble``), ``proxy`` (pretrain a larger
backbone on the proxy's upstream classes, then DualPrompt and HiDe-Prompt x every variant), ``vs_reference``
(``benchmarks.speed.vs_reference``, with ``--reference-repo``). A stage that fails, crashes or runs out of
time is recorded with its error and output, and the next one still runs; each stage's JSON and ``summary.json``
are rewritten as soon as anything is known, so a run killed from outside still leaves what finished.
At most :data:`OUTPUT_FILES` (8 files) are written to ``--output``; scratch files go to a temporary folder.
Exit status: 0 when every stage ran (targets may still fail), 1 when a stage crashed or timed out, 2 for
usage errors.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from benchmarks.flags import Parser, add_flag, add_input_flag, add_output_flag
from benchmarks.gpu.children import (
    REPO,
    TAIL_CHARACTERS,
    Interrupted,
    child_status,
    child_summary,
    raise_interrupted,
    run_child,
)
from benchmarks.gpu.records import load_json, now, parse_junit, parse_pytest_lines, scrape_targets, write_json
from fly_modules._validation import Real

STAGES = ("environment", "cuda_tests", "kernels", "proxy", "vs_reference")
#: Seconds per stage on one H100 (they sum to TOTAL_BUDGET); the last stage also gets what the others left.
STAGE_BUDGETS = {"environment": 10, "cuda_tests": 60, "kernels": 110, "proxy": 240, "vs_reference": 60}
TOTAL_BUDGET = 480
KERNEL_ENSEMBLE_RESERVE = 35  # seconds of the kernels stage kept for benchmarks.speed.ensemble
PROXY_SWEEP_RESERVE = 110  # seconds kept for the sweep (H100: 45 s DualPrompt, 54 s HiDe-Prompt on the proxy stream)
MIN_STAGE_SECONDS = 10  # a stage with less time left is skipped
#: Everything written to --output: kept to 8 files, what a short-lived remote GPU machine typically returns.
OUTPUT_FILES = {
    "summary": "summary.json", "cuda_tests": "cuda_tests.json", "kernels": "kernels.json", "proxy": "proxy.json",
    "weights": "proxy_vit_gpu.safetensors", "table_json": "proxy_table.json", "table_md": "proxy_table.md",
    "vs_reference": "vs_reference.json",
}
#: cuBLAS reads it when it starts; the CUDA tests and the pretraining use deterministic algorithms.
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


@dataclass(frozen=True)
class Target:
    """A goal of the GPU run: the figure ``key`` of ``stage`` compared with ``bound`` (``op``: >= or <=)."""

    stage: str
    key: str
    op: str
    bound: float
    unit: str = "x"

    def evaluate(self, value: Optional[float], applies: bool, source: str) -> Dict[str, Any]:
        passed = None if value is None else (value >= self.bound if self.op == ">=" else value <= self.bound)
        return {"stage": self.stage, "key": self.key, "value": value, "op": self.op, "bound": self.bound,
                "unit": self.unit, "passed": bool(passed) if passed is not None else False, "applies": applies,
                "source": source, **({"missing": True} if value is None else {})}


# The targets on the GPU, side by side with the official approach re-implemented (bench_*.py).
CUDA_TESTS_TARGET = Target("cuda_tests", "cuda_tests.failed_errors_or_skipped", "<=", 0, unit="")
KERNEL_TARGETS = (
    Target("kernels", "router.update_vs_float32", ">=", 3.0),  # M = 10,000, batch 64, amortised, vs float32 addmm
    Target("kernels", "router.solve_vs_lu32", ">=", 2.0),  # vs the float32 LU at every routing
    Target("kernels", "ensemble.speedup_batch{large_batch}", ">=", 10.0),  # vs the per-sample loop
)


# -------------------------------------------------------------------------------------------- suite
class Suite:
    """Runs the stages in order within the total budget and keeps the output folder up to date."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.output = Path(args.output)
        self.output.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix="gpu_suite_"))
        self.cuda = args.device.startswith("cuda")
        self.gpu_targets_apply = self.cuda and not args.tiny
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.summary: Dict[str, Any] = {
            "suite": "benchmarks/gpu/suite.py", "arguments": sys.argv[1:], "started": now(), "finished": None,
            "device": args.device, "tiny": args.tiny, "budget_seconds": args.budget, "environment": None,
            "stages": {name: {"status": "pending" if name in args.stages else "not requested"} for name in STAGES},
            "targets": [], "files": [],
        }
        self.records: Dict[str, Dict[str, Any]] = {}

    # ------------------------------------------------------------------------------- bookkeeping
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def python(self, *arguments: str) -> List[str]:
        return [sys.executable, *arguments]

    def child_stage(self, name: str, *extra: str) -> List[str]:
        """This script, running one stage's body in a fresh process."""
        command = self.python("-m", "benchmarks.gpu.suite", "--run-stage", name, "--output", str(self.output),
                              "--workdir", str(self.workdir / name), "--device", self.args.device)
        return command + (["--tiny"] if self.args.tiny else []) + list(extra)

    def write_stage(self, name: str, record: Dict[str, Any]) -> None:
        self.records[name] = record
        if name in OUTPUT_FILES:
            write_json(self.output / OUTPUT_FILES[name], record)
        self.summary["stages"][name] = {key: record.get(key) for key in ("status", "seconds", "limit_seconds",
                                                                         "reason", "headline") if key in record}
        self.write_summary()

    def write_summary(self) -> None:
        self.summary["elapsed_seconds"] = time.monotonic() - self.started
        self.summary["files"] = [{"name": path.name, "bytes": path.stat().st_size} for path in
                                 sorted(self.output.iterdir()) if path.is_file() and not path.name.startswith(".")]
        targets = [t for t in self.summary["targets"] if t["applies"]]
        self.summary["all_targets_passed"] = all(t["passed"] for t in targets) if targets else None
        write_json(self.output / OUTPUT_FILES["summary"], self.summary)

    def add_targets(self, targets: Sequence[Dict[str, Any]]) -> None:
        self.summary["targets"].extend(targets)

    # ------------------------------------------------------------------------------------ running
    def run(self) -> int:
        self.write_summary()
        try:
            for name in STAGES:
                if name in self.args.stages:
                    self.run_stage(name)
        except Interrupted as signal_name:
            self.summary["interrupted"] = str(signal_name)
            print(f"!! interrupted ({signal_name}); results so far are in {self.output}", flush=True)
        finally:
            self.summary["finished"] = now()
            self.write_summary()
            if not self.args.keep_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
        self.print_summary()
        crashed = any(stage.get("status") in ("error", "timeout") for stage in self.summary["stages"].values())
        return 1 if crashed or "interrupted" in self.summary else 0

    def run_stage(self, name: str) -> None:
        # A smaller --budget shrinks every stage in proportion, so each still gets its share, but never below
        # the minimum that would skip it (the environment stage's 10 s would otherwise be skipped at once).
        budget = max(STAGE_BUDGETS[name] * min(1.0, self.args.budget / TOTAL_BUDGET), MIN_STAGE_SECONDS)
        limit = self.remaining() if name == STAGES[-1] else min(budget, self.remaining())
        record: Dict[str, Any] = {"stage": name, "started": now(), "limit_seconds": round(limit, 1)}
        if limit < MIN_STAGE_SECONDS:
            record.update(status="skipped", reason=f"{max(limit, 0):.0f} s of the {self.args.budget:.0f} s budget left")
            self.write_stage(name, record)
            return
        print(f"\n======== stage {name} (limit {limit:.0f} s; {self.remaining():.0f} s of the budget left) ========",
              flush=True)
        record["status"] = "running"
        self.write_stage(name, record)
        started = time.monotonic()
        try:
            getattr(self, f"stage_{name}")(record, limit)
        except Interrupted:
            record.update(status="interrupted", seconds=time.monotonic() - started)
            self.write_stage(name, record)
            raise
        except Exception as error:  # the stage is recorded as an error; the next stage still runs
            record.update(status="error", reason=f"{type(error).__name__}: {error}",
                          traceback=traceback.format_exc()[-TAIL_CHARACTERS:])
        record["seconds"] = round(time.monotonic() - started, 1)
        print(f"-------- stage {name}: {record['status']} in {record['seconds']:.0f} s"
              + (f" ({record['reason']})" if record.get("reason") else ""), flush=True)
        self.write_stage(name, record)

    # ------------------------------------------------------------------------------------- stages
    def stage_environment(self, record: Dict[str, Any], limit: float) -> None:
        child = run_child(self.child_stage("environment"), limit=limit)
        record["children"] = [child_summary(child)]
        environment = load_json(self.workdir / "environment" / "result.json")
        self.summary["environment"] = environment
        record["status"] = child_status([child]) or ("passed" if environment else "error")
        if environment:
            record["headline"] = environment.get("headline")

    def stage_cuda_tests(self, record: Dict[str, Any], limit: float) -> None:
        files = sorted(os.path.relpath(path, REPO) for path in glob.glob(str(REPO / "tests" / "test_cuda*.py")))
        junit = self.workdir / "cuda_tests" / "junit.xml"
        junit.parent.mkdir(parents=True, exist_ok=True)
        child = run_child(self.python("-m", "pytest", "-m", "cuda", "-v", "-p", "no:cacheprovider",
                                      f"--junitxml={junit}", *files), limit=limit, env=DETERMINISTIC_ENV)
        record["children"] = [child_summary(child)]
        result = parse_junit(junit) or parse_pytest_lines(child["output"])
        record["result"] = result
        counts = result["counts"]
        bad = counts["failure"] + counts["error"] + counts["skipped"]
        record["headline"] = ", ".join(f"{value} {kind}" for kind, value in counts.items())
        target = CUDA_TESTS_TARGET.evaluate(None if child["timed_out"] else float(bad), self.cuda, "pytest -m cuda")
        record["targets"] = [target]
        self.add_targets([target])
        if child["timed_out"]:
            record["status"] = "timeout"
        elif child["returncode"] not in (0, 1) or sum(counts.values()) == 0:
            record["status"] = "error"  # 1 is "some tests failed"; anything else means pytest itself failed
        elif counts["failure"] or counts["error"] or (self.cuda and counts["skipped"]):
            record["status"] = "failed"
        else:
            record["status"] = "passed"

    def stage_kernels(self, record: Dict[str, Any], limit: float) -> None:
        folder = self.workdir / "kernels"
        folder.mkdir(parents=True, exist_ok=True)
        quick = ["--quick", "--threads", "1"] if self.args.tiny else []
        router_command = self.python("-m", "benchmarks.speed.router", "--device", self.args.device, "--float32-lu",
                                     "--json", str(folder / "router.json"), *quick)
        router_command += ["--no-memory"] if not self.cuda else ["--solve-repeats", "7"]
        ensemble_command = self.python("-m", "benchmarks.speed.ensemble", "--device", self.args.device,
                                       "--json", str(folder / "ensemble.json"), *quick)
        started = time.monotonic()
        children = [run_child(router_command, limit=max(limit - KERNEL_ENSEMBLE_RESERVE, MIN_STAGE_SECONDS))]
        children.append(run_child(ensemble_command, limit=max(limit - (time.monotonic() - started), 1.0)))
        record["children"] = [child_summary(child) for child in children]
        figures = {"router": load_json(folder / "router.json"), "ensemble": load_json(folder / "ensemble.json")}
        record["result"] = figures
        values = {t["key"]: t["value"] for document in figures.values() if document for t in document["targets"]}
        large_batch = (figures["ensemble"] or {}).get("settings", {}).get("large_batch", "256")
        targets = []
        for target in KERNEL_TARGETS:
            key = target.key.format(large_batch=large_batch)
            targets.append(Target(target.stage, key, target.op, target.bound, target.unit).evaluate(
                values.get(key), self.gpu_targets_apply, "benchmarks.speed.router" if key.startswith("router") else
                "benchmarks.speed.ensemble"))
        record["targets"] = targets
        self.add_targets(targets)
        record["headline"] = ", ".join(f"{t['key']} {t['value']:.2f}x" for t in targets if t["value"] is not None)
        failed = any(not t["passed"] for t in targets) and self.gpu_targets_apply
        record["status"] = child_status(children) or ("failed" if failed else "passed")

    def stage_proxy(self, record: Dict[str, Any], limit: float) -> None:
        result_path = self.workdir / "proxy" / "result.json"

        def refresh() -> None:  # the child's partial result, as soon as it exists
            partial = load_json(result_path)
            if partial is not None and partial != record.get("result"):
                record["result"] = partial
                self.write_stage("proxy", record)

        # The child stops starting work a little before the limit, so that it can still save its results.
        child = run_child(self.child_stage("proxy", "--budget-seconds", f"{max(limit - 10, 1):.0f}"), limit=limit,
                          env=DETERMINISTIC_ENV, on_poll=refresh)
        record["children"] = [child_summary(child)]
        record["result"] = load_json(result_path)
        result = record["result"] or {}
        pretraining, sweep = result.get("pretraining") or {}, result.get("sweep") or {}
        unfinished = [m for m, v in sweep.get("methods", {}).items() if v.get("status") != "finished"]
        nan = float("nan")
        record["headline"] = (
            f"pretraining {pretraining.get('wall_seconds', nan):.1f} s ("
            f"{pretraining.get('training', {}).get('epochs_completed', 0)} epochs, "
            f"{pretraining.get('images_per_second') or nan:.0f} images/s, "
            f"{pretraining.get('achieved_tflops') or nan:.1f} TFLOP/s, upstream accuracy "
            f"{100 * (pretraining.get('upstream_test_accuracy') or nan):.1f}%), sweep {sweep.get('seconds', nan):.1f} s, "
            f"finished: {', '.join(m for m in sweep.get('methods', {}) if m not in unfinished) or 'none'}")
        status = child_status([child])
        if status is None and (not sweep or unfinished):
            status, record["reason"] = "failed", f"sweep methods not finished: {unfinished or 'no sweep'}"
        record["status"] = status or "passed"

    def stage_vs_reference(self, record: Dict[str, Any], limit: float) -> None:
        script = REPO / "benchmarks" / "speed" / "vs_reference.py"
        if self.args.reference_repo is None:
            record.update(status="skipped", reason="no --reference-repo (a checkout of AnAppleCore/FlyGCL)")
            return
        if not script.exists():
            record.update(status="skipped", reason="benchmarks/speed/vs_reference.py is not in this checkout")
            return
        folder = self.workdir / "vs_reference"
        folder.mkdir(parents=True, exist_ok=True)
        if self.args.tiny:
            flags = ["--device", self.args.device, "--quick"]
        else:  # ViT-B/16 with fp16 autocast, as the paper's runs; fewer rounds and batches to fit the budget
            # (blocks of 4 stream batches, not the default 16 of one GPU fold: each block still ends folded)
            flags = ["--device", "cuda", "--vit", "base", "--amp", "--rounds", "3", "--eval-batches", "10",
                     "--block-batches", "4"]
        started = time.monotonic()
        children, figures = [], {}
        for method in ("dualprompt", "mvp"):  # one process each: a timeout keeps the first method's figures
            left = limit - (time.monotonic() - started)
            if left < MIN_STAGE_SECONDS:
                figures[method] = {"skipped": f"{max(left, 0):.0f} s of the stage left"}
                continue
            output = folder / f"{method}.json"
            children.append(run_child(self.python("-m", "benchmarks.speed.vs_reference", "--reference-repo", self.args.reference_repo,
                                                  "--methods", method, "--json", str(output), *flags), limit=left))
            figures[method] = load_json(output)
        record["children"] = [child_summary(child) for child in children]
        record["result"] = figures
        targets = [dict(t, stage="vs_reference", method=child["command"][child["command"].index("--methods") + 1],
                        applies=self.gpu_targets_apply, source="benchmarks.speed.vs_reference")
                   for child in children for t in scrape_targets(child["output"])]
        record["targets"] = targets
        self.add_targets(targets)
        record["headline"] = ", ".join(f"{t['key']} {t['value']:g}{t['unit']}" for t in targets)
        skipped = [m for m, v in figures.items() if isinstance(v, dict) and "skipped" in v]
        status = child_status(children)
        if status is None and skipped:
            status, record["reason"] = "failed", f"not run for lack of time: {skipped}"
        record["status"] = status or ("failed" if any(not t["passed"] for t in targets) and self.gpu_targets_apply
                                      else "passed")

    # ------------------------------------------------------------------------------------ summary
    def print_summary(self) -> None:
        environment = self.summary.get("environment") or {}
        print(f"\n======== GPU suite summary: {environment.get('headline', self.args.device)} ========")
        for name, stage in self.summary["stages"].items():
            seconds = stage.get("seconds")
            timing = f"{seconds:6.0f} s of {stage.get('limit_seconds', 0):4.0f}" if seconds is not None else " " * 14
            detail = stage.get("reason") or stage.get("headline") or ""
            print(f"  {name:<13} {stage.get('status', ''):<13} {timing}  {detail}")
        if self.summary["targets"]:
            print("targets" + ("" if self.gpu_targets_apply else " (set for a GPU at full size: informational here)")
                  + ":")
        for target in self.summary["targets"]:
            mark = ("PASS" if target["passed"] else "FAIL") if target["applies"] else "info"
            value = "missing" if target["value"] is None else f"{target['value']:.3g}{target['unit']}"
            print(f"  [{mark}] {target['key']}: {value} (target {target['op']} {target['bound']:g}"
                  f"{target['unit']})")
        print(f"files in {self.output}: " + ", ".join(f"{f['name']} ({f['bytes'] / 1024:.0f} KiB)"
                                                      for f in self.summary["files"]), flush=True)


# ------------------------------------------------------------------------------- stage bodies (children)
def environment_body() -> Dict[str, Any]:
    """Versions, the device and the repository commit."""
    from importlib import metadata

    import torch

    def version(package: str) -> Optional[str]:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    def command_output(command: Sequence[str]) -> Optional[str]:
        try:
            done = subprocess.run(list(command), capture_output=True, text=True, timeout=20, cwd=REPO)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    info: Dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "packages": {name: version(name) for name in ("fly-modules", "timm", "numpy", "scipy", "safetensors")},
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "cuda_available": torch.cuda.is_available(),
        "commit": command_output(["git", "rev-parse", "HEAD"]),
        "uncommitted_changes": bool(command_output(["git", "status", "--porcelain"])),
    }
    headline = f"torch {torch.__version__}"
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": properties.name, "capability": f"{properties.major}.{properties.minor}",
                       "memory_gib": round(properties.total_memory / 2**30, 1),
                       "multiprocessors": properties.multi_processor_count, "count": torch.cuda.device_count(),
                       "driver": command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])}
        headline = (f"{properties.name}, {headline}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
                    f", driver {info['gpu']['driver']}")
    info["headline"] = f"{headline}, timm {info['packages']['timm']}"
    return info


def proxy_body(args: argparse.Namespace, workdir: Path) -> None:
    """Pretrain the GPU-scale backbone into --output, then the sweep; the result file after each."""
    import torch

    from benchmarks.gpu import proxy as _gpu_proxy

    started = time.perf_counter()
    if args.tiny:  # toy sizes: more threads only contend (a CI machine has 2 cores); the GPU run uses them all
        torch.set_num_threads(1)
    scale = _gpu_proxy.TINY_SCALE if args.tiny else _gpu_proxy.GPU_SCALE
    device = torch.device(args.device)
    output = Path(args.output)
    result: Dict[str, Any] = {"scale": "tiny" if args.tiny else "gpu", "budget_seconds": args.budget_seconds,
                              "planned_pretraining_pflop": _gpu_proxy.planned_flops(scale) / 1e15}
    weights = output / OUTPUT_FILES["weights"]
    pretrain_budget = max(args.budget_seconds - PROXY_SWEEP_RESERVE, 0.5 * args.budget_seconds)
    result["pretraining"] = _gpu_proxy.pretrain(scale, device=device, output=weights, budget_seconds=pretrain_budget)
    print(f"proxy: pretraining took {result['pretraining']['wall_seconds']:.1f} s "
          f"({result['pretraining']['train_seconds']:.1f} s training), upstream test accuracy "
          f"{100 * result['pretraining']['upstream_test_accuracy']:.2f}%", flush=True)
    write_json(workdir / "result.json", result)
    sweep_budget = args.budget_seconds - (time.perf_counter() - started)
    result["sweep"] = _gpu_proxy.sweep(scale, weights, device=device, workdir=workdir / "sweep",
                                       budget_seconds=sweep_budget)
    for name, key in (("table.json", "table_json"), ("table.md", "table_md")):
        if (workdir / "sweep" / name).exists():
            shutil.copyfile(workdir / "sweep" / name, output / OUTPUT_FILES[key])
    print(f"proxy: pretraining {result['pretraining']['wall_seconds']:.1f} s, sweep {result['sweep']['seconds']:.1f} s",
          flush=True)
    write_json(workdir / "result.json", result)


def run_stage_body(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.run_stage == "environment":
        write_json(workdir / "result.json", environment_body())
    else:
        proxy_body(args, workdir)
    return 0


# --------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_output_flag(parser, "--output", "folder", default=None, required=True,
                    help=f"folder for the {len(OUTPUT_FILES)} result files",
                    contents={name: "file" for name in OUTPUT_FILES.values()})
    parser.add_argument("--device", default="cuda", help="cuda (the GPU run) or cpu (with --tiny: the CI check)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: every stage end to end in seconds")
    add_input_flag(parser, "--reference-repo", "folder", convert=str, default=None,
                        help="a checkout of AnAppleCore/FlyGCL for the vs_reference stage (skipped without it)")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help="comma-separated stages to run, from " + ", ".join(STAGES) + " (environment always runs)")
    add_flag(parser, "--budget", Real(above=0), default=TOTAL_BUDGET, help="seconds for all stages together")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the scratch folder (its path is printed)")
    parser.add_argument("--run-stage", choices=("environment", "proxy"), help=argparse.SUPPRESS)
    add_output_flag(parser, "--workdir", "folder", default=None, help=argparse.SUPPRESS)
    add_flag(parser, "--budget-seconds", Real(minimum=0), default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stages = [name.strip() for name in args.stages.split(",") if name.strip()]
    unknown = [name for name in stages if name not in STAGES]
    if unknown:
        parser.error(f"--stages: expected names from {', '.join(STAGES)}, found {', '.join(unknown)}")
    args.stages = ["environment", *(name for name in stages if name != "environment")]
    if not args.device.startswith(("cuda", "cpu")):
        parser.error(f"--device: expected cuda or cpu, found {args.device!r}")
    if args.reference_repo is not None and not os.path.isdir(args.reference_repo):
        parser.error(f"--reference-repo: expected a folder, found {args.reference_repo!r}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.run_stage:
        return run_stage_body(args)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"gpu_suite: --device {args.device}, but torch {torch.__version__} sees no CUDA device; "
                  f"use --device cpu --tiny for the CPU check", file=sys.stderr)
            return 2
    if args.reference_repo is not None:
        args.reference_repo = os.path.abspath(args.reference_repo)
    signal.signal(signal.SIGTERM, raise_interrupted)
    signal.signal(signal.SIGINT, raise_interrupted)
    suite = Suite(args)
    print(f"gpu_suite: stages {', '.join(args.stages)}; budget {args.budget:.0f} s; results in {suite.output}; "
          f"scratch in {suite.workdir}", flush=True)
    return suite.run()


if __name__ == "__main__":
    sys.exit(main())
