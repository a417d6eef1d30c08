"""Result files of a sweep: one JSON per finished run, written atomically, reused on resume only when
their stored setting equals the current one; the same check for the checkpoints of unfinished runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .checkpointing import CheckpointStore, checkpoint_folder
from .errors import UsageError
from .files import WriteError, write_atomic
from .protocol import RunSpec
from .run_file import run_file_problem

__all__ = [
    "ProtocolMismatchError", "UnreadableResultError", "WriteError", "result_path", "write_text_atomic",
    "write_json_atomic", "read_result", "load_results", "setting_differences", "check_resumable", "check_checkpoints", "checkpoints_of", "remove_finished_checkpoints",
    "trainings",
]


def result_path(output: Path, spec: RunSpec) -> Path:
    return output / "runs" / f"{spec.key}.json"


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file in the same folder and rename it into place (never half-written).
    A failed write (disk full, permissions) removes the temporary file, keeps the previous ``path`` and
    raises :class:`WriteError` with one line saying so."""
    write_atomic(path, lambda stream: stream.write(text))


def write_json_atomic(path: Path, payload: Any) -> None:
    """:func:`write_text_atomic` of ``payload`` as JSON."""
    write_atomic(path, lambda stream: json.dump(payload, stream))


def read_result(path: Path) -> Dict[str, Any]:
    """A result file, read field by field (:data:`benchmarks.core.run_file.RUN_FILE`);
    :class:`UnreadableResultError` (one line naming the file and the field) when it is not one (edited,
    damaged disk: the sweep itself writes atomically)."""
    try:
        result = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        problem = f"{type(error).__name__}: {error}"
    else:
        problem = run_file_problem(result)
    if problem:
        raise UnreadableResultError(f"{path} is not a result file ({problem}); delete it, and the sweep trains "
                                    "the run again")
    return result


def load_results(output: Path, specs: Optional[Sequence[RunSpec]] = None) -> List[Dict[str, Any]]:
    """The result files of ``specs`` that exist (default: every file under ``runs/``)."""
    if specs is None:
        return [read_result(path) for path in sorted((output / "runs").glob("**/*.json"))]
    return [read_result(path) for path in (result_path(output, spec) for spec in specs) if path.exists()]


def _own_method_kwargs(protocol: Dict[str, Any], method: Optional[str]) -> Dict[str, Any]:
    """``protocol`` with ``method_kwargs`` narrowed to ``method``'s: another method's keyword arguments do not
    decide this method's numbers (``None``: the protocol as it is)."""
    if method is None:
        return protocol
    return {**protocol, "method_kwargs": {method: (protocol.get("method_kwargs") or {}).get(method, {})}}


def setting_differences(stored: Dict[str, Any], wanted: Dict[str, Any], method: Optional[str] = None) -> List[str]:
    """``name: stored -> wanted`` for each differing entry (a result that records its protocol only, no
    data setting, is compared on its protocol); with ``method``, of the method keyword arguments only
    ``method``'s are compared."""
    differences = []
    for part in ("protocol", "data"):
        if part not in stored:
            continue
        old, new = stored[part], wanted[part]
        if part == "protocol":  # a field a stored result lacks: the value it was run with
            old, new = _own_method_kwargs({**LEGACY_PROTOCOL, **old}, method), _own_method_kwargs(new, method)
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                differences.append(f"{name}: {old.get(name)!r} -> {new.get(name)!r}")
    return differences


def check_resumable(output: Path, specs: Sequence[RunSpec], settings: Dict[str, Dict[str, Any]]) -> None:
    """Refuse to mix finished runs of another protocol into this table (exit status 2 with the reason)."""
    for spec in specs:
        path = result_path(output, spec)
        if not path.exists():
            continue
        result = read_result(path)
        stored = result.get("setting", {"protocol": result.get("protocol", {})})
        _refuse_differences(path, setting_differences(stored, settings[spec.dataset], spec.method), "recompute such runs")


def _refuse_differences(path: Path, differences: List[str], remedy: str) -> None:
    if differences:
        raise ProtocolMismatchError(
            f"{path} was run with another setting ({'; '.join(differences[:4])}"
            f"{'; ...' if len(differences) > 4 else ''}); pass --no-resume to {remedy}, or choose another --output"
        )


def checkpoints_of(output: Path, group: Sequence[RunSpec]) -> CheckpointStore:
    """The checkpoint files of the training that gives the results ``group`` (one of :func:`trainings`)."""
    return CheckpointStore(checkpoint_folder(output, group[0].dataset, group[0].method, group[0].seed))


def check_checkpoints(output: Path, groups: Sequence[Sequence[RunSpec]], settings: Dict[str, Dict[str, Any]]) -> None:
    """Refuse to resume a training from a checkpoint of another setting, or of other variants than the
    results it must still give (exit status 2 with the reason); reads only the checkpoints' small entries."""
    for group in groups:
        found = checkpoints_of(output, group).latest(lazily=True)
        if found is None:
            continue
        path, payload = found
        _refuse_differences(path, setting_differences(payload["setting"], settings[group[0].dataset], group[0].method),
                            "restart such runs")
        trained = payload["run"]["variants"]
        missing = [spec.variant for spec in group if spec.variant not in trained]
        if missing:
            raise ProtocolMismatchError(
                f"{path} trains the variants {','.join(trained)}, not {','.join(missing)}; rerun with "
                f"--variants {','.join(trained)} to finish it, or pass --no-resume to restart such runs"
            )


def remove_finished_checkpoints(output: Path, specs: Sequence[RunSpec]) -> None:
    """Remove the checkpoints of trainings whose results all exist (a sweep killed between its last
    result file and the removal leaves them)."""
    for group in trainings(specs):
        if all(result_path(output, spec).exists() for spec in group):
            checkpoints_of(output, group).clear()


#: Protocol fields a stored result may lack, with the value such a result was run with.
LEGACY_PROTOCOL = {"router_query": "first_iteration", "expert_schedule": "method", "train_mask": "method"}


class ProtocolMismatchError(RuntimeError):
    """A finished run in the output folder used a different protocol or data setting."""


class UnreadableResultError(ProtocolMismatchError, UsageError):
    """A file where a run's result belongs is not a result file."""


def trainings(specs: Sequence[RunSpec]) -> List[List[RunSpec]]:
    """``specs`` grouped by (dataset, seed, method), in order: the results one training gives."""
    groups: Dict[tuple, List[RunSpec]] = {}
    for spec in specs:
        groups.setdefault((spec.dataset, spec.seed, spec.method), []).append(spec)
    return list(groups.values())
