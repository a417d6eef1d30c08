"""A study's points (``--study NAME`` with points, or ``--sweep NAME=v1,...``): one sweep per point, each in its
own folder ``<output>/sweep/<setting>=<value>`` with its own run files, then one table of every point.

Every point is resolved (its values and environment checked) before the first trains, so a bad point ends the
command in one line before any work. ``--plan`` prices each point and prints the study's total.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

from benchmarks.ablation import preflight
from benchmarks.ablation.arguments import PROTOCOL_FLAGS, UsageError
from benchmarks.ablation.execution import execute
from benchmarks.ablation.preemption import RESUMABLE_EXIT_CODE
from benchmarks.ablation.run_specs import run_specs
from benchmarks.ablation.sweep import Sweep, resolve
from benchmarks.ablation.sweep_values import point_arguments
from benchmarks.ablation.work_plan import run_plan
from benchmarks.backbone import downloads_allowed
from benchmarks.core.plan_file import PLAN_FILE, read_plan
from benchmarks.core.results import load_results
from benchmarks.flags import output_problem
from benchmarks.studies.registry import Study, SweepPoint
from benchmarks.studies.sweep_table import table_name, write_points

__all__ = ["PointsRun", "run_points"]


class PointsRun:
    """The sweeps of one study's points, resolved: ``[(point, sweep)]`` under ``base``."""

    def __init__(self, args: argparse.Namespace, study: Study) -> None:
        self.study, self.args = study, args
        self.base = Path(args.output or Path("results") / args.preset)
        varied = sorted({name for point in study.points for name, _ in point.changes})
        given = [name for name in varied if getattr(args, name, None) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise UsageError(f"{flag} is what the {study.name} study varies (its points set it); drop {flag}")
        self.sweeps: List[Tuple[SweepPoint, Sweep]] = []
        for point in study.points:
            try:
                self.sweeps.append((point, resolve(point_arguments(args, point, PROTOCOL_FLAGS, self.base))))
            except UsageError as error:
                raise UsageError(f"{study.name}, point {point.label}: {error}") from None
        self.check_outputs()

    def check_outputs(self) -> None:
        """Before the first point trains: every point's folder and the study's table files in the base folder
        can be written (a file where a later point's folder goes would stop the study after hours)."""
        stem = table_name(self.study)
        for _, sweep in self.sweeps:
            preflight.check_output(sweep.output, sweep.log)
        problem = output_problem(self.base, "folder", {f"{stem}.{suffix}": "file" for suffix in ("md", "json", "png")})
        if problem:
            raise UsageError(f"--output {self.base}: {problem} (choose another --output)")

    def plan(self, argv: Optional[Sequence[str]]) -> int:
        """``--plan`` of every point, then the study's total device time."""
        total = 0.0
        for point, sweep in self.sweeps:
            print(f"== {self.study.name}: {point.label} ({sweep.output})", flush=True)
            run_plan(sweep, data_root=self.args.data_root, argv=argv)
            total += read_plan(sweep.output / PLAN_FILE)["total_seconds"]["ours"]
        print(f"{self.study.name}: {len(self.sweeps)} points, {total / 3600:.2f} device-hours in all (the sum of "
              "each point's plan above)")
        return 0

    def execute(self, argv: Optional[Sequence[str]]) -> int:
        """Train every point (each its own sweep), then the points' table; the worst exit status."""
        args, statuses = self.args, []
        for point, sweep in self.sweeps:
            print(f"== {self.study.name}: {point.label} ({sweep.output})", flush=True)
            preflight.check(sweep)
            with downloads_allowed(args.download):
                status = execute(sweep, data_root=args.data_root, download=args.download, resume=not args.no_resume,
                                 show_progress=not args.no_progress, checkpoint_every=args.checkpoint_every,
                                 argv=argv, shard=args.shard, merge=args.merge)
            statuses.append(status)
            if status == RESUMABLE_EXIT_CODE:
                return status
        if args.shard is None:
            print(self.write_table())
        return max(statuses)

    def write_table(self) -> str:
        """The points' table, JSON and figure into the base folder; the markdown."""
        found: List[Tuple[SweepPoint, List[Any]]] = []
        for point, sweep in self.sweeps:
            found.append((point, load_results(sweep.output, run_specs(sweep.methods, sweep.variants, sweep.datasets,
                                                                   sweep.seeds))))
        return write_points(self.base, self.study, found)


def run_points(args: argparse.Namespace, study: Study, argv: Optional[Sequence[str]] = None) -> int:
    """Resolve every point of ``study``, then plan or run them; the exit status."""
    if sum((args.plan, args.shard is not None, args.merge)) > 1:
        raise UsageError("--plan, --shard and --merge exclude each other (see --help)")
    run = PointsRun(args, study)
    status = run.plan(argv) if args.plan else run.execute(argv)
    sys.stdout.flush()
    return status
