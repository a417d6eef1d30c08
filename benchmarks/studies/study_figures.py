"""The studies' figures (``study_<name>.png``): the measured A_auc of each router, rule or component, mean
over seeds with their standard deviation as error bar where there are several, beside the paper's number,
one panel per (dataset, method, variant) of the study's table rows (``benchmarks.studies.study_tables``).

:func:`study_series` is what is plotted, read from the rows alone; :func:`plot_study` draws it. A study
whose rows name their entries by another key than the singular of its name passes ``key``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..backbone import BACKBONES
from ..core.files import save_figure

__all__ = ["PANEL_KEYS", "draw_panel", "panel_grid", "plot_study", "pyplot_or_none", "study_series"]

#: what tells one panel from another, where the rows have it
PANEL_KEYS = ("dataset", "method", "variant")




def panel_grid(plt: Any, panels: Sequence[Dict[str, Any]]) -> Any:
    """``(figure, axes)``: up to three panels a row, each as wide as its longest series of names."""
    columns = min(3, len(panels))
    count = -(-len(panels) // columns)
    width = max(len(s["names"]) for s in panels)
    return plt.subplots(count, columns, figsize=(max(4.0, 0.8 * width) * columns, 3.6 * count), squeeze=False)

def pyplot_or_none(figure: str) -> Optional[Any]:
    """matplotlib's pyplot on the Agg backend; ``None``, with one line on stderr saying that ``figure`` is not
    drawn, where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install -e '.[bench]'): no {figure}", file=sys.stderr)
        return None
    return plt

def _percent(value: Optional[float]) -> Optional[float]:
    return None if value is None else 100.0 * value


def study_series(rows: Sequence[Dict[str, Any]], study: str, key: Optional[str] = None) -> List[Dict[str, Any]]:
    """One panel per (dataset, method, variant), in the rows' order: ``{"panel", "names", "measured", "errors",
    "seeds", "paper", "paper_dataset", "paper_backbone"}``, in percent; an error or a paper number the rows lack
    is ``None``."""
    key = key or study[:-1]
    panels: Dict[tuple, Dict[str, Any]] = {}
    for row in rows:
        panel = tuple(row[name] for name in PANEL_KEYS if name in row)
        series = panels.setdefault(panel, {"panel": panel, "names": [], "measured": [], "errors": [], "seeds": [],
                                           "paper": [], "paper_dataset": row.get("paper_dataset"),
                                           "paper_backbone": row.get("paper_backbone")})
        series["names"].append(row[key])
        series["measured"].append(_percent(row["A_auc"]))
        series["errors"].append(_percent(row.get("A_auc_std")))
        series["seeds"].append(row["seeds"])
        series["paper"].append(row.get("paper_A_auc"))
    return list(panels.values())


def plot_study(output: Path, rows: Sequence[Dict[str, Any]], study: str, key: Optional[str] = None,
               name: Optional[str] = None) -> Optional[Path]:
    """Write ``study_<name or study>.png`` into ``output`` from the study's table rows; ``None`` when there is
    nothing measured to plot or matplotlib is not installed."""
    panels = [s for s in study_series(rows, study, key) if any(v is not None for v in s["measured"])]
    if not panels:
        return None
    plt = pyplot_or_none(f"study_{name or study}.png")
    if plt is None:
        return None
    figure, axes = panel_grid(plt, panels)
    for axis, series in zip(axes.flat, panels):
        draw_panel(axis, series)
    for axis in list(axes.flat)[len(panels):]:
        axis.axis("off")
    figure.tight_layout()
    path = output / f"study_{name or study}.png"
    save_figure(figure, path)
    plt.close(figure)
    return path


def _backbone_label(name: Optional[str]) -> Optional[str]:
    """The paper's name of a ``BACKBONES`` preset (``None`` for rows that name none)."""
    return None if name is None else BACKBONES[name].label


def _nan(values: Sequence[Optional[float]]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def draw_panel(axis: Any, series: Dict[str, Any]) -> None:
    """Measured bars (error bars where there are several seeds) and, where the paper has them, its bars."""
    x = np.arange(len(series["names"]))
    seeds = sorted({count for count in series["seeds"] if count}) or [0]  # of the entries measured
    errors = _nan(series["errors"])
    axis.bar(x - 0.2, _nan(series["measured"]), 0.4, yerr=None if np.isnan(errors).all() else np.nan_to_num(errors),
             capsize=2,
             label=f"measured ({'/'.join(map(str, seeds))} seed{'s' if seeds != [1] else ''}"
                   f"{'' if np.isnan(errors).all() else ', bars: s.d.'})")
    paper = _nan(series["paper"])
    if not np.isnan(paper).all():
        compared = [series.get("paper_dataset"), _backbone_label(series.get("paper_backbone"))]
        axis.bar(x + 0.2, paper, 0.4, label=f"paper ({', '.join(filter(None, compared))}, 5 seeds)")
    axis.set_xticks(x, series["names"], fontsize=7, rotation=20)
    axis.set_title(" / ".join(map(str, series["panel"])), fontsize=9)
    axis.set_ylabel("A_auc (%)")
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)  # below: bars stay visible
