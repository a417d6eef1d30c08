"""Subsets of the temporal ensemble's heads scored on one training (the EMA-decay study): ``online`` (the online
head alone) or ``0.9/0.99`` (the online head and the EMA copies of those decays), aggregated with the run's rule.

The EMA copies never feed back into training, so a training with the decays 0.9, 0.99 and 0.999 holds every
subset of the paper's decay table; each is scored as ``<variant>#<subset>``
(:class:`benchmarks.ablation.evaluation.VariantEvaluator`).
"""

from __future__ import annotations

from typing import List, Sequence

__all__ = ["PAPER_HEAD_SETS", "head_set_decays", "head_set_members"]

#: the rows of the paper's EMA-decay table, in its order
PAPER_HEAD_SETS = ("online", "0.9", "0.99", "0.999", "0.9/0.99", "0.9/0.99/0.999")


def head_set_decays(name: str) -> List[float]:
    """The EMA decays of the subset ``name`` (``[]`` for ``online``); ``ValueError`` for a malformed name."""
    if name == "online":
        return []
    try:
        decays = [float(text) for text in name.split("/")]
    except ValueError:
        raise ValueError(f"a head subset is 'online' or decays joined by '/', e.g. 0.9/0.99; got {name!r}") from None
    if len(set(decays)) != len(decays):
        raise ValueError(f"head subset {name!r} names a decay twice")
    return decays


def head_set_members(name: str, member_names: Sequence[str]) -> List[int]:
    """The members (0: the online head, then ``ema_<decay>``) of the subset ``name``; ``ValueError`` when the
    run has no EMA copy of one of its decays."""
    members = [0]
    for decay in head_set_decays(name):
        member = f"ema_{decay:g}"
        if member not in member_names:
            raise ValueError(f"head subset {name!r}: the run has no EMA copy of decay {decay:g} (its heads: "
                             f"{', '.join(member_names)}); add it to --decays")
        members.append(list(member_names).index(member))
    return members
