"""The tables of the routing and aggregation studies, from a sweep's result files, beside the paper's numbers.

Each row is a (dataset, method, variant, router or rule) mean over the seeds found; the paper's A_auc /
A_last are those of its FlyPrompt rows (five seeds), so they compare with a FlyPrompt row. The aggregation
rows are the paper's of the backbone the run used (``paper_numbers.compared_backbone``), the routing rows its
Sup-21K ones (the only backbone of its routing table); for a dataset the paper has not (the proxy's generated
data) they are its CIFAR-100 numbers, and for a model none of its backbones (the proxy's tiny ViT) its
Sup-21K numbers, both named in a column.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from .paper_numbers import (
    AGGREGATION_PAPER_ROWS,
    AGGREGATIONS_BY_BACKBONE,
    ROUTING,
    compared_backbone,
    paper_dataset,
    sweep_paper_numbers,
)
from .study_figures import plot_study

__all__ = ["study_rows", "format_study", "write_study", "paper_label", "seed_mean", "seed_std", "table_cell"]


def seed_mean(values: Sequence[Optional[float]]) -> Optional[float]:
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def seed_std(values: Sequence[Optional[float]]) -> Optional[float]:
    """The standard deviation over seeds (``ddof=1``, as the cross-ablation's table); ``None`` below two."""
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.std(finite, ddof=1)) if len(finite) > 1 else None


def study_rows(results: Iterable[Dict[str, Any]], study: str) -> List[Dict[str, Any]]:
    """One row per (dataset, method, variant, entry) of ``diagnostics[study]`` (``routers``, ``aggregations`` or
    ``heads``; the heads' paper numbers are the FlyPrompt rows of the paper's EMA-decay table)."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for result in results:
        spec, entries = result["spec"], (result.get("diagnostics") or {}).get(study) or {}
        backbone = compared_backbone(study, result["protocol"]) if entries else None
        for name, entry in entries.items():
            groups.setdefault((spec["dataset"], spec["method"], spec["variant"], name, backbone), []).append(entry)
    rows = []
    for (dataset, method, variant, name, backbone), entries in groups.items():
        row = {"dataset": dataset, "method": method, "variant": variant, study[:-1]: name, "seeds": len(entries),
               "A_auc": seed_mean([e["A_auc"] for e in entries]), "A_last": seed_mean([e["A_last"] for e in entries]),
               "A_auc_std": seed_std([e["A_auc"] for e in entries])}
        if study == "routers":
            row["routing_last"] = seed_mean([e["routing"]["modal"]["last"] for e in entries])
            row["routing_anytime"] = seed_mean([e["routing"]["modal"]["anytime_mean"] for e in entries])
            row["ms_per_update"] = seed_mean([1000 * e["seconds_per_update"] for e in entries if "seconds_per_update" in e])
            row["ms_per_routed_batch"] = seed_mean([1000 * e["seconds_per_routed_batch"] for e in entries
                                                if "seconds_per_routed_batch" in e])
        row.update(_paper_columns(study, name, method, dataset, backbone))
        rows.append(row)
    return rows


def _paper_columns(study: str, name: str, method: str, dataset: str, backbone: str) -> Dict[str, Any]:
    """The paper's dataset, backbone, A_auc and A_last beside a row (``None`` where the paper has no such row:
    a subset of heads its decay table has not, an aggregation rule no row of it computed)."""
    if study == "heads":
        compared, backbone, numbers = sweep_paper_numbers("decays", name, "flyprompt", dataset, backbone)
        return {"paper_dataset": compared, "paper_backbone": backbone, "paper_A_auc": numbers and numbers[0],
                "paper_A_last": numbers and numbers[1]}
    table = ROUTING[name] if study == "routers" else _paper_aggregation(backbone, name)
    compared = paper_dataset(dataset, table)
    numbers = table.get(compared, (None, None))
    return {"paper_dataset": compared, "paper_backbone": backbone, "paper_A_auc": numbers[0], "paper_A_last": numbers[1]}


def _paper_aggregation(backbone: str, rule: str) -> Dict[str, Any]:
    """The paper's numbers of the row the official code computed as ``rule`` does; none for a rule of no row."""
    row = AGGREGATION_PAPER_ROWS[rule]
    return {} if row is None else AGGREGATIONS_BY_BACKBONE[backbone][row]


#: below the aggregation table: the rule without a paper row, and the one that is the paper's "Min Entropy"
AGGREGATION_NOTE = ("\nThe paper's Min Entropy row ran the official code's min_entropy, whose entropy is of the raw masked "
                    "logits: logit_min_entropy here (docs/ensemble.md). min_entropy here selects by the softmax's entropy "
                    "and predicts as softmax_min_entropy; no row of the paper's is computed so.")


def paper_label(row: Dict[str, Any]) -> str:
    """The "paper" cell of a study's row: the paper's dataset and backbone its numbers are of."""
    if row["paper_dataset"] is None:
        return "-"
    return f"{row['paper_dataset']}, {row['paper_backbone']}"


def table_cell(value: Optional[float], scale: float = 100.0, digits: int = 2) -> str:
    """``scale * value`` with ``digits`` decimals; ``-`` for a missing value."""
    return "-" if value is None else f"{scale * value:.{digits}f}"


#: why the ridge's milliseconds are blank in a run's table, and where they are
RIDGE_TIMING_NOTE = ("\nms: the four alternatives as timed in the run, on the expanded features it computed once; the ridge "
                     "(REAR) is fed by the method itself and not timed there: `python -m benchmarks.speed.router_timing` "
                     "times all five side by side.")


def format_study(rows: Sequence[Dict[str, Any]], study: str) -> str:
    """The rows as a markdown table (percent); "paper" names the paper's dataset and backbone the last two
    columns are of."""
    key = study[:-1]
    head = ["dataset", "method", "variant", key, "seeds", "A_auc", "A_last"]
    if study == "routers":
        head += ["routing (last)", "routing (anytime)", "ms/update", "ms/routed batch"]
    head += ["paper", "paper A_auc", "paper A_last"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["dataset"], row["method"], row["variant"], row[key], str(row["seeds"]), table_cell(row["A_auc"]),
                 table_cell(row["A_last"])]
        if study == "routers":
            cells += [table_cell(row["routing_last"]), table_cell(row["routing_anytime"]), table_cell(row["ms_per_update"], 1, 3),
                      table_cell(row["ms_per_routed_batch"], 1, 3)]
        cells += [paper_label(row), table_cell(row["paper_A_auc"], 1), table_cell(row["paper_A_last"], 1)]
        lines.append("| " + " | ".join(cells) + " |")
    if study == "routers":
        lines.append(RIDGE_TIMING_NOTE)
    elif study == "aggregations" and any(AGGREGATION_PAPER_ROWS.get(row[key]) is None for row in rows):
        lines.append(AGGREGATION_NOTE)
    return "\n".join(lines)


def write_study(output: Path, results: Iterable[Dict[str, Any]], study: str, name: Optional[str] = None) -> str:
    """Write ``study_<name>.md``, ``.json`` and the figure ``.png`` into ``output`` (``name``: the registered
    study that scored ``study``'s entries, ``study`` itself by default); returns the markdown."""
    rows = study_rows(results, study)
    text = format_study(rows, study)
    stem = f"study_{name or study}"
    (output / f"{stem}.md").write_text(text + "\n")
    (output / f"{stem}.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot_study(output, rows, study, name=name)
    return text
