"""A run file's fields: each one a reader of run files uses (the tables, the studies, the summary, the
merge), with its type. :func:`run_file_problem` reads a parsed file field by field against this table,
so that a field removed or of the wrong type is one line naming the field, never a traceback in a reader.

A field written by every sweep is required; one that older sweeps did not write (the data setting, the
checkpoints' history) is checked only where it is present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

__all__ = ["FAILURE_FILE", "METRICS", "NUMBER", "Field", "RUN_FILE", "SPEC", "field_names", "run_file_problem"]

NUMBER = (int, float)
_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", NUMBER: "a number",
               bool: "true or false"}


@dataclass(frozen=True)
class Field:
    """One field: its type, whether every run file has it, the fields of an object (``fields``), the type
    of each of its values (``values``) or the field each item of a list is (``items``)."""

    kind: Any
    required: bool = True
    fields: Optional[Mapping[str, "Field"]] = None
    values: Any = None
    items: Optional["Field"] = None  # each item of a list


#: what a result is of: ``spec`` in every run file
SPEC: Dict[str, Field] = {"method": Field(str), "variant": Field(str), "dataset": Field(str), "seed": Field(int)}
#: a run's metrics (fractions; NaN where undefined), in both definitions (``metrics``, ``metrics_paper``)
METRICS: Dict[str, Field] = {name: Field(NUMBER) for name in ("A_auc", "A_last", "A_avg", "F_last", "BWT")}
#: the run file's fields, as ``benchmarks.ablation.runner`` and ``execution`` write them
RUN_FILE: Dict[str, Field] = {
    "spec": Field(dict, fields=SPEC),
    "protocol": Field(dict),
    "metrics": Field(dict, fields=METRICS, values=NUMBER),
    "metrics_paper": Field(dict, fields=METRICS, values=NUMBER),
    "log": Field(dict, fields={"records": Field(list)}),
    "num_batches": Field(int),
    "stream_length": Field(int),
    "seconds_per_batch": Field(NUMBER),
    "peak_memory_mb": Field(NUMBER),
    "device": Field(str),
    "notes": Field(str),
    "variants_trained_together": Field(list),
    "diagnostics": Field(dict),
    "wall_seconds": Field(NUMBER),
    "world_size": Field(int),
    "setting": Field(dict, required=False, fields={"protocol": Field(dict), "data": Field(dict, required=False)}),
    "checkpoints": Field(dict, required=False),
}
#: a failed run's record (``failures/...``): what its error rows read
FAILURE_FILE: Dict[str, Field] = {"spec": Field(dict, fields=SPEC), "error": Field(str)}


def _is(value: Any, kind: Any) -> bool:
    if isinstance(value, bool):  # JSON's true is no number
        return kind is bool
    return isinstance(value, kind)


def _problem(value: Any, field: Field, name: str) -> Optional[str]:
    if not _is(value, field.kind):
        return f"'{name}' is {type(value).__name__} {str(value)[:40]!r}; expected {_TYPE_NAMES[field.kind]}"
    for key, inner in (field.fields or {}).items():
        found = _entry_problem(value, key, inner, f"{name}.{key}")
        if found:
            return found
    if field.values is not None:
        for key, item in value.items():
            if not _is(item, field.values):
                return f"'{name}.{key}' is {type(item).__name__} {str(item)[:40]!r}; expected {_TYPE_NAMES[field.values]}"
    for index, item in enumerate(value if field.items is not None else ()):
        found = _problem(item, field.items, f"{name}[{index}]")
        if found:
            return found
    return None


def _entry_problem(record: Mapping[str, Any], key: str, field: Field, name: str) -> Optional[str]:
    if key not in record:
        return f"'{name}' is missing" if field.required else None
    return _problem(record[key], field, name)


def run_file_problem(record: Any, table: Mapping[str, Field] = RUN_FILE) -> Optional[str]:
    """The first field of the parsed run file ``record`` that is missing or of the wrong type, in words
    (``"'metrics' is str 'x'; expected an object"``), or ``None``."""
    if not isinstance(record, dict):
        return f"it holds {type(record).__name__}; expected an object of fields"
    for key, field in table.items():
        found = _entry_problem(record, key, field, key)
        if found:
            return found
    return None


def field_names(table: Mapping[str, Field] = RUN_FILE, prefix: str = "") -> Tuple[Tuple[str, Field], ...]:
    """Every ``(dotted name, field)`` of ``table``, nested fields included: what a test removes and retypes."""
    found = []
    for key, field in table.items():
        found.append((prefix + key, field))
        found += field_names(field.fields, f"{prefix}{key}.") if field.fields else []
        found += field_names(field.items.fields, f"{prefix}{key}[0].") if field.items and field.items.fields else []
    return tuple(found)
