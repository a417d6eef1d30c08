"""The studies as options of ``cross_ablation.py``: ``--study NAME`` sets the sweep's defaults for the study
and, once the trainings are done, writes the study's table beside the paper's numbers; ``--backbone NAME``
selects one of the paper's backbones with its ridge."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..backbone import BACKBONES
from .analysis_studies import ANALYSIS_STUDIES, analysis_defaults
from .catalog import study_descriptions
from .registry import REGISTRY, resolve_hook

__all__ = ["MAIN_TABLE_STUDIES", "STUDIES", "cost_study_error", "run_cost_command", "run_cost_study", "study_defaults",
           "table_methods", "with_backbone"]

#: study -> what it runs: the registered studies (``benchmarks.studies.catalog``), then studies handled by hand
#: (an entry ``"name": "description"``; moving one onto the registry is one ``Study(...)`` in the catalog)
STUDIES: Dict[str, str] = {
    **study_descriptions(),
    "cka": "linear CKA between each pair of experts' features on the test set (Fig. 3 and the appendix CKA figures)",
    "routing": "each method's own routing accuracy and REAR's, A_last with the oracle (Fig. 2b, 2c), from the diagnostics",
    "ranpac": "RanPAC†, ‡ and * beside FlyPrompt (the appendix RanPAC table)",
    "components-cost": "parameters and storage of G, Q, the router head, the prompts and the TE2 heads (appendix)",
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


def study_defaults(args: argparse.Namespace, parse_value: Callable[[str, str], Any]) -> None:
    """Fill what ``args.study`` needs and the user left unset: its methods and variants, the protocol settings
    it fixes (``parse_value(flag name, text)`` reads a value as its flag does), what it scores on one training
    (routers, aggregation rules, heads)."""
    if args.study in ANALYSIS_STUDIES:  # benchmarks.studies.analysis_studies
        analysis_defaults(args)
    elif args.study in MAIN_TABLE_STUDIES:  # the paper's Tables 1 and 2 (benchmarks.studies.main_tables)
        args.methods = args.methods or table_methods(args.study)
        args.variants = args.variants or ["baseline"]  # FlyPrompt's is full (variants_for)
    else:
        _registered_defaults(args, parse_value)
    _refuse_methods_without_rows(args)


def _registered_defaults(args: argparse.Namespace, parse_value: Callable[[str, str], Any]) -> None:
    study = REGISTRY.get(args.study)
    if study is None:
        return
    args.methods = args.methods or study.names("methods") or None
    args.variants = args.variants or study.names("variants") or None
    if study.fixed:
        for name, text in study.fixed:
            if getattr(args, name, None) is None:
                setattr(args, name, parse_value(name, text))
    for name, values in study.scored:
        if getattr(args, name, None) is None:
            setattr(args, name, list(values))


#: the studies of the paper's Tables 1 and 2 (:mod:`benchmarks.studies.main_tables`)
MAIN_TABLE_STUDIES = ("overall", "offline")
#: studies whose table has a row for a fixed set of methods: where that set is read (``"module:NAME"``)
_FIXED_ROWS = {"components": "benchmarks.studies.components_table:STUDY_METHODS",
               "ranpac": "benchmarks.studies.ranpac_table:STUDY_METHODS"}


def table_methods(study: Optional[str]) -> Optional[List[str]]:
    """The methods ``study``'s table has a row of ours for; ``None`` where any method gets a row of its own."""
    if study in MAIN_TABLE_STUDIES:
        from ..methods import list_methods
        from .main_tables import study_methods

        return study_methods(study, list_methods())
    return list(resolve_hook(_FIXED_ROWS[study])) if study in _FIXED_ROWS else None


def _refuse_methods_without_rows(args: argparse.Namespace) -> None:
    """A method the study's table has no row of ours for would be trained and shown nowhere: one line, before
    any work."""
    rows = table_methods(args.study)
    lacking = [method for method in args.methods or () if rows is not None and method not in rows]
    if lacking:
        from ..core.errors import UsageError

        raise UsageError(f"--study {args.study} --methods {','.join(lacking)}: the study's table has no row of ours "
                         f"for {', '.join(lacking)}; its rows are {', '.join(rows)} (run other methods without --study)")


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


def run_cost_command(args: argparse.Namespace, given: Sequence[str]) -> int:
    """``--study cost`` with the options ``given``: its options checked (one line, exit status 2), then the table."""
    from ..core.errors import UsageError

    error = cost_study_error(args, given)
    if error:
        raise UsageError(error)
    return run_cost_study(args)


def run_cost_study(args: argparse.Namespace) -> int:
    """``--study cost``: the cost table (``benchmarks.studies.cost``) of ``--methods`` into ``--output``, with
    the timings of the sweep already in ``--output`` when there is one."""
    from .cost import main

    output = Path(args.output or "results/cost")
    argv = ["--output", str(output)] + (["--methods", ",".join(args.methods)] if args.methods else [])
    return main(argv + (["--results", str(output)] if (output / "runs").is_dir() else []))
