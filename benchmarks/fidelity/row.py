"""One method's result, and the table of them (JSON and Markdown)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Sequence

__all__ = ["FidelityRow", "markdown_table"]


@dataclass
class FidelityRow:
    """What the comparison of one method found.

    Attributes:
        method: our reference method; ``official``: the official model and trainer compared with it.
        repository, commit: the checkout.
        weights_max_abs, weights_relative: the largest difference of a trainable tensor after the
            stream (absolute, and over that tensor's largest magnitude), and that tensor (``worst``).
        tensors: how many trainable tensors were compared; ``weights_moved``: the smallest relative change
            of one of them from its initial value on the official side (0 would mean it never trained).
        predictions_trained: agreement of the predictions, each side with its own trained weights.
        predictions_identical, selection_identical: agreement with our side loaded with the official
            side's trained state (the inference code alone).
        a_auc_ours, a_auc_official, a_last_ours, a_last_official: the runner's metrics, and the official
            trainer's own evaluations at the same points.
        other: relative differences of the state beyond the trainable tensors (FlyPrompt's router
            statistics and scores, EMA heads), by name.
        note: what differs on purpose or was not compared.
    """

    method: str
    official: str
    repository: str
    commit: str
    weights_max_abs: float
    weights_relative: float
    worst: str
    tensors: int
    weights_moved: float
    predictions_trained: float
    predictions_identical: float
    selection_identical: float
    a_auc_ours: float
    a_auc_official: float
    a_last_ours: float
    a_last_official: float
    seconds: float
    other: Dict[str, float] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def _points(ours: float, official: float) -> str:
    return "n/a" if math.isnan(ours) or math.isnan(official) else f"{100 * (ours - official):+.2f}"


def _other(other: Dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.1e}" for name, value in other.items()) or "-"


def markdown_table(rows: Sequence[FidelityRow]) -> str:
    """The table docs/verification.md shows: one line per method."""
    lines: List[str] = [
        "| method | official (commit) | trainable tensors: max abs / relative difference (worst) | least moved | predictions: "
        "trained / identical state | selection, identical state | A_auc ours - official (points) | "
        "A_last ours - official | other state: relative difference | not compared, or differs on purpose |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.method} | {row.official} ({row.commit[:7]}) | {row.weights_max_abs:.1e} / "
            f"{row.weights_relative:.1e} ({row.worst}; {row.tensors} tensors) | {row.weights_moved:.1e} | "
            f"{_percent(row.predictions_trained)} / "
            f"{_percent(row.predictions_identical)} | {_percent(row.selection_identical)} | "
            f"{_points(row.a_auc_ours, row.a_auc_official)} | {_points(row.a_last_ours, row.a_last_official)} | "
            f"{_other(row.other)} | {row.note} |"
        )
    return "\n".join(lines) + "\n"
