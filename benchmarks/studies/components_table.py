"""The components study's table (the paper's ``ablation_results``), from a sweep's result files, beside the
paper's numbers of the run's backbone (``paper_numbers.paper_backbone``: Sup-21K or Sup-21K/1K, the two
backbones of that table; Sup-21K for the proxy's tiny ViT).

Each row toggles FlyPrompt's components (REAR, prompt experts, EMA heads) or is RanPAC†; it is read from
one run's metrics, or from one member of an ensemble run's diagnostics (FlyPrompt with the online head
alone is the ``online`` member of its ``full`` run: its own routing, no EMA heads). A row no method here
expresses says so instead of a number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from .paper_numbers import COMPONENTS_BY_BACKBONE, compared_backbone, paper_dataset
from .study_figures import plot_study
from .study_tables import paper_label, seed_mean, seed_std, table_cell

__all__ = ["COMPONENT_ROWS", "NOT_RUN", "ComponentRow", "component_rows", "format_components", "write_components"]

#: why the prompt-expert rows without REAR are not run
NOT_RUN = ("FlyPrompt selects its prompt experts with REAR only; the official code has no switch for another "
           "selection, and the paper does not say which one these rows use")


@dataclass(frozen=True)
class ComponentRow:
    """One row: its key in ``paper_numbers.COMPONENTS``, the components (``"yes"``, ``"no"``, ``"-"``: not
    applicable) and where its numbers come from (``method``/``variant`` and an ensemble ``member``, or
    ``None``: not run)."""

    key: str
    label: str
    rear: str
    prompts: str
    ema: str
    method: Optional[str] = None
    variant: Optional[str] = None
    member: Optional[str] = None


COMPONENT_ROWS = (
    ComponentRow("ranpac", "RanPAC† (random-projection analytic classifier)", "-", "-", "-", "ranpac", "baseline"),
    ComponentRow("linear_probe", "linear probe (the row − × ×)", "-", "no", "no", "linear-probe", "baseline"),
    ComponentRow("linear_probe_ema", "linear probe + EMA heads (the row − × ✓)", "-", "no", "yes", "linear-probe",
                 "ensemble"),
    ComponentRow("prompts", "prompt experts", "no", "yes", "no"),
    ComponentRow("prompts_ema", "prompt experts + EMA heads", "no", "yes", "yes"),
    ComponentRow("prompts_rear", "prompt experts + REAR (FlyPrompt, online head)", "yes", "yes", "no", "flyprompt",
                 "full", "online"),
    ComponentRow("flyprompt", "FlyPrompt", "yes", "yes", "yes", "flyprompt", "full"),
)

#: which of the paper's rows the linear probe stands for, and which it does not
LINEAR_PROBE_NOTE = (
    "linear probe: the rows − × × and − × ✓ are FlyPrompt with REAR, prompt experts and EMA heads switched off: a "
    "frozen backbone and FlyPrompt's online head trained as FlyPrompt trains it (batch logit mask, Adam 0.005), "
    "which `linear-probe` is. The Linear Probe of the paper's Table 1 (49.69 / 23.07 on CIFAR-100, Sup-21K) is "
    "another training, whose recipe the paper does not give and no official script runs; `--study overall` "
    "prints it as not run")

#: the methods and variants a sweep of the study runs
STUDY_METHODS = tuple(dict.fromkeys(row.method for row in COMPONENT_ROWS if row.method))
STUDY_VARIANTS = ("baseline", "ensemble")


def _scores(result: Dict[str, Any], member: Optional[str]) -> Optional[Dict[str, float]]:
    if member is None:
        return result["metrics"]
    return ((result.get("diagnostics") or {}).get("members") or {}).get(member)


def component_rows(results: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (dataset, backbone compared with, component row): seed means of A_auc and A_last, the
    paper's beside them (its CIFAR-100 numbers for a dataset it has not)."""
    runs = [((r["spec"]["dataset"], compared_backbone("components", r["protocol"])), r) for r in results]
    rows = []
    for dataset, backbone in dict.fromkeys(compared for compared, _ in runs):
        for row in COMPONENT_ROWS:
            found = [_scores(r, row.member) for compared, r in runs if compared == (dataset, backbone)
                     and (r["spec"]["method"], r["spec"]["variant"]) == (row.method, row.variant)]
            found = [scores for scores in found if scores is not None]
            numbers = COMPONENTS_BY_BACKBONE[backbone][row.key]
            compared = paper_dataset(dataset, numbers)
            paper = numbers[compared]
            rows.append({
                "dataset": dataset, "row": row.key, "label": row.label, "REAR": row.rear, "prompt_experts": row.prompts,
                "EMA_heads": row.ema, "source": _source(row), "seeds": len(found),
                "A_auc": seed_mean([s["A_auc"] for s in found]), "A_last": seed_mean([s["A_last"] for s in found]),
                "A_auc_std": seed_std([s["A_auc"] for s in found]),
                "paper_dataset": compared, "paper_backbone": backbone, "paper_A_auc": paper[0],
                "paper_A_last": paper[1],
            })
    return rows


def _source(row: ComponentRow) -> str:
    if row.method is None:
        return "not run"
    return f"{row.method}/{row.variant}" + (f" ({row.member} member)" if row.member else "")


def format_components(rows: Sequence[Dict[str, Any]]) -> str:
    """The rows as a markdown table (percent) beside the paper's numbers of the dataset and backbone named in
    "paper" (CIFAR-100 for a dataset the paper has not, the generated data)."""
    head = ["dataset", "row", "REAR", "prompt experts", "EMA heads", "from", "seeds", "A_auc", "A_last", "paper",
            "paper A_auc", "paper A_last"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["dataset"], row["label"], row["REAR"], row["prompt_experts"], row["EMA_heads"], row["source"],
                 str(row["seeds"]), table_cell(row["A_auc"], 100), table_cell(row["A_last"], 100), paper_label(row),
                 table_cell(row["paper_A_auc"], 1), table_cell(row["paper_A_last"], 1)]
        lines.append("| " + " | ".join(cells) + " |")
    if any(row["source"] == "not run" for row in rows):
        lines.append(f"\nnot run: {NOT_RUN}.")
    if any(row["row"].startswith("linear_probe") for row in rows):
        lines.append(f"\n{LINEAR_PROBE_NOTE}.")
    return "\n".join(lines)


def write_components(output: Path, results: Iterable[Dict[str, Any]]) -> str:
    """Write ``study_components.md``, ``.json`` and the figure ``.png`` into ``output``; returns the markdown."""
    rows = component_rows(results)
    text = format_components(rows)
    (output / "study_components.md").write_text(text + "\n")
    (output / "study_components.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot_study(output, rows, "components", key="row")
    return text
