"""A sweep's execution: its missing runs trained (one training per method, seed and dataset scores every
missing variant), each result written as it finishes, then the tables.

Several processes may share the work: under ``torchrun`` one training runs over every process
(:func:`start_distributed`), and several sweeps may share one output folder (each training is claimed
first, ``claims.py``). SIGTERM or SIGUSR1 stop the sweep at the next batch boundary after a checkpoint.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from benchmarks.ablation import failures
from benchmarks.ablation.arguments import UsageError, command_line
from benchmarks.ablation.claims import Claims
from benchmarks.ablation.preemption import RESUMABLE_EXIT_CODE, RunInterrupted, StopSignals, any_process
from benchmarks.ablation.report import add_failures, plot_curves, plot_paper_deltas, summarize_results, write_tables
from benchmarks.ablation.run_log import training_log
from benchmarks.ablation.run_specs import run_specs
from benchmarks.ablation.runner import CheckpointPolicy, run_training
from benchmarks.ablation.sweep import Sweep, run_setting
from benchmarks.ablation.sweep_data import SweepData
from benchmarks.ablation.work_plan import shard_of
from benchmarks.core.presets import PRESETS
from benchmarks.core.protocol import RunSpec
from benchmarks.core.results import (
    check_checkpoints,
    check_resumable,
    checkpoints_of,
    load_results,
    remove_finished_checkpoints,
    result_path,
    trainings,
    write_json_atomic,
)
from benchmarks.core.variants import skipped_variants
from benchmarks.methods import method_class
from benchmarks.parallel import DataParallel
from benchmarks.studies.analysis_studies import write_analysis_study
from benchmarks.studies.main_tables import write_main_table
from benchmarks.studies.registry import REGISTRY, resolve_hook
from benchmarks.studies.study_tables import write_study


def execute(
    sweep: Sweep, *, data_root: str, download: bool, resume: bool, show_progress: bool,
    checkpoint_every: Union[str, int] = "evaluation", argv: Optional[Sequence[str]] = None,
    shard: Optional[Tuple[int, int]] = None, merge: bool = False,
) -> int:
    """Run the sweep's missing runs, then write and print the table; returns the exit status.

    ``shard=(K, N)`` runs only the K-th of N balanced parts of the trainings and writes no table;
    ``merge`` runs nothing and writes the table once every result exists (``benchmarks.ablation.shard``).

    Each training checkpoints itself every ``checkpoint_every`` and, with ``resume``, continues from its
    last checkpoint. SIGTERM or SIGUSR1 stop the sweep at the next batch boundary after a checkpoint: it
    prints the command that resumes it (``argv``, the same command line) and returns
    ``RESUMABLE_EXIT_CODE``.
    """
    if sweep.threads:
        torch.set_num_threads(sweep.threads)
    specs = run_specs(sweep.methods, sweep.variants, sweep.datasets, sweep.seeds)
    settings = {name: run_setting(sweep, name) for name in sweep.datasets}
    todo = [s for s in specs if not resume or not result_path(sweep.output, s).exists()]
    if merge and todo:
        raise UsageError(f"--merge: {len(todo)} of {len(specs)} results are missing in {sweep.output} (the first: "
                         f"{todo[0].key}); run the sweep or its --shard jobs first")
    if shard is not None:
        todo = shard_of(sweep, specs, todo, shard, data_root=data_root, download=download)
    groups = trainings(todo)  # one training scores every missing variant of a (dataset, seed, method)
    if resume:
        check_resumable(sweep.output, specs, settings)
        check_checkpoints(sweep.output, groups, settings)
    process = SweepProcess(sweep, settings, resume=resume, checkpoint_every=checkpoint_every)
    if process.lead:
        _announce(sweep, specs, todo, groups, resume=resume, world=process.world)
    stopped = process.train(groups, SweepData(sweep, data_root, download), len(todo), show_progress=show_progress)
    process.finish()
    if stopped is not None:
        if process.lead:
            print(f"{stopped}\nresume with the same command: {command_line(argv, process.world)}",
                  file=sys.stderr, flush=True)
        return RESUMABLE_EXIT_CODE
    if not process.lead:
        return 0
    if shard is not None:  # the tables come from --merge once every shard has finished
        return _shard_finished(sweep.output, todo, shard, argv)
    with process.claims.table_lock():  # whoever writes the table last has read every result written before it
        markdown, failed = _write_tables(sweep, specs, settings)
    print(markdown)
    if failed:
        print(f"error: {len(failed)} of {len(specs)} runs failed (error rows in the table; tracebacks in "
              f"{sweep.output / 'failures'}); rerunning the command trains them again", file=sys.stderr)
        return failures.FAILED_RUNS_EXIT_CODE
    return 0


class SweepProcess:
    """This process's part of a sweep: its place among the processes of one training (rank 0 writes and
    prints), and the trainings it claims, trains and records one after the other."""

    def __init__(self, sweep: Sweep, settings: Dict[str, Dict[str, Any]], *, resume: bool,
                 checkpoint_every: Union[str, int]) -> None:
        self.sweep, self.settings, self.resume, self.checkpoint_every = sweep, settings, resume, checkpoint_every
        rank, self.world, self.device = start_distributed(sweep.device)
        self.parallel = DataParallel.from_process_group()
        self.lead = rank == 0  # only the first process writes and prints
        self.progress: Any = None
        self.outer: Any = None
        # Other processes may share the output folder: each training is claimed before it starts (claims.py).
        self.claims = Claims(sweep.output, parallel=self.parallel, device=self.device, lead=self.lead,
                             notify=lambda line: print(line, file=sys.stderr, flush=True))

    def train(self, groups: List[List[RunSpec]], data: SweepData, runs: int, *, show_progress: bool) -> Optional[str]:
        """Train every group this process can claim; ``None``, or what stopped the sweep (a signal)."""
        self.progress = _progress(not show_progress or not self.lead)
        self.outer = self.progress(total=runs, desc="runs") if self.progress else None
        unfinished = _unfinished(self.sweep.output, self.resume, since=time.time())
        stopped: Optional[str] = None
        with StopSignals() as stop, self.claims:
            for group in self.claims.claimed(groups, unfinished=unfinished, stop=lambda: stop.requested):
                first = group[0]
                if any_process(stop.requested, self.parallel, self.device):
                    stopped = f"before {first.dataset}/{first.method}/seed{first.seed}"
                    break
                try:
                    self.train_group(group, data, stop)
                except RunInterrupted as interrupted:
                    stopped = str(interrupted)
                    break
        if stopped is None and stop.requested:  # while waiting for trainings held by other processes
            stopped = "while waiting for trainings that other processes hold"
        if self.outer:
            self.outer.close()
        return None if stopped is None else f"stopped by {stop.name}: {stopped}"

    def train_group(self, group: List[RunSpec], data: SweepData, stop: StopSignals) -> None:
        """One training scoring every variant of ``group``, from its checkpoint if it has one; a failure
        other than an interruption is recorded as the group's error rows (the sweep goes on)."""
        first = group[0]
        train, test = data(first.dataset)
        store = checkpoints_of(self.sweep.output, group)
        checkpointing = CheckpointPolicy(store, self.checkpoint_every, self.settings[first.dataset],
                                      stop_requested=lambda: stop.requested, lead=self.lead,
                                      resume=store.latest_agreed(self.parallel, self.device) if self.resume else None)
        if checkpointing.resume is None and self.lead:
            store.clear()  # a fresh start: nothing of an earlier training of this key may remain
        # A checkpoint may train more variants than are missing (killed between two result files).
        variants = [spec.variant for spec in group]
        if checkpointing.resume is not None:
            variants = checkpointing.resume["run"]["variants"]
        started = time.perf_counter()
        log = training_log(self.sweep.log if self.lead else (), self.sweep.output, method=first.method,
                           dataset=first.dataset, seed=first.seed, variants=variants,
                           settings={"preset": self.sweep.preset, **self.settings[first.dataset]})
        try:
            records = run_training(first.method, first.dataset, first.seed, variants, self.sweep.protocol, train,
                                   test, device=self.device, progress=self.progress, checkpointing=checkpointing,
                                   routers=self.sweep.routers, aggregations=self.sweep.aggregations,
                                   heads=self.sweep.heads, cka=self.sweep.study == "cka", log=log)
        except RunInterrupted:
            raise
        except Exception as error:  # one failed training must not lose the others' results
            if not failures.recordable(error, self.world):
                raise
            self._record_failure(group, error)
            return
        self._record(group, records, time.perf_counter() - started)
        if self.lead:
            store.clear()  # the result files replace the checkpoints

    def _record(self, group: List[RunSpec], records: Dict[str, Dict[str, Any]], wall: float) -> None:
        """Write the result file of each run of ``group`` and print its line (rank 0)."""
        for spec in group:
            result = records[spec.variant]
            result["wall_seconds"] = wall  # of this process's part of the training shared by the group
            result["world_size"] = self.world
            result["setting"] = self.settings[spec.dataset]
            if not self.lead:
                continue
            write_json_atomic(result_path(self.sweep.output, spec), result)
            failures.clear_failures(self.sweep.output, [spec])
            m = result["metrics"]
            line = (f"{spec.key}: A_auc {100 * m['A_auc']:.2f}  A_last {100 * m['A_last']:.2f}  "
                    f"F_last {100 * m['F_last']:.2f}  {result['seconds_per_batch'] * 1000:.1f} ms/batch  "
                    f"peak {result['peak_memory_mb']:.0f} MB  ({wall:.0f} s, {len(group)} variants)")
            (self.outer.write if self.outer else print)(line)
            if self.outer:
                self.outer.update(1)

    def _record_failure(self, group: Sequence[RunSpec], error: BaseException) -> None:
        """Print the failed training's traceback and record it (benchmarks/ablation/failures.py)."""
        if not self.lead:
            return
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
        path = failures.record_failure(self.sweep.output, group, error, self.settings[group[0].dataset])
        first = group[0]
        line = (f"{first.dataset}/{first.method}/seed{first.seed} failed ({failures.one_line(error)}); "
                f"{len(group)} run(s) recorded as failed in {path.parent.parent}; the sweep goes on")
        print(line, file=sys.stderr, flush=True)
        if self.outer:
            self.outer.update(len(group))

    def finish(self) -> None:
        """Leave the process group (under ``torchrun``)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()  # torch < 2.8 with gloo can deadlock in destroy_process_group without it
            dist.destroy_process_group()


def start_distributed(device_arg: Optional[str]) -> Tuple[int, int, torch.device]:
    """``(rank, world, device)``; under ``torchrun`` (WORLD_SIZE > 1) one process per device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available() and (device_arg is None or device_arg.startswith("cuda"))
    if world <= 1:
        return 0, 1, torch.device(device_arg or ("cuda" if use_cuda else "cpu"))
    import torch.distributed as dist

    dist.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), world, device


