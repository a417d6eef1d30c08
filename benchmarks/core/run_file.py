"""A run file's fields: each one a reader of run files uses (the tables, the studies, the summary, the
merge), with its type. :func:`run_file_problem` reads a parsed file field by field against this table,
so that a field removed or of the wrong type is one line naming the field, never a traceback in a reader.

A field written by every sweep is required; one that older sweeps did not write (the data setting, the
checkpoints' history) is checked only where it is present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

__all__ = ["DIAGNOSTICS", "FAILURE_FILE", "LOG_RECORD", "METRICS", "NUMBER", "Field", "RUN_FILE", "SPEC", "field_names",
           "run_file_problem"]

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
    values: Any = None  # a type, or the Field each value of an object is (keys of the writer's choosing)
    items: Optional["Field"] = None  # each item of a list


#: what a result is of: ``spec`` in every run file
SPEC: Dict[str, Field] = {"method": Field(str), "variant": Field(str), "dataset": Field(str), "seed": Field(int)}
#: a run's metrics (fractions; NaN where undefined), in both definitions (``metrics``, ``metrics_paper``)
METRICS: Dict[str, Field] = {name: Field(NUMBER) for name in ("A_auc", "A_last", "A_avg", "F_last", "BWT")}
#: one evaluation of ``log.records`` (``benchmarks.core.metrics.EvalRecord.to_dict``): the curves read them
LOG_RECORD: Dict[str, Field] = {
    "kind": Field(str), "timestamp": Field(int), "samples_seen": Field(int), "session": Field(int),
    "correct": Field(list, items=Field(int)), "total": Field(list, items=Field(int)),
}
#: one member's, router's, aggregation rule's or subset of heads' scores in ``diagnostics``
SCORES: Dict[str, Field] = {"A_auc": Field(NUMBER), "A_last": Field(NUMBER)}
#: routing accuracy of one way of reading the selection (``modal``, ``any``, ``first``); a run may lack either
ROUTING_SCORES = Field(dict, fields={"last": Field(NUMBER, required=False),
                                     "anytime_mean": Field(NUMBER, required=False)})
#: the diagnostics the tables and studies read (``benchmarks.ablation.diagnostics``, docs/diagnostics.md)
DIAGNOSTICS: Dict[str, Field] = {
    "routing": Field(dict, fields={who: Field(dict, values=ROUTING_SCORES) for who in ("own", "rear", "chance")}),
    "expert_matrix": Field(dict, required=False, fields={"diagonal_minus_off_diagonal": Field(NUMBER)}),
    "members": Field(dict, required=False, values=Field(dict, fields=SCORES)),
    "aggregations": Field(dict, required=False, values=Field(dict, fields=SCORES)),
    "heads": Field(dict, required=False, values=Field(dict, fields=SCORES)),
    "routers": Field(dict, required=False, values=Field(dict, fields={
        **SCORES, "routing": Field(dict, fields={"modal": ROUTING_SCORES}),
        "seconds_per_update": Field(NUMBER, required=False), "seconds_per_routed_batch": Field(NUMBER, required=False)})),
    "cka": Field(dict, required=False, fields={"experts": Field(list, items=Field(int)), "residual": Field(list),
                                               "raw": Field(list), "samples": Field(int)}),
}
#: the run file's fields, as ``benchmarks.ablation.runner`` and ``execution`` write them
RUN_FILE: Dict[str, Field] = {
    "spec": Field(dict, fields=SPEC),
    "protocol": Field(dict, fields={"model": Field(str)}),  # the studies' tables name the backbone by its model
    "metrics": Field(dict, fields=METRICS, values=NUMBER),
    "metrics_paper": Field(dict, fields=METRICS, values=NUMBER),
    "log": Field(dict, fields={"records": Field(list, items=Field(dict, fields=LOG_RECORD))}),
    "num_batches": Field(int),
    "stream_length": Field(int),
    "seconds_per_batch": Field(NUMBER),
    "peak_memory_mb": Field(NUMBER),
    "device": Field(str),
    "notes": Field(str),
    "variants_trained_together": Field(list),
    "diagnostics": Field(dict, fields=DIAGNOSTICS),
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
        inner = field.values if isinstance(field.values, Field) else Field(field.values)
        for key, item in value.items():
            found = _problem(item, inner, f"{name}.{key}")
            if found:
                return found
    if field.items is not None and not _is_plain(field.items):
        for index, item in enumerate(value):
            found = _problem(item, field.items, f"{name}[{index}]")
            if found:
                return found
    elif field.items is not None and not all(_is(item, field.items.kind) for item in value):  # long lists of counts
        index = next(index for index, item in enumerate(value) if not _is(item, field.items.kind))
        return _problem(value[index], field.items, f"{name}[{index}]")
    return None


def _is_plain(field: Field) -> bool:
    """A field of a type only (no inner fields, values or items)."""
    return field.fields is None and field.values is None and field.items is None


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
    """Every ``(dotted name, field)`` of ``table``, nested fields included (``a[0].b``: a list item's field,
    ``a.*.b``: the field of an object's values): what a test removes and retypes."""
    found = []
    for key, field in table.items():
        found.append((prefix + key, field))
        found += field_names(field.fields, f"{prefix}{key}.") if field.fields else []
        found += field_names(field.items.fields, f"{prefix}{key}[0].") if field.items and field.items.fields else []
        values = field.values if isinstance(field.values, Field) else None
        found += field_names(values.fields, f"{prefix}{key}.*.") if values is not None and values.fields else []
    return tuple(found)
