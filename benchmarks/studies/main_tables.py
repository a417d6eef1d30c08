"""The paper's Tables 1 and 2 from a sweep's result files (``--study overall``, ``--study offline``): its
methods × datasets × A_auc / A_last, per backbone for Table 1, our numbers (mean ± standard deviation over
seeds) beside the paper's.

Each method alone is its ``baseline`` run, FlyPrompt its ``full`` run. A run's dataset is set beside the
paper's dataset ``paper_tables.compared_dataset`` names, its model beside the paper's backbone
``paper_rows.run_backbone`` names. A row of the paper's table without a run says why it has none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..backbone import BACKBONES
from .paper_numbers import FALLBACK_BACKBONE
from .paper_rows import OWN_VARIANTS, run_backbone
from .paper_tables import OFFLINE, OVERALL, PAPER_DATASETS, PAPER_LABELS, TABLE_1_NOT_OURS, compared_dataset
from .study_figures import plot_study
from .study_tables import seed_mean, seed_std, table_cell

__all__ = ["MAIN_TABLES", "MainTable", "study_methods", "main_table_rows", "format_main_table", "write_main_table"]

#: the paper's datasets in its tables' order
PAPER_ORDER = tuple(dict.fromkeys(PAPER_DATASETS.values()))


@dataclass(frozen=True)
class MainTable:
    """One of the paper's main tables: its name, and the backbones it has (``None``: every one of Table 1)."""

    study: str
    title: str
    backbone: Optional[str]

    def methods(self, backbone: str) -> Tuple[str, ...]:
        """The table's rows (our method names) for ``backbone``, in the paper's order."""
        if self.backbone is not None:
            return tuple(OFFLINE)
        return tuple(OVERALL.get(backbone, OVERALL["sup21k"]))

    def paper(self, backbone: str, method: str, dataset: str) -> Tuple[Optional[float], Optional[float]]:
        """The paper's (A_auc, A_last) of ``method`` on its ``dataset`` with ``backbone``."""
        if self.backbone is not None:
            rows = OFFLINE if backbone == self.backbone else {}
        else:
            rows = OVERALL.get(backbone, {})
        return rows.get(method, {}).get(dataset, (None, None))

    def not_ours(self, method: str) -> Optional[str]:
        return TABLE_1_NOT_OURS.get(method) if self.backbone is None else None


MAIN_TABLES = {
    "overall": MainTable("overall", "Table 1 (overall results)", None),
    "offline": MainTable("offline", "Table 2 (offline methods, Sup-21K)", "sup21k"),
}


def study_methods(study: str, registered: Sequence[str]) -> List[str]:
    """The methods a sweep of ``study`` trains by default: the table's, of all its backbones, that are
    ``registered`` and stand for their row."""
    table = MAIN_TABLES[study]
    names = [m for backbone in OVERALL for m in table.methods(backbone)] if table.backbone is None else table.methods("")
    return [m for m in dict.fromkeys(names) if m in registered and table.not_ours(m) is None]


def _runs(results: Iterable[Dict[str, Any]]) -> Dict[Tuple[Optional[str], str, str], List[Dict[str, Any]]]:
    """The runs of a method alone, by (backbone, dataset, method)."""
    groups: Dict[Tuple[Optional[str], str, str], List[Dict[str, Any]]] = {}
    for result in results:
        spec = result["spec"]
        if spec["variant"] in OWN_VARIANTS:
            key = (run_backbone(result.get("protocol")), spec["dataset"], spec["method"])
            groups.setdefault(key, []).append(result)
    return groups


def _datasets(groups: Dict[Tuple, Any], backbone: Optional[str]) -> List[str]:
    """The datasets of ``backbone``'s runs and each paper dataset no run is compared with, in the paper's order."""
    ran = {d for b, d, _ in groups if b == backbone}
    missing = {d for d in PAPER_ORDER if d not in {compared_dataset(r) for r in ran}}
    return sorted(ran | missing, key=lambda d: (PAPER_ORDER.index(compared_dataset(d)), d))


#: the reason of every row of a dataset the sweep ran nothing on (printed once, not per method)
NO_RUN_ON_DATASET = "no run on this dataset"


def _reason(table: MainTable, method: str, registered: Sequence[str], dataset_ran: bool) -> str:
    if not dataset_ran:
        return NO_RUN_ON_DATASET
    not_ours = table.not_ours(method)
    if not_ours:
        return not_ours
    if method not in registered:
        return f"no reference method {method} here (benchmarks/methods)"
    return "no run of it on this dataset and backbone in the results (add it to --methods)"


