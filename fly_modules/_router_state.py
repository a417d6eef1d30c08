"""The entries of an :class:`~fly_modules.AnalyticRouter` checkpoint, checked before anything is loaded (private).

The router's ``_load_from_state_dict`` is all or nothing: every entry it will read is checked here first, so a
refused checkpoint leaves the router (its statistics and its pending rows) as it was.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

import torch
from torch import Tensor

from ._checkpoint import check_entry, checkpoint_entries, holds_any
from ._validation import InvalidParameterError

__all__ = ["CALLER", "PENDING_ENTRIES", "STATISTICS_ENTRIES", "check_statistics", "saved_pending_rows"]

CALLER = "AnalyticRouter.load_state_dict"
#: the entries the statistics need together
STATISTICS_ENTRIES = ("expansion.weight", "gram", "cross", "counts")
#: the rows not yet folded into G and Q, saved as they wait (checkpoint version 3 on)
PENDING_ENTRIES = ("pending_phi", "pending_ids")
_LAYOUT = "build the router with in_features and expansion_dim of the checkpoint's router"


def check_statistics(entries: Dict[str, Tensor], prefix: str, weight_shape: Tuple[int, int]) -> None:
    """The expansion, ``G``, ``Q`` and the counts of a checkpoint fit a router whose expansion is ``weight_shape``."""
    m = weight_shape[0]
    check_entry(entries["expansion.weight"], prefix + "expansion.weight", weight_shape, caller=CALLER, fix=_LAYOUT)
    check_entry(entries["gram"], prefix + "gram", (m, m), caller=CALLER, fix=_LAYOUT)
    check_entry(entries["cross"], prefix + "cross", (m, None), caller=CALLER, fix=_LAYOUT)
    experts = entries["cross"].shape[1]
    check_entry(entries["counts"], prefix + "counts", (experts,), caller=CALLER, integer=True)


def saved_pending_rows(state_dict: Mapping[str, Any], prefix: str, width: int, experts: int) -> Tuple[Tensor, Tensor]:
    """The checkpoint's pending rows ``(rows, width)`` and their expert ids, checked; empty in a checkpoint that
    predates them (version < 3)."""
    if not holds_any(state_dict, prefix, PENDING_ENTRIES):
        return torch.zeros(0, width, dtype=torch.float64), torch.zeros(0, dtype=torch.long)
    entries = checkpoint_entries(state_dict, prefix, PENDING_ENTRIES, caller=CALLER)
    phi, ids = entries["pending_phi"], entries["pending_ids"]
    check_entry(phi, prefix + "pending_phi", (None, width), caller=CALLER)
    check_entry(ids, prefix + "pending_ids", (phi.shape[0],), caller=CALLER, integer=True)
    if ids.numel() and not bool(((ids >= 0) & (ids < experts)).all()):
        raise InvalidParameterError(
            f"{CALLER}: checkpoint entry {prefix}pending_ids holds expert ids outside 0..{experts - 1} "
            f"(the checkpoint's {experts} experts)"
        )
    return phi, ids
