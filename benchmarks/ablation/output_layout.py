"""What a sweep writes under its ``--output``, in one table: each path with its kind, checked by the output
rule (``benchmarks.flags.output_problem``) before any work, so that a file where the sweep makes a folder
(``O/logs`` a file, with ``--log``) is one line at the start, never a traceback after the training."""

from __future__ import annotations

from typing import Dict, Sequence

__all__ = ["SWEEP_OUTPUTS", "sweep_outputs"]

#: relative path -> kind: what every sweep may write in its output folder (the results, the failed runs,
#: the checkpoints, the locks of sweeps sharing the folder, the plan, the tables and figures)
SWEEP_OUTPUTS: Dict[str, str] = {
    "runs": "folder", "failures": "folder", "checkpoints": "folder", "claims": "folder",
    "protocol.json": "file", "plan.json": "file", "table.md": "file", "table.csv": "file", "table.json": "file",
    "curves.png": "file", "deltas.png": "file",
}


def sweep_outputs(log: Sequence[str] = ()) -> Dict[str, str]:
    """:data:`SWEEP_OUTPUTS` and, with ``--log``, ``logs/`` and each dashboard's folder in it (a backend of
    ``loggers.LOGGERS`` writes under ``logs/<its name>``)."""
    dashboards = {"logs": "folder", **{f"logs/{name}": "folder" for name in log}} if log else {}
    return {**SWEEP_OUTPUTS, **dashboards}
