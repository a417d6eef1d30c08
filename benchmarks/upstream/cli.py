"""``python -m benchmarks.upstream --checkouts DIR [--only NAME ...] [--python PATH] [--json FILE]
[--markdown FILE] [--threads N]``

Runs every harness (or those named: a harness name or a checkout folder name) in its own process,
one after the other, with the checkout ``DIR/<folder>``; prints a progress line per harness, the
table of ``docs/adapters.md`` and each harness's check statuses. A missing checkout makes its rows
"skipped". The harnesses run under ``--python`` (default: this interpreter), which must have torch, timm
and fly-modules installed: the installed fly-modules is the one checked, never this checkout's sources.
Exit status 0 when no check failed, 1 when a check failed or a harness crashed, 2 (one line on stderr)
for a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from benchmarks.core.results import write_text_atomic
from benchmarks.flags import add_common_flag, add_input_flag, add_output_flag
from benchmarks.requirements import UPSTREAM_CHILD
from benchmarks.upstream.registry import HARNESSES, REPOSITORIES, checkout_commit
from benchmarks.upstream.table import markdown_table, status_line, summarise

ROOT = Path(__file__).resolve().parents[2]  # the directory holding benchmarks/ (the child's -m needs it)


class UsageError(Exception):
    """A command-line value is invalid (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    folders = ", ".join(REPOSITORIES)
    parser = _Parser(prog="python -m benchmarks.upstream", description=__doc__.split("\n\n")[1],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog=f"checkout folders: {folders}; harnesses: {', '.join(HARNESSES)}")
    add_input_flag(parser, "--checkouts", "folder", required=True, help="folder holding one checkout per repository")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="harness or checkout folder names")
    add_input_flag(parser, "--python", "file", default=Path(sys.executable),
                        help="the interpreter the harnesses run under (your environment's python; default this one)")
    add_output_flag(parser, "--json", "file", default=None, help="write every harness's rows and metadata here")
    add_output_flag(parser, "--markdown", "file", default=None,
                    help="write the table, each harness's statuses and the versions here (for docs/results/)")
    add_common_flag(parser, "threads", default=1, help="torch threads per harness")
    add_common_flag(parser, "seed", default=0, help="seed of the models and the generated stream")
    parser.add_argument("--verbose", action="store_true", help="show each harness's output and the upstream code's")
    return parser


def resolve(args: argparse.Namespace) -> List[str]:
    """The harnesses to run, in table order; checks every argument before anything runs."""
    if not args.checkouts.is_dir():
        raise UsageError(f"--checkouts: expected a folder holding the upstream checkouts, found no folder at "
                         f"{args.checkouts}")
    for option in ("json", "markdown"):
        path = getattr(args, option)
        if path is not None and not path.parent.is_dir():
            raise UsageError(f"--{option}: expected a file in an existing folder, found no folder {path.parent}")
    if args.only is None:
        return list(HARNESSES)
    unknown = [name for name in args.only if name not in HARNESSES and name not in REPOSITORIES]
    if unknown:
        raise UsageError(f"--only: unknown name {unknown[0]!r}; choose from harnesses {', '.join(HARNESSES)} or "
                         f"checkout folders {', '.join(REPOSITORIES)}")
    return [name for name, folder in HARNESSES.items() if name in args.only or folder in args.only]


def run_harness(name: str, checkout: Path, args: argparse.Namespace) -> Dict[str, Any]:
    """One harness in a fresh process; a crash (no result file) becomes a "crashed" result."""
    if not checkout.is_dir():
        return dict(name=name, outcome="skipped", detail=f"skipped (no checkout at {checkout})", meta={}, checks=[])
    with tempfile.TemporaryDirectory(prefix="fly_upstream_result_") as folder:
        output = Path(folder) / "result.json"
        command = [str(args.python), "-m", "benchmarks.upstream.child", name, "--checkout", str(checkout.resolve()),
                   "--json", str(output), "--threads", str(args.threads), "--seed", str(args.seed)]
        if args.verbose:
            command.append("--verbose")
        process = subprocess.run(command, cwd=benchmarks_only(Path(folder)), env=child_env(args.threads), text=True,
                                 capture_output=not args.verbose)
        if process.returncode == 0 and output.is_file():
            result = json.loads(output.read_text())
            return dict(name=name, outcome="ran", detail="", title=result["name"], meta=result["meta"],
                        checks=result["checks"])
    last = (process.stderr or "").strip().splitlines()[-1:] if not args.verbose else []
    reason = last[0] if last else f"exit status {process.returncode}"
    return dict(name=name, outcome="crashed", detail=f"crashed: {reason}"[:300],
                meta=dict(upstream_commit=checkout_commit(checkout)), checks=[])