def _announce(sweep: Sweep, specs: List[RunSpec], todo: List[RunSpec], groups: List[List[RunSpec]], *,
              resume: bool, world: int) -> None:
    """Write ``protocol.json``, drop the checkpoints of finished runs and print what the sweep will do."""
    sweep.output.mkdir(parents=True, exist_ok=True)
    write_json_atomic(sweep.output / "protocol.json",
                      {"preset": sweep.preset, "protocol": sweep.protocol.to_dict(), "world_size": world})
    if resume:
        remove_finished_checkpoints(sweep.output, specs)
    resumable = sum(bool(checkpoints_of(sweep.output, group).paths()) for group in groups) if resume else 0
    resuming = f"{resumable} training{' resumes' if resumable == 1 else 's resume'} from a checkpoint"
    print(f"{len(specs)} runs, {len(specs) - len(todo)} already finished, {resuming}; results in {sweep.output}",
          flush=True)
    for method in sweep.methods:
        warning = method_class(method).protocol_warning(sweep.protocol)
        if warning:
            print(f"warning: the {method!r} rows: {warning}", file=sys.stderr, flush=True)
        skipped = skipped_variants(method_class(method), sweep.variants)
        for reason in dict.fromkeys(skipped.values()):
            names = ", ".join(name for name, why in skipped.items() if why == reason)
            print(f"{method}: variants {names} skipped: {reason}", flush=True)


