"""The cross-ablation's variants: which expert selection and which head each one evaluates.

Neither the analytic router nor the temporal ensemble changes training, so every variant of a
(method, seed, dataset) is an inference-time choice on one trained model: a selection (the method's
own, the router's, or the oracle's true expert) and a head (the online head or the ensemble).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

__all__ = [
    "Variant", "VARIANTS", "ABLATION_VARIANTS", "ORACLE_VARIANTS", "SELECTIONS", "skipped_variants", "variants_for",
]

SELECTIONS = ("own", "routed", "oracle")


@dataclass(frozen=True)
class Variant:
    """``selection`` is ``"own"``, ``"routed"`` or ``"oracle"``; ``head`` is ``"online"`` or ``"ensemble"``."""

    name: str
    selection: str
    head: str


VARIANTS: Dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("baseline", "own", "online"),  # the method as published
        Variant("router", "routed", "online"),  # + REAR at inference
        Variant("ensemble", "own", "ensemble"),  # + TE2
        Variant("both", "routed", "ensemble"),
        Variant("oracle", "oracle", "online"),  # selection forced to the true expert
        Variant("oracle_both", "oracle", "ensemble"),
        Variant("full", "own", "ensemble"),  # a method with both built in: its own selection is its router's
    )
}
ABLATION_VARIANTS = ("baseline", "router", "ensemble", "both")
ORACLE_VARIANTS = ("oracle", "oracle_both")


def variants_for(method_class: type, requested: Sequence[str]) -> List[str]:
    """The variants a method runs for ``requested``, in that order.

    A method with the router and the ensemble built in (``builtin_components``) is one variant for all
    four ablation variants, ``full``; the oracle variants apply to every method. A method whose experts
    a router cannot choose (``router_refusal``) runs no routed variant, one whose head EMA copies cannot
    stand for (``ensemble_refusal``) no ensemble variant (:func:`skipped_variants`).
    """
    unknown = [name for name in requested if name not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; expected some of {list(VARIANTS)}")
    skipped = skipped_variants(method_class, requested)
    requested = [name for name in requested if name not in skipped]
    if not method_class.builtin_components:
        if "full" in requested:
            raise ValueError(f"variant 'full' is a method with the router and the ensemble built in; "
                             f"{method_class.__name__} has neither built in")
        return list(requested)
    chosen: List[str] = []
    for name in requested:
        name = "full" if name in ABLATION_VARIANTS else name
        if name not in chosen:
            chosen.append(name)
    return chosen


def skipped_variants(method_class: type, requested: Sequence[str]) -> Dict[str, str]:
    """The requested variants ``method_class`` does not run, each with the reason: the routed ones of a
    method with a ``router_refusal``, the ensemble ones of a method with an ``ensemble_refusal``."""
    routed = getattr(method_class, "router_refusal", "")
    ensembled = getattr(method_class, "ensemble_refusal", "")
    skipped: Dict[str, str] = {}
    for name in requested:
        variant = VARIANTS.get(name)
        if variant is None:
            continue
        if routed and variant.selection == "routed":
            skipped[name] = routed
        elif ensembled and variant.head == "ensemble":
            skipped[name] = ensembled
    return skipped
