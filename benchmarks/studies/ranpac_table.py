"""The RanPAC variants study's table (the paper's ``ranpac_vs_flyprompt``): RanPAC† (``ranpac``), RanPAC‡
(``ranpac-frozen``), RanPAC* (``ranpac-collect``) and FlyPrompt (``full``), one row per dataset and method,
seed means of A_auc and A_last beside the paper's (Sup-21K; its CIFAR-100 numbers for a dataset it has not,
the proxy's generated data). The variants themselves: ``benchmarks.methods.ranpac_variants``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence

from .analysis_numbers import RANPAC_VARIANTS, RANPAC_VARIANTS_BACKBONE
from .paper_numbers import paper_dataset
from .study_figures import plot_study
from .study_tables import paper_label, seed_mean, seed_std, table_cell

__all__ = ["RANPAC_ROWS", "STUDY_METHODS", "STUDY_VARIANTS", "ranpac_rows", "format_ranpac", "write_ranpac"]

#: (method, variant, the paper's label), in the paper's order
RANPAC_ROWS = (("ranpac", "baseline", "RanPAC†"), ("ranpac-frozen", "baseline", "RanPAC‡"),
               ("ranpac-collect", "baseline", "RanPAC*"), ("flyprompt", "full", "FlyPrompt"))
STUDY_METHODS = tuple(method for method, _, _ in RANPAC_ROWS)
STUDY_VARIANTS = ("baseline",)  # FlyPrompt runs it as "full"


def ranpac_rows(results: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (dataset, RanPAC row) with at least one run: seed means, the paper's beside them."""
    runs: Dict[tuple, List[Dict[str, float]]] = {}
    for result in results:
        spec = result["spec"]
        runs.setdefault((spec["dataset"], spec["method"], spec["variant"]), []).append(result["metrics"])
    rows = []
    for dataset in dict.fromkeys(dataset for dataset, _, _ in runs):
        for method, variant, label in RANPAC_ROWS:
            found = runs.get((dataset, method, variant), [])
            if not found:
                continue
            compared = paper_dataset(dataset, RANPAC_VARIANTS[method])
            paper = RANPAC_VARIANTS[method][compared]
            rows.append({"dataset": dataset, "row": label, "method": method, "variant": variant, "seeds": len(found),
                         "A_auc": seed_mean([m["A_auc"] for m in found]), "A_last": seed_mean([m["A_last"] for m in found]),
                         "A_auc_std": seed_std([m["A_auc"] for m in found]),
                         "A_last_std": seed_std([m["A_last"] for m in found]), "paper_dataset": compared,
                         "paper_backbone": RANPAC_VARIANTS_BACKBONE, "paper_A_auc": paper[0], "paper_A_last": paper[1]})
    return rows


def format_ranpac(rows: Sequence[Dict[str, Any]]) -> str:
    """Markdown (percent): mean ± s.d. over seeds, the paper's five-seed means beside them."""
    head = ["dataset", "method", "seeds", "A_auc", "A_last", "paper", "paper A_auc", "paper A_last"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        auc = table_cell(r["A_auc"]) + ("" if r["A_auc_std"] is None else f" ± {table_cell(r['A_auc_std'])}")
        last = table_cell(r["A_last"]) + ("" if r["A_last_std"] is None else f" ± {table_cell(r['A_last_std'])}")
        lines.append(f"| {r['dataset']} | {r['row']} ({r['method']}) | {r['seeds']} | {auc} | {last} | "
                     f"{paper_label(r)} | {table_cell(r['paper_A_auc'], 1)} | {table_cell(r['paper_A_last'], 1)} |")
    return "\n".join(lines)


def write_ranpac(output: Path, results: Iterable[Dict[str, Any]]) -> str:
    """Write ``study_ranpac.md``, ``.json`` and the figure ``.png`` into ``output``; returns the markdown."""
    rows = ranpac_rows(results)
    text = format_ranpac(rows)
    (output / "study_ranpac.md").write_text(text + "\n")
    (output / "study_ranpac.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot_study(output, [{k: v for k, v in r.items() if k not in ("method", "variant")} for r in rows], "ranpac",
               key="row")
    return text
