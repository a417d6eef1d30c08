"""The paper's numbers beside one row of a sweep: a (method, variant) on a dataset and backbone, looked up in
the paper's tables (``paper_tables``, ``paper_numbers.COMPONENTS_BY_BACKBONE``) by one rule:

* a cross-ablation variant (``baseline``, ``router``, ``ensemble``, ``both``) of a method the paper's
  cross-ablation has, on Sup-21K: that table's A_auc and A_last;
* the linear probe and RanPAC†: the components table (its linear probe is ours, docs/methods.md);
* a method alone (``baseline``, or ``full`` for FlyPrompt): Table 1 of the backbone, else Table 2 (Sup-21K);
* A_avg and F_last of a method alone: the appendix table of them.

A run's dataset is compared with the paper's dataset ``paper_tables.compared_dataset`` names, its model
with the paper's backbone ``paper_numbers.paper_backbone`` names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from .paper_numbers import COMPONENTS_BY_BACKBONE, FALLBACK_BACKBONE, paper_backbone
from .paper_tables import AVERAGE_FORGETTING, CROSS_ABLATION, OFFLINE, OVERALL, TABLE_1_NOT_OURS, compared_dataset

__all__ = ["OWN_VARIANTS", "COMPONENT_KEYS", "PaperRow", "paper_row", "run_backbone"]

#: the variants that are a method alone, as the paper's main tables run it
OWN_VARIANTS = ("baseline", "full")

#: (method, variant) -> the row of the components table (``paper_numbers.COMPONENTS_BY_BACKBONE``)
COMPONENT_KEYS: Dict[Tuple[str, str], str] = {
    ("linear-probe", "baseline"): "linear_probe", ("linear-probe", "ensemble"): "linear_probe_ema",
    ("ranpac", "baseline"): "ranpac",
}


@dataclass(frozen=True)
class PaperRow:
    """The paper's numbers (percent; ``None`` where it has none) and where they are from."""

    dataset: str
    backbone: Optional[str]
    source: Optional[str] = None
    A_auc: Optional[float] = None
    A_last: Optional[float] = None
    A_avg: Optional[float] = None
    F_last: Optional[float] = None

    def columns(self) -> Dict[str, Any]:
        """The row's ``paper_*`` entries of a table."""
        return {f"paper_{name}": value for name, value in asdict(self).items()}


def run_backbone(protocol: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The paper's backbone of a run's recorded ``protocol`` (Sup-21K for none recorded); ``None`` where the
    protocol does not tell (two backbones sharing the model, no weights file to tell them apart)."""
    if not protocol or "model" not in protocol:
        return FALLBACK_BACKBONE
    try:
        return paper_backbone(protocol)
    except ValueError:
        return None


def _accuracy(method: str, variant: str, dataset: str, backbone: str) -> Tuple[Optional[str], Optional[Tuple]]:
    if backbone == "sup21k" and method in CROSS_ABLATION.get(variant, {}):
        return "cross-ablation", CROSS_ABLATION[variant][method][dataset]
    key = COMPONENT_KEYS.get((method, variant))
    if key is not None:
        numbers = COMPONENTS_BY_BACKBONE.get(backbone, {}).get(key, {})
        return ("components", numbers[dataset]) if dataset in numbers else (None, None)
    if variant not in OWN_VARIANTS:
        return None, None
    if method in OVERALL.get(backbone, {}) and method not in TABLE_1_NOT_OURS:
        return "Table 1", OVERALL[backbone][method][dataset]
    if backbone == "sup21k" and method in OFFLINE:
        return "Table 2", OFFLINE[method][dataset]
    return None, None


def paper_row(method: str, variant: str, dataset: str, backbone: Optional[str]) -> PaperRow:
    """The paper's numbers of ``method``'s ``variant`` on ``dataset`` (a run's name) with ``backbone``."""
    compared = compared_dataset(dataset)
    if backbone is None:
        return PaperRow(compared, None)
    source, accuracy = _accuracy(method, variant, compared, backbone)
    forgetting = AVERAGE_FORGETTING.get(backbone, {}).get(method, {}).get(compared)
    if variant not in OWN_VARIANTS or method in TABLE_1_NOT_OURS:
        forgetting = None
    if forgetting is not None:
        source = "A_avg/F_last table" if source is None else f"{source}; A_avg/F_last table"
    return PaperRow(compared, backbone, source, *(accuracy or (None, None)), *(forgetting or (None, None)))
