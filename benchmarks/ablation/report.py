"""Tables and figures of a sweep: mean and standard deviation over seeds, differences from the baseline."""

from __future__ import annotations

import csv
import io
import math
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from ..core.files import save_figure
from ..core.method_names import METHOD_NAMES, METHOD_ORDER
from ..core.results import write_json_atomic, write_text_atomic
from ..core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS
from ..studies.paper_rows import paper_row, run_backbone
from .diagnostics import ROUTING_VERSIONS

__all__ = [
    "ABLATION_VARIANTS", "METRICS", "PAPER_NOTE", "summarize_results", "add_failures", "format_markdown",
    "write_tables",
    "plot_curves", "plot_paper_deltas", "verdicts",
]

VARIANT_ORDER = {name: i for i, name in enumerate((*ABLATION_VARIANTS, "full", *ORACLE_VARIANTS))}
METRICS = ("A_auc", "A_last", "A_avg", "F_last")
#: where the paper's numbers of each kind of row are from (``benchmarks.studies.paper_rows``)
PAPER_NOTE = (
    "Paper: the numbers of the paper's dataset and backbone named in the last column (5 seeds): its Sup-21K "
    "cross-ablation for the four variants of the methods it has, its components table for the linear probe and "
    "RanPAC†, Table 1 (else Table 2) for a method alone, and its appendix table of A_avg and F_last; paper Δ is "
    "the paper's A_auc difference from its baseline of the same table.")


def _row_order(key: tuple) -> tuple:
    dataset, method, variant = key
    return dataset, METHOD_ORDER.get(method, len(METHOD_ORDER)), method, VARIANT_ORDER.get(variant, 99), variant


def _paper_columns(runs: Sequence[Dict[str, Any]], dataset: str, method: str, variant: str) -> Dict[str, Any]:
    """The paper's numbers beside a row (``paper_rows.paper_row`` of the first run's backbone)."""
    backbone = run_backbone(runs[0].get("protocol"))
    return paper_row(method, variant, dataset, backbone).columns()


def _paper_deltas(rows: Sequence[Dict[str, Any]]) -> None:
    """``paper_A_auc_delta``: the paper's A_auc of the row minus its baseline's, where both come from one table."""
    baselines = {(r["dataset"], r["method"]): r for r in rows if r["variant"] == "baseline"}
    for row in rows:
        base = baselines.get((row["dataset"], row["method"]))
        paired = (row["variant"] != "baseline" and base is not None and row["paper_A_auc"] is not None
                  and base["paper_A_auc"] is not None and _table(row) == _table(base))
        row["paper_A_auc_delta"] = row["paper_A_auc"] - base["paper_A_auc"] if paired else None


def _table(row: Dict[str, Any]) -> Optional[str]:
    return (row.get("paper_source") or "").split(";")[0] or None


