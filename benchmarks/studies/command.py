"""The studies as options of ``cross_ablation.py``: ``--study NAME`` sets the sweep's defaults for the study
and, once the trainings are done, writes the study's table beside the paper's numbers; ``--backbone NAME``
selects one of the paper's backbones with its ridge."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any, Dict

from ..backbone import BACKBONES

__all__ = ["STUDIES", "run_cost_study", "study_defaults", "with_backbone"]

#: study -> what it runs (``cost`` trains nothing: ``python -m benchmarks.studies.cost``)
STUDIES: Dict[str, str] = {
    "routers": "the five routers on REAR's expanded features, scored in the routed variants of one training",
    "aggregations": "the six TE2 aggregation rules, scored in the ensemble variants of one training",
    "cost": "parameters, BWT and seconds per batch of every method (python -m benchmarks.studies.cost)",
    "components": "RanPAC†, the linear probe with and without EMA heads, FlyPrompt with and without them",
}


def with_backbone(protocol: Any, args: argparse.Namespace) -> Any:
    """``protocol`` on the backbone ``args.backbone``: its timm model at 224 pixels, weights from ``--weights``
    or the cache, the paper's ridge unless ``--ridge`` is given."""
    preset = BACKBONES[args.backbone]
    return replace(
        protocol, model=preset.model, model_kwargs=args.model_kwargs or {}, weights=args.weights,
        image_size=args.image_size or 224, ridge=args.ridge if args.ridge is not None else preset.ridge,
    )


def study_defaults(args: argparse.Namespace) -> None:
    """Fill what ``args.study`` needs and the user left unset (the variants it scores in)."""
    if args.study == "routers" and args.variants is None:
        args.variants = ["router", "both"]  # FlyPrompt: full, its own router replaced
    elif args.study == "aggregations" and args.variants is None:
        args.variants = ["ensemble", "both"]
    elif args.study == "components":
        from .components_table import STUDY_METHODS, STUDY_VARIANTS

        args.methods = args.methods or list(STUDY_METHODS)
        args.variants = args.variants or list(STUDY_VARIANTS)


def run_cost_study(args: argparse.Namespace) -> int:
    """``--study cost``: the cost table (``benchmarks.studies.cost``) into ``--output``."""
    from .cost import main

    return main(["--output", str(args.output or "results/cost")])
