"""The figure of a study's points, in the paper's form: one panel per (dataset, method, variant).

``bars`` (masks, ratios, tasks x experts): A_auc of each point beside the paper's. ``line`` (lambda): A_auc against
the varied value on a log axis, the seeds' standard deviation as error bars. ``storage`` (M, the paper's Fig. 5
a-c): the same line with the router's storage at each M as bars on a second axis (:func:`router_storage_mb`:
the bytes of an :class:`fly_modules.AnalyticRouter`'s state, its G, Q and random projection).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..core.files import save_figure
from .registry import Study
from .study_figures import draw_panel, panel_grid, pyplot_or_none, study_series

__all__ = ["feature_width", "plot_points", "router_storage_mb"]


def router_storage_mb(in_features: int, num_experts: int, expansion_dim: int) -> float:
    """MiB of the state of an :class:`fly_modules.AnalyticRouter` of these sizes (built on the meta device:
    nothing is allocated)."""
    from fly_modules import AnalyticRouter

    router = AnalyticRouter(in_features, num_experts, expansion_dim=expansion_dim, device="meta")
    return sum(t.numel() * t.element_size() for t in router.state_dict().values() if isinstance(t, torch.Tensor)) / 2**20


def feature_width(protocol: Dict[str, Any]) -> int:
    """The width of the backbone's features (REAR's input) of a recorded ``protocol`` (timm, meta device)."""
    import timm

    with torch.device("meta"):
        model = timm.create_model(protocol["model"], pretrained=False, num_classes=0, **protocol.get("model_kwargs", {}))
    return int(model.num_features)


def plot_points(path: Path, rows: Sequence[Dict[str, Any]], study: Study) -> Optional[Path]:
    """Write the figure of ``rows`` (:func:`benchmarks.studies.sweep_table.point_rows`) to ``path``; ``None``
    when nothing was measured or matplotlib is not installed."""
    panels = [s for s in study_series(rows, study.name, key="point") if any(v is not None for v in s["measured"])]
    if not panels:
        return None
    plt = pyplot_or_none(path.name)
    if plt is None:
        return None
    figure, axes = panel_grid(plt, panels)
    for axis, series in zip(axes.flat, panels):
        if study.figure == "bars":
            draw_panel(axis, series)
        else:
            _draw_line(axis, series, _panel_rows(rows, series["panel"]), storage=study.figure == "storage")
    for axis in list(axes.flat)[len(panels):]:
        axis.axis("off")
    figure.tight_layout()
    save_figure(figure, path)
    plt.close(figure)
    return path


def _panel_rows(rows: Sequence[Dict[str, Any]], panel: tuple) -> List[Dict[str, Any]]:
    return [row for row in rows if (row["dataset"], row["method"], row["variant"]) == tuple(panel)]


def _draw_line(axis: Any, series: Dict[str, Any], rows: Sequence[Dict[str, Any]], *, storage: bool) -> None:
    """A_auc against the point's value (log axis); with ``storage``, the router's MiB at each M as bars."""
    (field,) = {name for row in rows for name in row["setting"]}
    x = np.array([float(row["setting"][field]) for row in rows])
    measured = np.array([np.nan if v is None else v for v in series["measured"]], dtype=float)
    errors = np.array([0.0 if v is None else v for v in series["errors"]], dtype=float)
    if storage:
        width = feature_width(rows[0]["protocol"])
        mib = [router_storage_mb(width, row["protocol"]["num_experts"], int(value)) for row, value in zip(rows, x)]
        bars = axis.twinx()
        bars.bar(x, mib, width=0.3 * x, color="lightgray", zorder=0, label="router storage (MiB)")
        bars.set_ylabel("router storage (MiB)")
        axis.set_zorder(bars.get_zorder() + 1)
        axis.patch.set_visible(False)
    axis.errorbar(x, measured, yerr=errors, marker="o", capsize=2, label="measured (bars: s.d. over seeds)")
    axis.set_xscale("log")
    axis.set_xlabel(field)
    axis.set_ylabel("A_auc (%)")
    axis.set_title(" / ".join(map(str, series["panel"])), fontsize=9)
    axis.legend(fontsize=7, loc="lower right")