def summarize_results(results: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (dataset, method, variant), in the paper's method order: mean over seeds of each metric
    (in %), its sample standard deviation (``None`` with one seed), and the difference of the means from
    the method's baseline (``None`` for the baseline itself or without one)."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for result in results:
        spec = result["spec"]
        groups.setdefault((spec["dataset"], spec["method"], spec["variant"]), []).append(result)
    rows = []
    for (dataset, method, variant), runs in sorted(groups.items(), key=lambda kv: _row_order(kv[0])):
        row: Dict[str, Any] = {"dataset": dataset, "method": method, "variant": variant, "seeds": len(runs)}
        for metric in METRICS:
            values = np.array([100 * r["metrics"][metric] for r in runs], dtype=float)
            row[f"{metric}_mean"] = float(np.mean(values))
            row[f"{metric}_std"] = float(np.std(values, ddof=1)) if len(values) > 1 else None
        row["seconds_per_batch"] = float(np.mean([r["seconds_per_batch"] for r in runs]))
        row["peak_memory_mb"] = float(np.max([r["peak_memory_mb"] for r in runs]))
        row.update(_paper_columns(runs, dataset, method, variant))
        row.update(_diagnostics_means([r.get("diagnostics") for r in runs]))
        rows.append(row)
    members = list(dict.fromkeys(key for row in rows for key in row if key.startswith("member_")))
    for row in rows:  # every row has every column (None where it does not apply)
        for key in members:
            row.setdefault(key, None)
    _paper_deltas(rows)
    baselines = {(r["dataset"], r["method"]): r for r in rows if r["variant"] == "baseline"}
    for row in rows:
        base = baselines.get((row["dataset"], row["method"]))
        for metric in METRICS:
            own = row["variant"] != "baseline" and base is not None
            row[f"{metric}_delta"] = row[f"{metric}_mean"] - base[f"{metric}_mean"] if own else None
    return rows


def add_failures(rows: Sequence[Dict[str, Any]], failures: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``rows`` with the failed runs (``benchmarks.ablation.failures`` records): every row gains
    ``failed_seeds`` and ``error`` (the first failure's line); a (dataset, method, variant) with no finished
    seed becomes an error row: ``seeds`` 0 and every metric ``None``."""
    failed: Dict[tuple, List[Dict[str, Any]]] = {}
    for record in failures:
        spec = record["spec"]
        failed.setdefault((spec["dataset"], spec["method"], spec["variant"]), []).append(record)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    out = [{**row, "failed_seeds": [], "error": None} for row in rows]
    index = {(r["dataset"], r["method"], r["variant"]): r for r in out}
    for key, records in failed.items():
        row = index.get(key)
        if row is None:
            row = {**dict.fromkeys(columns), "dataset": key[0], "method": key[1], "variant": key[2], "seeds": 0}
            out.append(row)
        row["failed_seeds"] = sorted(record["spec"]["seed"] for record in records)
        row["error"] = records[0]["error"]
    return sorted(out, key=lambda r: _row_order((r["dataset"], r["method"], r["variant"])))


ROUTING_COLUMNS = [f"routing_{who}_{version}_{when}" for version in ROUTING_VERSIONS
                   for when in ("last", "anytime_mean") for who in ("own", "rear", "chance")]


def _mean_or_none(values: Sequence[Optional[float]]) -> Optional[float]:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(finite)) if finite else None


def _diagnostics_means(diagnostics: Sequence[Optional[Dict[str, Any]]]) -> Dict[str, Optional[float]]:
    """Means over seeds (in %) of the run records' diagnostics (docs/diagnostics.md); None without any."""
    found = [d for d in diagnostics if d]
    out: Dict[str, Optional[float]] = {}
    for column in ROUTING_COLUMNS:
        _, who, version, when = column.split("_", 3)
        # A record may lack a version: the mean is over those that have it.
        values = [d["routing"][who].get(version, {}).get(when) for d in found]
        out[column] = _mean_or_none([100 * v for v in values if v is not None])
    out["expert_matrix_contrast"] = _mean_or_none(
        [100 * d["expert_matrix"]["diagonal_minus_off_diagonal"] for d in found if d.get("expert_matrix")]
    )
    for name in dict.fromkeys(name for d in found for name in d.get("members", {})):
        for metric in ("A_auc", "A_last"):
            out[f"member_{name}_{metric}"] = _mean_or_none(
                [100 * d["members"][name][metric] for d in found if name in d.get("members", {})]
            )
    return out


#: Below this oracle gap (A_auc points) the verdict gives REAR's change, not the share of the gap it recovers.
MIN_GAP_POINTS = 1.0


def verdicts(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """One line per (dataset, method) with an oracle row: the oracle's A_auc gap over the method's own
    selection, and the share of it REAR recovers (docs/diagnostics.md)."""
    a_auc: Dict[tuple, Dict[str, float]] = {}
    for r in rows:
        a_auc.setdefault((r["dataset"], r["method"]), {})[r["variant"]] = r["A_auc_mean"]
    lines = []
    for (dataset, method), score in a_auc.items():
        name = f"{METHOD_NAMES.get(method, method)} ({dataset})"
        if "baseline" in score and "oracle" in score:
            gap = score["oracle"] - score["baseline"]
            rear = "" if "router" not in score else f"; REAR {score['router'] - score['baseline']:+.2f} points"
            if gap <= 0:
                lines.append(f"{name}: no gap (oracle - baseline A_auc {gap:+.2f} points): no router can gain here"
                             + rear)
            elif "router" not in score:
                lines.append(f"{name}: oracle gap {gap:.2f} points")
            elif gap < MIN_GAP_POINTS:  # a share of a near-zero gap is noise divided by noise
                lines.append(f"{name}: oracle gap {gap:.2f} points, too small to measure a share of it" + rear)
            else:
                recovered = 100 * (score["router"] - score["baseline"]) / gap
                lines.append(f"{name}: oracle gap {gap:.2f} points; REAR recovers {recovered:.0f}% of it")
        elif "full" in score and "oracle_both" in score:
            gap = score["oracle_both"] - score["full"]
            lines.append(f"{name}: its router is {gap:.2f} points of A_auc below the oracle (oracle_both - full)")
    return lines


def _percent(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.1f}"


def _diagnostics_markdown(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """Routing accuracy and forced-expert contrast per (dataset, method); ensemble members per variant."""
    trainings = {}
    for r in rows:
        if r.get("routing_own_modal_last") is not None:
            trainings.setdefault((r["dataset"], r["method"]), r)
    if not trainings:
        return []
    lines = [
        "",
        "Routing accuracy (%) at the end of the stream against the expert that trained most of the class / any "
        "expert that trained it / the first one (docs/diagnostics.md); "
        "contrast: diagonal minus mean off-diagonal of the forced-expert matrix (points).",
        "",
        "| dataset | method | own selection | REAR | chance | anytime mean own / REAR (modal) | contrast |",
        "|---|---|---|---|---|---|---|",
    ]
    for (dataset, method), r in trainings.items():
        pair = [" / ".join(_percent(r[f"routing_{who}_{version}_last"]) or "n/a" for version in ROUTING_VERSIONS)
                for who in ("own", "rear", "chance")]
        anytime = f"{_percent(r['routing_own_modal_anytime_mean'])} / {_percent(r['routing_rear_modal_anytime_mean'])}"
        lines.append(f"| {dataset} | {METHOD_NAMES.get(method, method)} | {' | '.join(pair)} | {anytime} | "
                     f"{_signed(r['expert_matrix_contrast'])} |")
    members = [key[len("member_"):-len("_A_auc")] for key in rows[0] if key.startswith("member_") and key.endswith("_A_auc")]
    ensemble_rows = [r for r in rows if r.get("member_ensemble_A_auc") is not None]
    if members and ensemble_rows:
        lines += ["", "A_auc (%) of each ensemble member alone, under the variant's selection.", "",
                  "| dataset | method | variant | " + " | ".join(members) + " |",
                  "|---|---|---|" + "---|" * len(members)]
        for r in ensemble_rows:
            cells = " | ".join(_percent(r[f"member_{m}_A_auc"]) for m in members)
            lines.append(f"| {r['dataset']} | {METHOD_NAMES.get(r['method'], r['method'])} | {r['variant']} | {cells} |")
    return lines


def _cell(row: Dict[str, Any], metric: str) -> str:
    std = row[f"{metric}_std"]
    return f"{row[f'{metric}_mean']:.2f} ± {'n/a' if std is None else f'{std:.2f}'}"


def _signed(value: Optional[float]) -> str:
    return "" if value is None or math.isnan(value) else f"{value:+.2f}"


def _paper(row: Dict[str, Any], metric: str) -> str:
    value = row.get(f"paper_{metric}")
    return "" if value is None else f"{value:.2f}"


def _paper_setting(row: Dict[str, Any]) -> str:
    """The paper's dataset, backbone and table the row's paper numbers are of; empty without any."""
    if not row.get("paper_source"):
        return ""
    return f"{row['paper_dataset']}, {row['paper_backbone']}: {row['paper_source']}"


def format_markdown(rows: Sequence[Dict[str, Any]], caption: str = "") -> str:
    """The table as Markdown, under a caption saying what the numbers are; failed runs (``add_failures``)
    in a table of their own below it."""
    failed = [r for r in rows if r.get("failed_seeds")]
    rows = [r for r in rows if r["seeds"]]
    seeds = sorted({r["seeds"] for r in rows})
    lines = [caption + "." if caption and not caption.endswith(".") else caption] if caption else []
    lines += [
        f"A_auc / A_last / A_avg / F_last in %, mean ± standard deviation over {'/'.join(map(str, seeds)) or 0} "
        "seed(s) (n/a: one seed); Δ is the difference of the means from the method's baseline (the same seeds, so "
        "paired). " + PAPER_NOTE,
        "",
        "| dataset | method | variant | seeds | A_auc | ΔA_auc | paper A_auc | paper Δ | A_last | ΔA_last | paper A_last "
        "| A_avg | paper A_avg | F_last | paper F_last | paper | s/batch | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {METHOD_NAMES.get(r['method'], r['method'])} | {r['variant']} | {r['seeds']} | "
            f"{_cell(r, 'A_auc')} | {_signed(r['A_auc_delta'])} | {_paper(r, 'A_auc')} | "
            f"{_signed(r.get('paper_A_auc_delta'))} | {_cell(r, 'A_last')} | {_signed(r['A_last_delta'])} | "
            f"{_paper(r, 'A_last')} | {_cell(r, 'A_avg')} | {_paper(r, 'A_avg')} | {_cell(r, 'F_last')} | "
            f"{_paper(r, 'F_last')} | {_paper_setting(r)} | {r['seconds_per_batch']:.3f} | {r['peak_memory_mb']:.0f} |"
        )
    lines += _diagnostics_markdown(rows)
    found = verdicts(rows)
    if found:
        lines += ["", *found]
    if failed:
        lines += ["", "Failed runs: not in the rows above; the sweep trains them again when rerun. Each traceback is "
                  "in failures/<dataset>/<method>/<variant>/seed<k>.json.", "",
                  "| dataset | method | variant | failed seeds | error |", "|---|---|---|---|---|"]
        lines += [f"| {r['dataset']} | {METHOD_NAMES.get(r['method'], r['method'])} | {r['variant']} | "
                  f"{','.join(map(str, r['failed_seeds']))} | {r['error'].replace('|', '/')} |" for r in failed]
    return "\n".join(lines)


def write_tables(output: Path, rows: Sequence[Dict[str, Any]], caption: str = "") -> str:
    """``table.md``, ``table.json`` and ``table.csv`` in ``output``; returns the Markdown."""
    markdown = format_markdown(rows, caption)
    write_text_atomic(output / "table.md", markdown + "\n")
    write_json_atomic(output / "table.json", list(rows))
    if rows:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomic(output / "table.csv", text.getvalue())
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
    save_figure(figure, path)
    plt.close(figure)
    return path


def plot_paper_deltas(output: Path, rows: Sequence[Dict[str, Any]]) -> Optional[Path]:
    """``deltas.png``: measured ΔA_auc of each variant (mean over seeds, error bar: the variant's standard
    deviation) beside the paper's Δ of the dataset and backbone compared, one group of bars per method and
    variant."""
    entries = [r for r in rows if r["A_auc_delta"] is not None and r.get("paper_A_auc_delta") is not None]
    if not entries:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no deltas.png", file=sys.stderr)
        return None
    labels = [f"{METHOD_NAMES.get(r['method'], r['method'])}\n+{r['variant']}"
              + (f"\n{r['dataset']}" if len({e['dataset'] for e in entries}) > 1 else "") for r in entries]
    x = np.arange(len(entries))
    measured = [r["A_auc_delta"] for r in entries]
    errors = [r["A_auc_std"] or 0.0 for r in entries]
    paper = [r["paper_A_auc_delta"] for r in entries]
    figure, axis = plt.subplots(figsize=(max(6, 0.9 * len(entries)), 3.8))
    axis.bar(x - 0.2, measured, 0.4, yerr=errors, capsize=2, label="measured ΔA_auc (this sweep)")
    compared = sorted({f"{r['paper_dataset']}, {r['paper_backbone']}" for r in entries})
    axis.bar(x + 0.2, paper, 0.4, label=f"paper ΔA_auc ({'; '.join(compared)})")
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xticks(x, labels, fontsize=7)
    axis.set_ylabel("ΔA_auc vs baseline (points)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    path = output / "deltas.png"
    save_figure(figure, path)
    plt.close(figure)
    return path
