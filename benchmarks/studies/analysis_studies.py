"""The analysis studies of ``cross_ablation.py --study NAME`` (the paper's Fig. 2b/2c, Fig. 3 and its CKA
figures, its RanPAC variants table and its components' cost table): what each runs by default and the
function writing its table, figure and JSON once the trainings are done.

``components-cost`` trains nothing (``python -m benchmarks.studies.components_cost``); ``routing`` reads
the diagnostics every run records, so on a folder whose runs exist (``--output`` of an earlier sweep with
these methods and variants) it trains nothing either.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Sequence

__all__ = ["AnalysisStudy", "ANALYSIS_STUDIES", "analysis_defaults", "write_analysis_study",
           "components_cost_error", "run_components_cost"]


@dataclass(frozen=True)
class AnalysisStudy:
    """A study's module (imported when used: its ``STUDY_METHODS`` and ``STUDY_VARIANTS`` are the defaults)
    and the function of it writing the table."""

    module: str
    writer: str

    def load(self) -> Any:
        return importlib.import_module(f"{__package__}.{self.module}")


ANALYSIS_STUDIES: Dict[str, AnalysisStudy] = {
    "cka": AnalysisStudy("cka_table", "write_cka"),
    "routing": AnalysisStudy("routing_oracle", "write_routing"),
    "ranpac": AnalysisStudy("ranpac_table", "write_ranpac"),
}


def analysis_defaults(args: argparse.Namespace) -> None:
    """Fill the methods and variants ``args.study`` runs where the user left them unset; for ``cka``, refuse
    a method that defines no common representation of its experts (before any data or training)."""
    module = ANALYSIS_STUDIES[args.study].load()
    args.methods = args.methods or list(module.STUDY_METHODS)
    args.variants = args.variants or list(module.STUDY_VARIANTS)
    if args.study == "cka":
        from ..core.errors import UsageError
        from ..methods import method_class
        from ..methods.base import PromptMethod

        known = [m for m in args.methods if _registered(m)]
        lacking = [m for m in known if method_class(m).common_features is PromptMethod.common_features]
        if lacking:
            raise UsageError(f"--study cka: {', '.join(lacking)} defines no common representation of its experts "
                             "(PromptMethod.common_features); choose from dualprompt, misa, mvp, flyprompt")


def _registered(name: str) -> bool:
    from ..methods import list_methods

    return name in list_methods()  # an unknown name is refused by the sweep's own check, with the list


def write_analysis_study(study: Optional[str], output: Path, results: Iterable[Dict[str, Any]]) -> str:
    """The markdown of ``study``'s table written into ``output`` (with its JSON and figure), prefixed for the
    sweep's printout; ``""`` when ``study`` is none of :data:`ANALYSIS_STUDIES`."""
    if study not in ANALYSIS_STUDIES:
        return ""
    writer = getattr(ANALYSIS_STUDIES[study].load(), ANALYSIS_STUDIES[study].writer)
    return f"\n\n{study} study (study_{study}.md):\n\n" + writer(output, list(results))


#: the options ``--study components-cost`` reads (it trains nothing)
COMPONENTS_COST_OPTIONS = ("study", "output", "expansion_dim", "num_experts")


def components_cost_error(given: Sequence[str]) -> Optional[str]:
    """What is wrong with ``--study components-cost`` and the options ``given``, or ``None``."""
    ignored = [name for name in given if name not in COMPONENTS_COST_OPTIONS]
    if ignored:
        flags = ", ".join("--" + name.replace("_", "-") for name in ignored)
        return (f"--study components-cost trains nothing and reads only --output, --expansion-dim and "
                f"--num-experts; drop {flags}")
    return None


def run_components_cost(args: argparse.Namespace) -> int:
    """``--study components-cost``: the breakdown at the paper's sizes (or ``--expansion-dim`` / ``--num-experts``)
    into ``--output``."""
    from .components_cost import main

    argv = ["--output", str(args.output or "results/components_cost")]
    argv += ["--expansion-dim", str(args.expansion_dim)] if getattr(args, "expansion_dim", None) else []
    argv += ["--experts", str(args.num_experts)] if getattr(args, "num_experts", None) else []
    return main(argv)