def _shard_finished(output: Path, todo: List[RunSpec], shard: Tuple[int, int], argv: Optional[Sequence[str]]) -> int:
    """Print how to make the tables once every shard has finished; the exit status of this shard."""
    failed = failures.load_failures(output, todo)
    print(f"shard {shard[0]}/{shard[1]} finished; once every shard has: {command_line(argv, 1, merge=True)}")
    if failed:
        print(f"error: {len(failed)} of this shard's runs failed (tracebacks in {output / 'failures'}); rerunning "
              "the shard trains them again", file=sys.stderr)
        return failures.FAILED_RUNS_EXIT_CODE
    return 0


def _write_tables(sweep: Sweep, specs: List[RunSpec], settings: Dict[str, Dict[str, Any]]) -> Tuple[str, List[Any]]:
    """Write the tables and figures of every result of ``specs``; the table in Markdown and the failed runs."""
    check_resumable(sweep.output, specs, settings)  # a sweep of another setting may share the folder
    results = load_results(sweep.output, specs)
    failed = failures.load_failures(sweep.output, specs)
    rows = add_failures(summarize_results(results), failed)
    markdown = write_tables(sweep.output, rows, caption=PRESETS[sweep.preset]["caption"])
    plot_curves(sweep.output, results)
    plot_paper_deltas(sweep.output, [row for row in rows if row["seeds"]])
    registered = REGISTRY.get(sweep.study or "")
    for study in ("routers", "aggregations", "heads"):  # what was scored on one training, when asked
        if getattr(sweep, study):
            name = sweep.study if registered is not None and study in dict(registered.scored) else study
            table = write_study(sweep.output, results, study, name)
            markdown += f"\n\n{name} study (study_{name}.md):\n\n" + table
    if registered is not None and registered.table:  # a registered study's own table (components)
        table = resolve_hook(registered.table)(sweep.output, results)
        markdown += f"\n\n{sweep.study} study (study_{sweep.study}.md):\n\n" + table
    markdown += write_analysis_study(sweep.study, sweep.output, results)  # cka, routing, ranpac: "" for the others
    if sweep.study in ("overall", "offline"):  # the paper's Tables 1 and 2
        markdown += f"\n\n{sweep.study} study (study_{sweep.study}.md):\n\n" + write_main_table(sweep.output, results,
                                                                                                 sweep.study)
    return markdown, failed


def _progress(disabled: bool) -> Any:
    """tqdm's progress bar class, or ``None`` when ``disabled`` or tqdm is not installed."""
    if disabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


def _unfinished(output: Path, resume: bool, since: float) -> Callable[[RunSpec], bool]:
    """Whether a run still needs training: no result file, or (``resume`` off) one older than this sweep."""

    def unfinished(spec: RunSpec) -> bool:
        try:
            written = result_path(output, spec).stat().st_mtime
        except FileNotFoundError:
            return True
        return not resume and written < since

    return unfinished
