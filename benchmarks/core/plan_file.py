"""The plan file that ``--plan`` writes beside a sweep's results: its name, its format version, the fields
its readers use (read field by field: a damaged file is one line naming the file and the field), and the
reading of its probe's unit costs that the cost study shares with the plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

from .errors import UsageError
from .run_file import NUMBER, Field, run_file_problem

__all__ = ["PLAN_FIELDS", "PLAN_FILE", "PLAN_FORMAT", "inference_per_image", "read_plan"]

PLAN_FILE = "plan.json"
PLAN_FORMAT = 1
_PROBE = {"method": Field(str), "dataset": Field(str), "device": Field(str), "frozen_per_image": Field(NUMBER),
          "prompted_per_image": Field(NUMBER), "eval_parts": Field(dict, values=NUMBER)}
#: what the shards, the studies' totals and the cost study read of a plan (``ablation.plan.summarize`` writes it)
PLAN_FIELDS: Dict[str, Field] = {
    "format": Field(int),
    "protocol": Field(dict, fields={"test_batch_size": Field(int)}),
    "trainings": Field(list, items=Field(dict, fields={"key": Field(str), "estimate": Field(
        dict, fields={"ours": Field(NUMBER)})})),
    "probes": Field(list, items=Field(dict, fields=_PROBE)),
    "total_seconds": Field(dict, fields={"ours": Field(NUMBER)}),
}


def read_plan(path: Path) -> Dict[str, Any]:
    """The plan document at ``path``; :class:`UsageError` in one line when it is not JSON, not a plan of
    this format, or a field its readers use is missing or of another type."""
    try:
        plan = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"{path}: not a readable plan file ({str(error).splitlines()[0][:80]}); run --plan again") from None
    problem = run_file_problem(plan, PLAN_FIELDS)
    if problem is None and plan["format"] != PLAN_FORMAT:
        problem = f"'format' is {plan['format']}; expected {PLAN_FORMAT}"
    if problem:
        raise UsageError(f"{path}: not a plan file of this version: {problem}; run --plan again")
    return plan


def inference_per_image(unit: Dict[str, Any]) -> float:
    """Seconds to infer one test image with one variant, from a probe's unit costs: its query pass and one
    prompted pass (as the official code evaluates; no pass reused)."""
    query = unit["frozen_per_image"] or unit["eval_parts"].get("eval/query", 0.0)
    return query + unit["prompted_per_image"]
