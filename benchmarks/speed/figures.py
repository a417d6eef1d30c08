"""A :class:`benchmarks.speed.timing.Report` that also keeps what it prints, for the micro-benchmarks' ``--json``.

Every target (key, value, bound, pass/fail, detail) and every information line is kept in the order
printed, and :meth:`FigureReport.write_json` writes them with the run's settings and environment, so a
script (``benchmarks/gpu/suite.py``) reads the figures instead of parsing the printed text.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any, Dict, List, Mapping

import torch

from benchmarks.speed.timing import Report, load_average

__all__ = ["FigureReport"]


class FigureReport(Report):
    """Prints exactly what :class:`Report` prints; keeps every target and information line as well."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: List[Dict[str, Any]] = []
        self.notes: List[str] = []

    def check(self, key: str, value: float, op: str, bound: float, *, unit: str = "", fmt: str = ".2f",
              detail: str = "") -> bool:
        passed = super().check(key, value, op, bound, unit=unit, fmt=fmt, detail=detail)
        self.targets.append({"key": key, "value": float(value), "op": op, "bound": float(bound), "unit": unit,
                             "passed": passed, "detail": detail})
        return passed

    def info(self, text: str) -> None:  # type: ignore[override]  # an instance method here: it records
        Report.info(text)
        self.notes.append(text)

    def finish(self, args: argparse.Namespace, *, benchmark: str) -> int:
        """Prints the summary, writes the JSON file ``--json`` names (if any); returns the exit status,
        1 when a target failed under ``--strict``."""
        failed = self.summary()
        if args.json:
            self.write_json(args.json, benchmark=benchmark, settings=vars(args))
        return 1 if (failed and args.strict) else 0

    def write_json(self, path: str, *, benchmark: str, settings: Mapping[str, Any]) -> None:
        """``{benchmark, settings, environment, targets, notes}`` to ``path`` (values as printed, not rounded)."""
        device = str(settings.get("device", "cpu"))
        environment = {
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "machine": platform.machine(), "torch_threads": torch.get_num_threads(), "load_average": load_average(),
            "cpus": os.cpu_count(),
        }
        if device.startswith("cuda"):
            environment["device_name"] = torch.cuda.get_device_name(torch.device(device))
        kept = {key: str(value) for key, value in settings.items() if not callable(value)}  # not e.g. synchronize
        document = {"benchmark": benchmark, "settings": kept,
                    "environment": environment, "targets": self.targets, "notes": self.notes}
        Path(path).write_text(json.dumps(document, indent=2) + "\n")
