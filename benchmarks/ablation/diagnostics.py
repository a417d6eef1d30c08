"""What a run measures besides accuracy: which expert trained each class, how often a selection finds
it, and how much the forced expert matters. Definitions are in docs/diagnostics.md.

Everything here is counts accumulated on the device and turned into plain floats and lists (JSON) at
the end; :class:`ExpertUsage` is training state with ``state_dict``.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence

import numpy as np
import torch
from torch import Tensor

from ..parallel import WHOLE_BATCH, BatchShare

__all__ = ["ExpertUsage", "routing_summary", "expert_matrix_summary"]


class ExpertUsage:
    """``(classes, experts)`` counts of training sample-forwards: class ``c`` trained through expert ``e``.

    Every training forward (each online iteration) adds its samples, with the expert of its selection
    (``expert_of(selection)``) and the label the method sees (exposure-indexed).
    """

    def __init__(self, num_classes: int, num_experts: int, device: torch.device) -> None:
        self.num_experts = int(num_experts)
        self.counts = torch.zeros(int(num_classes), self.num_experts, dtype=torch.long, device=device)

    def add(self, targets: Tensor, experts: Tensor, parallel: BatchShare = WHOLE_BATCH) -> None:
        """Count one training forward's samples (summed over the processes sharing the batch)."""
        cells = targets.to(self.counts.device) * self.num_experts + experts.to(self.counts.device)
        counts = torch.bincount(cells, minlength=self.counts.numel()).view_as(self.counts)
        self.counts += parallel.sum(counts)

    def modal_expert(self) -> Tensor:
        """``(classes,)`` the expert that trained most of each class's samples (lowest id on ties), -1 if none."""
        modal = self.counts.argmax(dim=1)
        return torch.where(self.counts.sum(dim=1) > 0, modal, torch.full_like(modal, -1))

    def first_expert(self) -> Tensor:
        """``(classes,)`` the lowest expert id that trained each class, -1 if none.

        With experts that start in order (sessions, sample budgets) this is the expert that was training
        when the class first appeared: the one HiDe-Prompt's task-identity gate maps a class to.
        """
        trained = self.counts > 0
        first = trained.int().argmax(dim=1)
        return torch.where(trained.any(dim=1), first, torch.full_like(first, -1))

    def trained_any(self) -> Tensor:
        """``(classes, experts)`` bool: the expert trained at least one sample of the class."""
        return self.counts > 0

    def trained_experts(self) -> Tensor:
        """``(experts,)`` bool: the expert trained at least one sample."""
        return self.counts.sum(dim=0) > 0

    def state_dict(self) -> Dict[str, Tensor]:
        return {"counts": self.counts.clone()}

    def load_state_dict(self, state: Dict[str, Tensor]) -> None:
        if state["counts"].shape != self.counts.shape:
            raise ValueError(
                f"ExpertUsage.load_state_dict: expected counts of shape {tuple(self.counts.shape)}, "
                f"got {tuple(state['counts'].shape)}"
            )
        self.counts.copy_(state["counts"])


def _fraction(hits: float, total: float) -> float:
    return hits / total if total else math.nan


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


#: What a routed expert is compared with: the expert that trained most of the sample's class, any expert
#: that trained it, the first expert that trained it (docs/diagnostics.md).
ROUTING_VERSIONS = ("modal", "any", "first")


def routing_summary(
    entries: Sequence[Dict[str, Any]], selections: Sequence[str] = ("own", "rear", "chance"),
) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Routing accuracies from the evaluator's per-evaluation hit counts.

    Returns ``{who: {version: {"last", "anytime_mean"}}}`` for ``who`` in ``own``, ``rear``, ``chance``
    (and the routing study's routers, by name) and ``version`` in ``modal``, ``any``, ``first``: fractions
    at the last evaluation (the end of the stream) and the mean over the anytime evaluations (NaN for a
    version the entries do not count).
    """
    summary: Dict[str, Dict[str, Dict[str, float]]] = {}
    anytime = [e for e in entries if e["kind"] == "anytime"]
    for who in selections:
        summary[who] = {}
        for version in ROUTING_VERSIONS:
            key = f"{who}_{version}"
            last = _fraction(entries[-1].get(key, math.nan), entries[-1]["samples"]) if entries else math.nan
            mean = _mean([_fraction(e.get(key, math.nan), e["samples"]) for e in anytime])
            summary[who][version] = {"last": last, "anytime_mean": mean}
    return summary


def expert_matrix_summary(correct: Tensor, sizes: Tensor, experts: Tensor) -> Dict[str, Any]:
    """The group x forced-expert accuracy matrix and its diagonal minus its mean off-diagonal entry.

    ``correct[g, e]``: test samples whose modal true expert is ``g``, right with expert ``e`` forced;
    ``sizes[g]``: samples of group ``g``; ``experts``: bool, the trained experts (the columns). Rows are
    the groups that have test samples.
    """
    columns = torch.nonzero(experts.cpu()).flatten()
    rows = torch.nonzero(sizes.cpu() > 0).flatten()
    accuracy = correct.cpu().double()[rows][:, columns] / sizes.cpu().double()[rows].unsqueeze(1)
    diagonal = rows.unsqueeze(1) == columns.unsqueeze(0)
    on = accuracy[diagonal]
    off = accuracy[~diagonal]
    contrast = (float(on.mean()) - float(off.mean())) if on.numel() and off.numel() else math.nan
    return {
        "groups": rows.tolist(),
        "experts": columns.tolist(),
        "group_sizes": sizes.cpu()[rows].tolist(),
        "accuracy": accuracy.tolist(),
        "diagonal_minus_off_diagonal": contrast,
    }


def member_summary(names: List[str], logs: Sequence[Any]) -> Dict[str, Dict[str, float]]:
    """``{member: {"A_auc", "A_last"}}`` of an ensemble's members' evaluation logs."""
    from ..core.metrics import a_auc, a_last

    return {name: {"A_auc": a_auc(log), "A_last": a_last(log)} for name, log in zip(names, logs)}
