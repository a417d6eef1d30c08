"""The plan file that ``--plan`` writes beside a sweep's results: its name, its format version, and the
reading of its probe's unit costs that the cost study shares with the plan."""

from __future__ import annotations

from typing import Any, Dict

__all__ = ["PLAN_FILE", "PLAN_FORMAT", "inference_per_image"]

PLAN_FILE = "plan.json"
PLAN_FORMAT = 1


def inference_per_image(unit: Dict[str, Any]) -> float:
    """Seconds to infer one test image with one variant, from a probe's unit costs: its query pass and one
    prompted pass (as the official code evaluates; no pass reused)."""
    query = unit["frozen_per_image"] or unit["eval_parts"].get("eval/query", 0.0)
    return query + unit["prompted_per_image"]
