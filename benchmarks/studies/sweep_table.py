"""The table of a study's points (``--study NAME`` with points, ``--sweep NAME=v1,...``): one row per (point,
dataset, method, variant), the mean over the seeds found, beside the paper's numbers where it has the row
(:func:`benchmarks.studies.paper_numbers.sweep_paper_numbers`). Written as ``<name>.md``, ``.json`` and ``.png``
into the study's base folder (``study_<study>`` for a study, ``sweep_<setting>`` for ``--sweep``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from .paper_numbers import paper_backbone, sweep_paper_numbers
from .registry import Study, SweepPoint
from .study_tables import paper_label, seed_mean, seed_std, table_cell
from .sweep_figure import plot_points

__all__ = ["point_rows", "format_points", "write_points", "table_name"]


def table_name(study: Study) -> str:
    """The files' stem: ``study_<name>``, or the ``sweep_<setting>`` a ``--sweep`` is named by already."""
    return study.name if study.name.startswith("sweep_") else f"study_{study.name}"


def point_rows(study: Study, found: Sequence[Tuple[SweepPoint, Sequence[Dict[str, Any]]]]) -> List[Dict[str, Any]]:
    """One row per (point, dataset, method, variant) with results, in the points' order."""
    rows = []
    for point, results in found:
        groups: Dict[tuple, List[Dict[str, Any]]] = {}
        for result in results:
            spec = result["spec"]
            groups.setdefault((spec["dataset"], spec["method"], spec["variant"]), []).append(result)
        for (dataset, method, variant), runs in groups.items():
            rows.append(_row(study, point, dataset, method, variant, runs))
    return rows


def _row(study: Study, point: SweepPoint, dataset: str, method: str, variant: str,
         runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    auc = [run["metrics"]["A_auc"] for run in runs]
    row = {"point": point.label, "setting": dict(point.changes), "dataset": dataset, "method": method,
           "variant": variant, "seeds": len(runs), "A_auc": seed_mean(auc), "A_auc_std": seed_std(auc),
           "A_last": seed_mean([run["metrics"]["A_last"] for run in runs]), "protocol": runs[0]["protocol"]}
    compared, backbone, numbers = sweep_paper_numbers(study.name, point.label, method, dataset,
                                                      paper_backbone(runs[0]["protocol"]))
    row.update(paper_dataset=compared, paper_backbone=backbone, paper_A_auc=numbers and numbers[0],
               paper_A_last=numbers and numbers[1])
    return row


def format_points(rows: Sequence[Dict[str, Any]], study: Study) -> str:
    """The rows as a markdown table (percent), the paper's columns last."""
    head = ["point", "dataset", "method", "variant", "seeds", "A_auc", "A_auc s.d.", "A_last", "paper", "paper A_auc",
            "paper A_last"]
    lines = [f"{study.name}: {study.description or 'one row per value'}"
             + (f" (beside the paper's {study.paper})" if study.paper else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["point"], row["dataset"], row["method"], row["variant"], str(row["seeds"]), table_cell(row["A_auc"]),
                 table_cell(row["A_auc_std"]), table_cell(row["A_last"]), paper_label(row),
                 table_cell(row["paper_A_auc"], 1), table_cell(row["paper_A_last"], 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_points(output: Path, study: Study, found: Sequence[Tuple[SweepPoint, Sequence[Dict[str, Any]]]]) -> str:
    """Write the points' table, its JSON (the rows) and its figure into ``output``; returns the markdown."""
    rows = point_rows(study, found)
    output.mkdir(parents=True, exist_ok=True)
    stem = table_name(study)
    text = format_points(rows, study)
    (output / f"{stem}.md").write_text(text + "\n")
    (output / f"{stem}.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot_points(output / f"{stem}.png", rows, study)
    return text
