"""What the GPU suite reads and writes: JSON files written atomically, the figure lines of the benchmarks'
reports, and pytest's outcomes (its junit file, or its ``-v`` lines when the run was killed first)."""

from __future__ import annotations

import collections
import datetime
import json
import os
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Dict, List, Optional

TARGET_LINE = re.compile(r"^\[(PASS|FAIL)\] (\S+): (-?[0-9.eE+-]+)(\S*) \(target (>=|<=) (-?[0-9.eE+-]+)")
PYTEST_LINE = re.compile(r"^(\S+\.py::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")


def write_json(path: Path, document: Any) -> None:
    """Atomically (a reader never sees half a file)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=2, default=str) + "\n")
    os.replace(temporary, path)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def scrape_targets(text: str) -> List[Dict[str, Any]]:
    """The ``[PASS]/[FAIL] key: value (target op bound)`` lines of ``benchmarks.speed.timing.Report``."""
    found = []
    for line in text.splitlines():
        match = TARGET_LINE.match(line.strip())
        if match:
            status, key, value, unit, op, bound = match.groups()
            found.append({"key": key, "value": float(value), "unit": unit, "op": op, "bound": float(bound),
                          "passed": status == "PASS"})
    return found


def parse_junit(path: Path) -> Optional[Dict[str, Any]]:
    """Counts and per-test outcomes of a pytest ``--junitxml`` file; ``None`` if there is none."""
    if not path.exists():
        return None
    root = ElementTree.parse(path).getroot()
    tests = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome, message = kind, ((element.get("message") or "").splitlines() or [""])[0]
                break
        tests.append({"name": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0.0), "message": message[:500]})
    counts = collections.Counter(test["outcome"] for test in tests)
    return {"counts": {kind: counts.get(kind, 0) for kind in ("passed", "failure", "error", "skipped")},
            "tests": tests}


def parse_pytest_lines(text: str) -> Dict[str, Any]:
    """Per-test outcomes from ``pytest -v`` output (when the run was killed before its junit file)."""
    tests = [{"name": m.group(1), "outcome": m.group(2).lower()} for m in map(PYTEST_LINE.match, text.splitlines())
             if m]
    counts = collections.Counter({"failed": "failure"}.get(t["outcome"], t["outcome"]) for t in tests)
    return {"counts": {kind: counts.get(kind, 0) for kind in ("passed", "failure", "error", "skipped")},
            "tests": tests, "from_output": True}


def load_json(path: Path) -> Optional[Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