def _row(table: MainTable, backbone: str, dataset: str, method: str, runs: List[Dict[str, Any]],
         registered: Sequence[str], dataset_ran: bool) -> Dict[str, Any]:
    scores = [r["metrics"] for r in runs]
    paper = table.paper(backbone, method, compared_dataset(dataset))
    notes = sorted({r.get("notes") for r in runs if r.get("notes")})
    return {
        "table": table.study, "backbone": backbone, "dataset": dataset, "row": method,
        "label": PAPER_LABELS.get(method, method), "seeds": len(runs),
        "A_auc": seed_mean([s["A_auc"] for s in scores]), "A_auc_std": seed_std([s["A_auc"] for s in scores]),
        "A_last": seed_mean([s["A_last"] for s in scores]), "A_last_std": seed_std([s["A_last"] for s in scores]),
        "paper_dataset": compared_dataset(dataset), "paper_backbone": backbone, "paper_A_auc": paper[0],
        "paper_A_last": paper[1], "not_run": None if runs else _reason(table, method, registered, dataset_ran),
        "notes": notes,
    }


def main_table_rows(results: Iterable[Dict[str, Any]], study: str, registered: Sequence[str]) -> List[Dict[str, Any]]:
    """One row per (backbone, dataset, method of the paper's table): our seed means (fractions) and standard
    deviations of A_auc and A_last, the paper's (percent), or why there is no run. ``registered``: the
    methods this checkout has (``benchmarks.methods.list_methods()``)."""
    table = MAIN_TABLES[study]
    groups = _runs(results)
    backbones = sorted({b for b, _, _ in groups if b is not None}) or [table.backbone or FALLBACK_BACKBONE]
    rows = []
    for backbone in backbones:
        for method in table.methods(backbone):
            for dataset in _datasets(groups, backbone):
                runs = [] if table.not_ours(method) else groups.get((backbone, dataset, method), [])
                ran = any(key[:2] == (backbone, dataset) for key in groups)
                rows.append(_row(table, backbone, dataset, method, runs, registered, ran))
    return rows


def _ours(row: Dict[str, Any], metric: str) -> str:
    if row["not_run"]:
        return "not run"
    std = row[f"{metric}_std"]
    return table_cell(row[metric]) + ("" if std is None else f" ± {table_cell(std)}")


def _dataset_label(dataset: str) -> str:
    compared = compared_dataset(dataset)
    return dataset if compared == dataset else f"{dataset} (paper: {compared})"


def _section(rows: Sequence[Dict[str, Any]], title: str) -> List[str]:
    datasets = list(dict.fromkeys(row["dataset"] for row in rows))
    head = ["method"] + [f"{_dataset_label(d)} {m}" if i == 0 else m for d in datasets
                         for i, m in enumerate(("A_auc", "paper", "A_last", "paper"))]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in dict.fromkeys(row["row"] for row in rows):
        cells = [next(r["label"] for r in rows if r["row"] == method)]
        for dataset in datasets:
            row = next(r for r in rows if (r["row"], r["dataset"]) == (method, dataset))
            cells += [_ours(row, "A_auc"), table_cell(row["paper_A_auc"], 1), _ours(row, "A_last"),
                      table_cell(row["paper_A_last"], 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def format_main_table(rows: Sequence[Dict[str, Any]], study: str) -> str:
    """The rows as the paper's table, one section per backbone, then why each row without a run has none."""
    table = MAIN_TABLES[study]
    seeds = sorted({row["seeds"] for row in rows if row["seeds"]})
    lines = [f"{table.title}: A_auc / A_last in %, ours the mean ± standard deviation over "
             f"{'/'.join(map(str, seeds)) or 0} seed(s) of each method alone (its baseline run; FlyPrompt's full run), "
             "the paper's the mean over its five seeds of the dataset named; '-': the paper has no such number."]
    for backbone in dict.fromkeys(row["backbone"] for row in rows):
        lines += [""] + _section([r for r in rows if r["backbone"] == backbone], f"{table.title}, {BACKBONES[backbone].label}")
    reasons = {(row["label"], row["not_run"]) for row in rows if row["not_run"] not in (None, NO_RUN_ON_DATASET)}
    notes = {(row["label"], note) for row in rows for note in row["notes"]}
    unrun = list(dict.fromkeys(row["dataset"] for row in rows if row["not_run"] == NO_RUN_ON_DATASET))
    if reasons or notes or unrun:
        lines.append("")
    lines += [f"- {', '.join(unrun)}: no run of the results is on {'it' if len(unrun) == 1 else 'them'}."] if unrun else []
    lines += [f"- {label}: not run: {reason}." for label, reason in sorted(reasons)]
    lines += [f"- {label}: {note}" for label, note in sorted(notes)]
    return "\n".join(lines)


def write_main_table(output: Path, results: Iterable[Dict[str, Any]], study: str) -> str:
    """Write ``study_<study>.md``, ``.json`` and the figure ``.png`` into ``output``; returns the markdown."""
    from ..methods import list_methods

    rows = main_table_rows(results, study, list_methods())
    text = format_main_table(rows, study)
    (output / f"study_{study}.md").write_text(text + "\n")
    (output / f"study_{study}.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot_study(output, [r for r in rows if not r["not_run"]], study, key="row")
    return text
