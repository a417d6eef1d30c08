"""The studies as options of ``cross_ablation.py``: ``--study NAME`` sets the sweep's defaults for the study
and, once the trainings are done, writes the study's table beside the paper's numbers; ``--backbone NAME``
selects one of the paper's backbones with its ridge."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from ..backbone import BACKBONES

__all__ = ["STUDIES", "cost_study_error", "run_cost_study", "study_defaults", "with_backbone"]

#: study -> what it runs (``cost`` trains nothing: ``python -m benchmarks.studies.cost``)
STUDIES: Dict[str, str] = {
    "routers": "the five routers on REAR's expanded features, scored in the routed variants of one training",
    "aggregations": "the TE2 aggregation rules (the paper's six, and min_entropy), scored in the ensemble variants of one training",
    "cost": "parameters, BWT and seconds per batch of every method (python -m benchmarks.studies.cost)",
    "components": "RanPAC†, the linear probe with and without EMA heads, FlyPrompt with and without them",
    "overall": "the paper's Table 1: each method of it alone (baseline; FlyPrompt full), A_auc and A_last per dataset",
    "offline": "the paper's Table 2 (offline methods, Sup-21K): each method of it alone, as --study overall",
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
    elif args.study in ("overall", "offline"):
        from ..methods import list_methods
        from .main_tables import study_methods

        args.methods = args.methods or study_methods(args.study, list_methods())
        args.variants = args.variants or ["baseline"]  # FlyPrompt's is full (variants_for)


#: the options ``--study cost`` reads (it trains nothing: every other option would be ignored)
COST_STUDY_OPTIONS = ("study", "methods", "output")


def cost_study_error(args: argparse.Namespace, given: Sequence[str]) -> Optional[str]:
    """What is wrong with ``--study cost`` and the options ``given`` (set by the user), or ``None``: it trains
    nothing, so an option it would ignore is refused, as is a method the cost table lacks."""
    from .cost import METHODS

    ignored = [name for name in given if name not in COST_STUDY_OPTIONS]
    if ignored:
        flags = ", ".join("--" + name.replace("_", "-") for name in ignored)
        return f"--study cost trains nothing and reads only --methods and --output; drop {flags}"
    unknown = [name for name in args.methods or () if name not in METHODS]
    if unknown:
        return f"--methods: the cost table has no {', '.join(unknown)}; choose from {', '.join(METHODS)}"
    return None


def run_cost_study(args: argparse.Namespace) -> int:
    """``--study cost``: the cost table (``benchmarks.studies.cost``) of ``--methods`` into ``--output``, with
    the timings of the sweep already in ``--output`` when there is one."""
    from .cost import main

    output = Path(args.output or "results/cost")
    argv = ["--output", str(output)] + (["--methods", ",".join(args.methods)] if args.methods else [])
    return main(argv + (["--results", str(output)] if (output / "runs").is_dir() else []))
