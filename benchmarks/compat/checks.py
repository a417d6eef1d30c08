"""The checks run in a built environment with the project installed: the library's tests, the README's
Quick start, and the upstream checks of a codebase on its checkout.

Each runs the environment's interpreter in a folder outside the tree (the installed package is the one
imported, never the copy's sources) and returns an Outcome with one line of detail.
"""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Sequence

from benchmarks.compat import quickstart
from benchmarks.compat.outcome import Outcome, timed
from benchmarks.compat.venvs import ROOT, Built, clean_env

LIBRARY_SUITE = Path("tests") / "library_suite.py"  # its LIBRARY_TESTS: the library's test files, relative paths
SOURCE_FOLDERS = ("fly_modules", "adapters")  # removed from the copy before the tests: they must not shadow
UPSTREAM_RESULTS = ROOT / "docs" / "results" / "upstream" / "results.json"  # the current environment's verdicts
_PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|error|errors|skipped)\b.*?)\s*=*$")


def library_tests(copy: Path) -> List[str]:
    """``LIBRARY_TESTS`` of the copy's tests/library_suite.py: the library's test paths, relative to the root."""
    path = copy / LIBRARY_SUITE
    if not path.is_file():
        raise ValueError(f"expected {LIBRARY_SUITE} with LIBRARY_TESTS, the library's test files")
    tests = runpy.run_path(str(path)).get("LIBRARY_TESTS")
    if not isinstance(tests, (list, tuple)) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"expected {LIBRARY_SUITE} to define LIBRARY_TESTS, a list of paths, found {tests!r}"[:200])
    return list(tests)


def pytest_arguments(tests: Sequence[str], installed: Path) -> List[str]:
    """The test paths, the package's own folder standing for the installed copy (its doctests), whose
    ``adapters`` subpackage is left out as the repository's own test paths leave out adapters/."""
    arguments: List[str] = []
    for test in tests:
        if test == "fly_modules":
            arguments += [str(installed), f"--ignore={installed / 'adapters'}"]
        else:
            arguments.append(test)
    return arguments


def _summary(output: str) -> str:
    for line in reversed(output.splitlines()):
        found = _PYTEST_SUMMARY.match(line.strip())
        if found:
            return re.sub(r" in [\d.]+s.*$", "", found.group(1))
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


@timed
def run_library_tests(built: Built, copy: Path) -> Outcome:
    try:
        tests = library_tests(copy)
    except ValueError as error:
        return Outcome("fail", str(error))
    for folder in SOURCE_FOLDERS:
        shutil.rmtree(copy / folder, ignore_errors=True)
    where = subprocess.run([str(built.python), "-c", "import fly_modules, os; print(os.path.dirname("
                            "fly_modules.__file__))"], capture_output=True, text=True, env=clean_env(), cwd=copy)
    if where.returncode != 0:
        return Outcome("fail", f"fly_modules does not import: {(where.stderr.strip().splitlines() or ['?'])[-1]}")
    command = [str(built.python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
               *pytest_arguments(tests, Path(where.stdout.strip()))]
    done = subprocess.run(command, cwd=copy, capture_output=True, text=True, env=clean_env(built.python.parent))
    (built.folder.parent / f"{built.folder.name}.tests.log").write_text(done.stdout + done.stderr)
    return Outcome("pass" if done.returncode == 0 else "fail", _summary(done.stdout + done.stderr))


@timed
def run_quickstart(built: Built, readme: str) -> Outcome:
    try:
        quick = quickstart.extract(readme)
    except ValueError as error:
        return Outcome("fail", str(error))
    with tempfile.TemporaryDirectory(prefix="fly_compat_quickstart_") as folder:
        script = Path(folder) / "quick_start.py"
        script.write_text(quick.code)
        done = subprocess.run([str(built.python), str(script)], cwd=folder, capture_output=True, text=True,
                              env=clean_env(), timeout=600)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return Outcome("fail", f"stopped: {last}"[:300])
    problem = quickstart.difference(done.stdout, quick)
    return Outcome("fail", problem) if problem else Outcome("pass", done.stdout.strip().splitlines()[-1])


def verdict_differences(measured: Sequence[Dict[str, Any]], committed: Sequence[Dict[str, Any]]) -> List[str]:
    """Per harness, what differs from the committed run: its outcome, or each check whose status differs
    (checks paired in order; the measured check's detail said once)."""
    before = {harness["name"]: harness for harness in committed}
    found = []
    for harness in measured:
        old = before.get(harness["name"])
        if old is None or harness["outcome"] != old["outcome"]:
            found.append(f"{harness['name']}: {harness['detail'] or harness['outcome']} "
                         f"(committed: {old['outcome'] if old else 'none'})")
            continue
        pairs = list(zip(harness["checks"], old["checks"]))
        moved = [(new, was) for new, was in pairs if (new["check"], new["status"]) != (was["check"], was["status"])]
        if len(harness["checks"]) != len(old["checks"]) and not moved:
            moved = [(harness["checks"][-1], old["checks"][-1])]
        if moved:
            statuses = ", ".join(f"{new['check']} {new['status']} (committed {was['check']} {was['status']})"
                                 for new, was in moved)
            detail = next((new["detail"] for new, _ in moved if new.get("detail")), "")
            found.append(f"{harness['name']}: {statuses}" + (f": {detail}" if detail else ""))
    return found


@timed
def run_upstream(built: Built, checkout: str, checkouts: Path) -> Outcome:
    """``python -m benchmarks.upstream --only CHECKOUT --python ENV`` from this interpreter; the verdicts
    of its harnesses compared with the committed table's (the current environment's)."""
    if not (checkouts / checkout).is_dir():
        return Outcome("skipped", f"no checkout {checkout} under --checkouts")
    with tempfile.TemporaryDirectory(prefix="fly_compat_upstream_") as folder:
        result = Path(folder) / "upstream.json"
        command = [sys.executable, "-m", "benchmarks.upstream", "--checkouts", str(checkouts), "--only", checkout,
                   "--python", str(built.python), "--threads", "1", "--json", str(result)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if not result.is_file():
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            return Outcome("fail", f"python -m benchmarks.upstream: {last}"[:300])
        harnesses = json.loads(result.read_text())["harnesses"]
    differences = verdict_differences(harnesses, json.loads(UPSTREAM_RESULTS.read_text())["harnesses"])
    passed = done.returncode == 0 and not differences
    names = ", ".join(h["name"] for h in harnesses)
    detail = f"{names}: as committed" if passed else "; ".join(differences) or f"exit status {done.returncode}"
    return Outcome("pass" if passed else "fail", detail[:600])
