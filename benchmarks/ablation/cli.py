"""Cross-ablation of the analytic router and the temporal ensemble: methods x variants x datasets x seeds.

    python benchmarks/cross_ablation.py                  # the default: preset proxy-short, < 10 min on 2 cores
    python benchmarks/cross_ablation.py --preset proxy   # the CPU proxy benchmark (docs/proxy.md)
    python benchmarks/cross_ablation.py --preset paper   # the paper's protocol (GPU, real data, ViT-B/16)

Each finished run is written to ``<output>/runs/<dataset>/<method>/<variant>/seed<k>.json`` (atomically),
and rerunning the same command skips finished runs. The table is printed and written as ``table.md``,
``table.csv`` and ``table.json`` with ``curves.png`` and ``deltas.png``; ``<output>`` defaults to
``results/<preset>``. Every value is checked before any data or model work; usage and environment
errors print one line and exit with status 2. A training that fails becomes error rows in the tables and
the sweep goes on (exit status 1). Several sweeps may share one output folder (``claims.py``). Nothing is
downloaded without ``--download``.

This module is the entry, :func:`main`; the flags are in ``arguments.py``, the checks before any data in
``sweep.py`` and ``preflight.py``, the trainings and tables in ``execution.py``, ``--plan`` and ``--shard``
in ``cost.py``.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Optional, Sequence

from benchmarks.ablation import preflight
from benchmarks.ablation.arguments import UsageError, build_parser, protocol_value
from benchmarks.ablation.claims import ClaimHeldError
from benchmarks.ablation.execution import execute
from benchmarks.ablation.sweep import resolve
from benchmarks.ablation.sweep_points import run_points
from benchmarks.ablation.work_plan import run_plan
from benchmarks.backbone import BackboneLoadError, downloads_allowed
from benchmarks.core.checkpointing import CheckpointError
from benchmarks.core.results import ProtocolMismatchError, WriteError
from benchmarks.data.records import DatasetNotFoundError
from benchmarks.studies.analysis_studies import components_cost_error, run_components_cost
from benchmarks.studies.command import study_defaults
from benchmarks.studies.registry import REGISTRY, Study, resolve_hook

#: what a user's values or environment provoke: one line on stderr and exit status 2, no traceback
USAGE_ERRORS = (UsageError, preflight.PreflightError, DatasetNotFoundError, BackboneLoadError, ProtocolMismatchError,
                CheckpointError, WriteError, ClaimHeldError)


def _given_options(args) -> list:
    """The options of ``args`` whose values differ from the parser's defaults (the ones the user set)."""
    defaults = vars(build_parser().parse_args([]))
    return [name for name, value in vars(args).items() if value != defaults.get(name)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns the exit status (2 with one line on stderr for usage and environment errors)."""
    try:
        args = build_parser().parse_args(argv)
        study = _study(args)
        if study is not None and study.command:  # a study that trains nothing (cost)
            return resolve_hook(study.command)(args, _given_options(args))
        if args.study == "components-cost":  # trains nothing either (benchmarks.studies.analysis_studies)
            error = components_cost_error(_given_options(args))
            if error:
                raise UsageError(error)
            return run_components_cost(args)
        study_defaults(args, protocol_value)
        if study is not None and study.points:
            return run_points(args, study, argv)
        sweep = resolve(args)
        if sum((args.plan, args.shard is not None, args.merge)) > 1:
            raise UsageError("--plan, --shard and --merge exclude each other (see --help)")
        if args.plan:  # fetches nothing: checks and probes on what is on this machine
            return run_plan(sweep, data_root=args.data_root, argv=argv)
        preflight.check(sweep)
        with downloads_allowed(args.download):
            return execute(sweep, data_root=args.data_root, download=args.download, resume=not args.no_resume,
                           show_progress=not args.no_progress, checkpoint_every=args.checkpoint_every, argv=argv,
                           shard=args.shard, merge=args.merge)
    except USAGE_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _study(args) -> Optional[Study]:
    """The registered study of ``--study``, or the study ``--sweep`` makes of one setting (``None``: neither,
    or a study handled by hand)."""
    if args.sweep is None:
        return REGISTRY.get(args.study)
    study = REGISTRY.get(args.study)
    if study is not None and (study.points or study.command):
        raise UsageError(f"--study {args.study} sets its own points; --sweep varies one setting of a sweep or of a "
                         "study scored on one training")
    field = args.sweep[0].changes[0][0]
    base = study or Study(f"sweep_{field}", "")
    return replace(base, name=f"sweep_{field}", points=args.sweep, figure=_sweep_figure(field))


def _sweep_figure(field: str) -> str:
    """A numeric setting is drawn as a line against its values (M with the router's storage), others as bars."""
    return {"expansion_dim": "storage", "ridge": "line"}.get(field, "bars")


if __name__ == "__main__":
    sys.exit(main())
