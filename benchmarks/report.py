"""Tables and figures of a sweep: mean and standard deviation over seeds, differences from the baseline."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from .results import write_json_atomic

__all__ = ["ABLATION_VARIANTS", "METRICS", "summarize_results", "format_markdown", "write_tables", "plot_curves"]

ABLATION_VARIANTS = ("baseline", "router", "ensemble", "both")
VARIANT_ORDER = {name: i for i, name in enumerate((*ABLATION_VARIANTS, "full"))}
METRICS = ("A_auc", "A_last", "A_avg", "F_last")


def summarize_results(results: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (dataset, method, variant): mean/std over seeds of each metric (in %) and the
    difference of the means from the method's baseline."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for result in results:
        spec = result["spec"]
        groups.setdefault((spec["dataset"], spec["method"], spec["variant"]), []).append(result)
    rows = []
    for (dataset, method, variant), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], VARIANT_ORDER.get(kv[0][2], 99))):
        row: Dict[str, Any] = {"dataset": dataset, "method": method, "variant": variant, "seeds": len(runs)}
        for metric in METRICS:
            values = np.array([100 * r["metrics"][metric] for r in runs], dtype=float)
            row[f"{metric}_mean"] = float(np.mean(values))
            row[f"{metric}_std"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        row["seconds_per_batch"] = float(np.mean([r["seconds_per_batch"] for r in runs]))
        row["peak_memory_mb"] = float(np.max([r["peak_memory_mb"] for r in runs]))
        rows.append(row)
    baselines = {(r["dataset"], r["method"]): r for r in rows if r["variant"] == "baseline"}
    for row in rows:
        base = baselines.get((row["dataset"], row["method"]))
        for metric in METRICS:
            row[f"{metric}_delta"] = (row[f"{metric}_mean"] - base[f"{metric}_mean"]) if base else math.nan
    return rows


def _cell(row: Dict[str, Any], metric: str) -> str:
    return f"{row[f'{metric}_mean']:.2f} ± {row[f'{metric}_std']:.2f}"


def _delta(row: Dict[str, Any], metric: str) -> str:
    value = row[f"{metric}_delta"]
    return "" if math.isnan(value) or row["variant"] == "baseline" else f"{value:+.2f}"


def format_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    lines = [
        "| dataset | method | variant | seeds | A_auc | ΔA_auc | A_last | ΔA_last | F_last | s/batch | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['method']} | {r['variant']} | {r['seeds']} | {_cell(r, 'A_auc')} | "
            f"{_delta(r, 'A_auc')} | {_cell(r, 'A_last')} | {_delta(r, 'A_last')} | {_cell(r, 'F_last')} | "
            f"{r['seconds_per_batch']:.3f} | {r['peak_memory_mb']:.0f} |"
        )
    return "\n".join(lines)


def write_tables(output: Path, rows: Sequence[Dict[str, Any]]) -> str:
    markdown = format_markdown(rows)
    (output / "table.md").write_text(markdown + "\n")
    write_json_atomic(output / "table.json", list(rows))
    if rows:
        with open(output / "table.csv", "w", newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return markdown


def plot_curves(output: Path, results: Sequence[Dict[str, Any]]) -> Optional[Path]:
    """Anytime accuracy (mean over seeds) per method and variant, one panel per (dataset, method)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no curves.png", file=sys.stderr)
        return None
    panels: Dict[tuple, Dict[str, List[Dict[str, Any]]]] = {}
    for result in results:
        spec = result["spec"]
        panels.setdefault((spec["dataset"], spec["method"]), {}).setdefault(spec["variant"], []).append(result)
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.5 * rows), squeeze=False)
    for axis, ((dataset, method), variants) in zip(axes.flat, sorted(panels.items())):
        for variant, runs in sorted(variants.items(), key=lambda kv: VARIANT_ORDER.get(kv[0], 99)):
            curves = []
            for r in runs:
                anytime = [e for e in r["log"]["records"] if e["kind"] == "anytime"]
                curves.append(([e["samples_seen"] for e in anytime],
                               [100 * sum(e["correct"]) / max(sum(e["total"]), 1) for e in anytime]))
            length = min(len(c[0]) for c in curves)
            x = curves[0][0][:length]
            y = np.mean([c[1][:length] for c in curves], axis=0)
            axis.plot(x, y, label=variant)
        axis.set_title(f"{method} on {dataset}")
        axis.set_xlabel("stream samples")
        axis.set_ylabel("anytime accuracy (%)")
        axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(panels):]:
        axis.axis("off")
    figure.tight_layout()
    path = output / "curves.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
