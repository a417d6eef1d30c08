"""Result files of a sweep: one JSON per finished run, written atomically, reused on resume only when
their stored setting equals the current one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Sequence

from .methods import method_class
from .runner import RunSpec
from .variants import variants_for

__all__ = [
    "ProtocolMismatchError", "result_path", "write_json_atomic", "load_results", "setting_differences",
    "check_resumable", "plan", "trainings",
]


def result_path(output: Path, spec: RunSpec) -> Path:
    return output / "runs" / f"{spec.key}.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write to a temporary file in the same folder and rename it into place (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(payload, stream)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp creates 0600; results are ordinary files
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def load_results(output: Path) -> List[Dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((output / "runs").glob("**/*.json"))]


def setting_differences(stored: Dict[str, Any], wanted: Dict[str, Any]) -> List[str]:
    """``name: stored -> wanted`` for each differing entry (results written before settings were
    recorded carry their protocol only; only that is compared then)."""
    differences = []
    for part in ("protocol", "data"):
        if part not in stored:
            continue
        old, new = stored[part], wanted[part]
        if part == "protocol":  # fields added later: what older results did
            old = {**LEGACY_PROTOCOL, **old}
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
        result = json.loads(path.read_text())
        stored = result.get("setting", {"protocol": result.get("protocol", {})})
        differences = setting_differences(stored, settings[spec.dataset])
        if differences:
            raise ProtocolMismatchError(
                f"{path} was run with another setting ({'; '.join(differences[:4])}"
                f"{'; ...' if len(differences) > 4 else ''}); pass --no-resume to recompute such runs, "
                f"or choose another --output"
            )


#: Protocol fields added after results were first written, with the behaviour those results had.
LEGACY_PROTOCOL = {"router_query": "first_iteration"}


class ProtocolMismatchError(RuntimeError):
    """A finished run in the output folder used a different protocol or data setting."""


def plan(methods: Sequence[str], variants: Sequence[str], datasets: Sequence[str], seeds: Sequence[int]) -> List[RunSpec]:
    """Every result of a sweep: each method's variants for ``variants`` (``benchmarks.variants.variants_for``)."""
    specs = []
    for dataset in datasets:
        for seed in seeds:
            for method in methods:
                for variant in variants_for(method_class(method), variants):
                    specs.append(RunSpec(method, variant, dataset, seed))
    return specs


def trainings(specs: Sequence[RunSpec]) -> List[List[RunSpec]]:
    """``specs`` grouped by (dataset, seed, method), in order: the results one training gives."""
    groups: Dict[tuple, List[RunSpec]] = {}
    for spec in specs:
        groups.setdefault((spec.dataset, spec.seed, spec.method), []).append(spec)
    return list(groups.values())