def benchmarks_only(folder: Path) -> Path:
    """``folder`` holding a link to this checkout's ``benchmarks/`` and nothing else: the child's working
    folder, so that ``-m`` finds the harnesses while fly_modules comes from the interpreter's installation
    (this checkout's ``fly_modules/`` would shadow it, and it lacks ``fly_modules.adapters``)."""
    link = folder / "benchmarks"
    if not link.exists():
        link.symlink_to(ROOT / "benchmarks", target_is_directory=True)
    return folder


def child_env(threads: int) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return dict(env, OMP_NUM_THREADS=str(threads), PYTHONDONTWRITEBYTECODE="1", **{UPSTREAM_CHILD: "1"})


# Run by --python's interpreter (any Python >= 3.8): what the harnesses need, and its versions.
_PROBE = """import json, platform, sys
import torch, timm, fly_modules, fly_modules.adapters
print(json.dumps(dict(python=platform.python_version(), torch=torch.__version__, timm=timm.__version__,
                     fly_modules=getattr(fly_modules, "__version__", "unknown"), platform=platform.platform())))
"""


def environment(python: Path) -> Dict[str, Any]:
    """The versions ``python`` runs the harnesses with; a UsageError (one line) when it cannot run them."""
    with tempfile.TemporaryDirectory(prefix="fly_upstream_probe_") as folder:
        try:
            done = subprocess.run([str(python), "-c", _PROBE], cwd=folder, env=child_env(1), capture_output=True,
                                  text=True, timeout=300)
        except OSError as error:
            raise UsageError(f"--python: expected an interpreter, could not run {python}: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise UsageError(f"--python: {python} cannot import torch, timm and fly_modules ({last}); install them "
                         f"there first (pip install timm and this checkout)")
    try:
        versions = json.loads(done.stdout)
    except ValueError:
        raise UsageError(f"--python: expected a Python interpreter, {python} answered {done.stdout[:80]!r}") from None
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **versions)


def markdown_report(results: Dict[str, Dict[str, Any]], env: Dict[str, Any]) -> str:
    """The table as docs/results/ keeps it: with the checkout commits, each harness's statuses and versions."""
    lines = ["# The adapters on the upstream repositories", "",
             "`python -m benchmarks.upstream --checkouts DIR --threads 1` (see `docs/adapters.md`).", "",
             markdown_table(results, adapters_link="../../adapters.md"), "", "| harness | checkout | commit | checks |",
             "|---|---|---|---|"]
    for name, result in results.items():
        commit = result["meta"].get("upstream_commit", "—")
        lines.append(f"| {name} | {result['checkout']} | `{commit}` | {status_line(result)} |")
    lines += ["", ", ".join(f"{key} {value}" for key, value in env.items()), ""]
    return "\n".join(lines)


def execute(names: Sequence[str], args: argparse.Namespace) -> int:
    env = environment(args.python)
    results: Dict[str, Dict[str, Any]] = {}
    for index, name in enumerate(names, 1):
        checkout = args.checkouts / HARNESSES[name]
        start = time.monotonic()
        result = run_harness(name, checkout, args)
        result["seconds"] = round(time.monotonic() - start, 1)
        result["checkout"] = HARNESSES[name]
        results[name] = result
        print(f"[{index}/{len(names)}] {name}: {summarise(result)} ({result['seconds']:.0f} s)", file=sys.stderr,
              flush=True)
    print(markdown_table(results))
    print()
    for name, result in results.items():
        commit = result["meta"].get("upstream_commit", "")
        documented = REPOSITORIES[HARNESSES[name]].commit
        note = f" (documented: {documented[:10]})" if commit and commit != documented else ""
        print(f"{name} {commit[:10]}{note}: {status_line(result)}")
    if args.json is not None:
        write_text_atomic(args.json, json.dumps(dict(environment=env, harnesses=list(results.values()),
                                             table=markdown_table(results)), indent=2) + "\n")
    if args.markdown is not None:
        write_text_atomic(args.markdown, markdown_report(results, env))
    failed = any(r["outcome"] == "crashed" or any(c["status"] in ("FAIL", "ERROR") for c in r["checks"])
                 for r in results.values())
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns the exit status (2 with one line on stderr for a usage error)."""
    try:
        args = build_parser().parse_args(argv)
        return execute(resolve(args), args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
