"""Failed runs of a sweep: a training that raises is recorded and the sweep goes on to the next one.

A failure is one JSON per result the training should have given, ``failures/<dataset>/<method>/<variant>/
seed<k>.json``, holding the error's line and its full traceback. It is not a result: the next sweep with the
same command trains the run again, and a result file, once written, replaces it. The table lists failed runs
as error rows and the sweep's exit status is :data:`FAILED_RUNS_EXIT_CODE`.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Sequence

from ..core.checkpointing import CheckpointError
from ..core.files import WriteError
from ..core.protocol import RunSpec
from ..core.results import result_path, write_json_atomic
from ..core.run_file import FAILURE_FILE, run_file_problem
from .preemption import RunInterrupted

__all__ = ["FAILED_RUNS_EXIT_CODE", "failure_path", "recordable", "record_failure", "clear_failures", "load_failures"]

#: Exit status of a sweep that finished with failed runs (error rows in its table).
FAILED_RUNS_EXIT_CODE = 1


def failure_path(output: Path, spec: RunSpec) -> Path:
    return Path(output) / "failures" / f"{spec.key}.json"


def recordable(error: BaseException, world: int) -> bool:
    """Whether the sweep records ``error`` and goes on. Not: stops (signals, Ctrl-C), an output folder that
    cannot be written, an unusable checkpoint (a setting error, one line), and any error of a data-parallel
    sweep (the other processes would wait for the failed one in their next collective)."""
    if not isinstance(error, Exception) or isinstance(error, (RunInterrupted, WriteError, CheckpointError)):
        return False
    return world == 1


def one_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else 'no message'}"


def record_failure(output: Path, group: Sequence[RunSpec], error: BaseException, setting: Dict[str, Any]) -> Path:
    """Write the failure of the training that gives ``group``; returns the first file. A result file of an
    earlier sweep that this one was to recompute (``--no-resume``) goes: the run has no result now."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    for spec in group:
        write_json_atomic(failure_path(output, spec),
                          {"spec": asdict(spec), "error": one_line(error), "traceback": text, "setting": setting})
        result_path(output, spec).unlink(missing_ok=True)
    return failure_path(output, group[0])


def clear_failures(output: Path, specs: Sequence[RunSpec]) -> None:
    """Remove the failure files of ``specs`` and the folders they leave empty, up to ``failures/``."""
    for spec in specs:
        path = failure_path(output, spec)
        path.unlink(missing_ok=True)
        for parent in path.parents:
            try:
                parent.rmdir()
            except OSError:  # not empty, or gone
                break
            if parent.name == "failures":
                break


def load_failures(output: Path, specs: Sequence[RunSpec]) -> List[Dict[str, Any]]:
    """The failure records of ``specs`` that have no result file (in ``specs``' order)."""
    found = []
    for spec in specs:
        path = failure_path(output, spec)
        if path.exists() and not result_path(output, spec).exists():
            try:
                record = json.loads(path.read_text())
            except FileNotFoundError:  # another process finished the run meanwhile
                continue
            except (UnicodeDecodeError, json.JSONDecodeError):  # damaged: the run still failed
                record = None
            if run_file_problem(record, FAILURE_FILE):
                record = {"spec": asdict(spec), "error": f"the failure record {path} cannot be read"}
            found.append(record)
    return found
