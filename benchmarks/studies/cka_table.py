"""The CKA study's table and figure (the paper's Fig. 3 and its appendix CKA figures): for each dataset and
method, the experts' linear CKA matrix on the residual features (each expert's minus the common
representation, the paper's), mean over seeds, from the runs' ``diagnostics["cka"]``
(``benchmarks.studies.cka``). The paper's matrices are images with no number in its text, so there is
no paper column; the figure draws ours as the paper does, one heatmap per dataset, one row per method.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from ..core.files import save_figure
from ..core.method_names import METHOD_NAMES, METHOD_ORDER
from .study_figures import pyplot_or_none
from .study_tables import table_cell

__all__ = ["STUDY_METHODS", "STUDY_VARIANTS", "cka_rows", "format_cka", "write_cka"]

#: the methods of the paper's figures (MVP: Fig. 3; MISA and FlyPrompt: the appendix)
STUDY_METHODS = ("mvp", "misa", "flyprompt")
STUDY_VARIANTS = ("baseline",)


def _off_diagonal(matrix: np.ndarray) -> np.ndarray:
    return matrix[~np.eye(len(matrix), dtype=bool)]


def cka_rows(results: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (dataset, method, trained experts): the residual and raw CKA matrices, mean over seeds
    (each training once, whichever of its variant records holds it), and the mean off-diagonal entries."""
    trainings: Dict[tuple, Dict[str, Any]] = {}
    for result in results:
        spec, cka = result["spec"], (result.get("diagnostics") or {}).get("cka")
        if cka is not None:
            trainings.setdefault((spec["dataset"], spec["method"], spec["seed"]), cka)
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for (dataset, method, _), cka in trainings.items():
        groups.setdefault((dataset, method, tuple(cka["experts"])), []).append(cka)
    rows = []
    for (dataset, method, experts), found in sorted(groups.items(), key=lambda item: _order(item[0])):
        residual = np.mean([np.array(c["residual"], dtype=float) for c in found], axis=0)
        raw = np.mean([np.array(c["raw"], dtype=float) for c in found], axis=0)
        off = _off_diagonal(residual)
        rows.append({"dataset": dataset, "method": method, "experts": list(experts), "seeds": len(found),
                     "samples": found[0]["samples"], "residual": residual.tolist(), "raw": raw.tolist(),
                     "residual_off_diagonal_mean": float(np.nanmean(off)) if off.size else None,
                     "raw_off_diagonal_mean": float(np.nanmean(_off_diagonal(raw))) if off.size else None})
    return rows


def _order(key: tuple) -> tuple:
    dataset, method, experts = key
    return dataset, METHOD_ORDER.get(method, len(METHOD_ORDER)), method, experts


def format_cka(rows: Sequence[Dict[str, Any]]) -> str:
    """Markdown: one summary line per row, then each residual matrix (rows and columns: the experts)."""
    lines = ["Linear CKA between experts on the test set, at the end of the stream, mean over seeds. Residual: "
             "each expert's features minus the common representation (the paper's figures); raw: the features "
             "themselves. The paper's matrices are images without numbers: no paper column.", "",
             "| dataset | method | seeds | experts | test images | mean off-diagonal (residual) | mean off-diagonal (raw) |",
             "|" + "---|" * 7]
    for r in rows:
        lines.append(f"| {r['dataset']} | {METHOD_NAMES.get(r['method'], r['method'])} | {r['seeds']} | "
                     f"{len(r['experts'])} | {r['samples']} | {table_cell(r['residual_off_diagonal_mean'], 1, 3)} | "
                     f"{table_cell(r['raw_off_diagonal_mean'], 1, 3)} |")
    for r in rows:
        head = [f"E{e + 1}" for e in r["experts"]]
        lines += ["", f"{r['dataset']}, {METHOD_NAMES.get(r['method'], r['method'])} (residual):", "",
                  "| | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 1)]
        lines += [f"| {name} | " + " | ".join(table_cell(v, 1, 3) for v in values) + " |"
                  for name, values in zip(head, r["residual"])]
    return "\n".join(lines)


def plot_cka(output: Path, rows: Sequence[Dict[str, Any]]) -> Optional[Path]:
    """``study_cka.png``: one heatmap per (method, dataset), methods as rows, datasets as columns, as the
    paper's figures (one figure per method, its three datasets side by side)."""
    if not rows:
        return None
    plt = pyplot_or_none("study_cka.png")
    if plt is None:
        return None
    methods = list(dict.fromkeys(r["method"] for r in rows))
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    figure, axes = plt.subplots(len(methods), len(datasets), figsize=(3.6 * len(datasets), 3.0 * len(methods)),
                                squeeze=False)
    for axis in axes.flat:
        axis.axis("off")
    for r in rows:
        axis = axes[methods.index(r["method"]), datasets.index(r["dataset"])]
        _heatmap(axis, np.array(r["residual"], dtype=float), [f"E{e + 1}" for e in r["experts"]])
        axis.set_title(f"{METHOD_NAMES.get(r['method'], r['method'])}, {r['dataset']}", fontsize=9)
    figure.tight_layout(pad=1.5)
    path = output / "study_cka.png"
    save_figure(figure, path)
    plt.close(figure)
    return path


def _heatmap(axis: Any, matrix: np.ndarray, names: Sequence[str]) -> None:
    axis.axis("on")
    low = float(np.nanmin(matrix)) if np.isfinite(matrix).any() else 0.0
    low = low if low < 1.0 else 0.0
    # The colours span the matrix's own range (CKA near 1 everywhere would be one colour on [0, 1]).
    image = axis.imshow(matrix, vmin=low, vmax=1.0, cmap="viridis")
    axis.set_xticks(range(len(names)), names, fontsize=7)
    axis.set_yticks(range(len(names)), names, fontsize=7)
    for (i, j), value in np.ndenumerate(matrix):
        if np.isfinite(value):
            bright = (value - low) / (1.0 - low) > 0.6
            axis.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=6, color="black" if bright else "white")
    axis.figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04)


def write_cka(output: Path, results: Iterable[Dict[str, Any]]) -> str:
    """Write ``study_cka.md``, ``.json`` and ``.png`` into ``output``; returns the markdown."""
    rows = cka_rows(results)
    text = format_cka(rows)
    (output / "study_cka.md").write_text(text + "\n")
    (output / "study_cka.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot_cka(output, rows)
    return text
