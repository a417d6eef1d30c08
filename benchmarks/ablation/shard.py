"""Splitting a sweep's independent trainings over N jobs (``--shard K/N``, e.g. a SLURM job array).

Every job computes the same split from the same inputs: the sweep's trainings in their order and a
cost per training, either the estimates of ``<output>/plan.json`` (``--plan``) or, without one, the
counted work of each training in image passes. Trainings go, costliest first, to the job with the least
cost so far (ties: the earlier training, the lower job), which keeps the largest job within one
training of the mean. Each job writes its results into the shared output folder; ``--merge`` makes
the tables once every job has finished (docs/benchmark.md, "Several GPUs").
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..core.errors import UsageError
from ..core.plan_file import PLAN_FILE, read_plan
from .plan import TrainingWork

__all__ = ["parse_shard", "split", "work_costs", "plan_costs"]



def parse_shard(text: str) -> Tuple[int, int]:
    """``"K/N"`` -> ``(K, N)`` with ``1 <= K <= N`` (argparse type)."""
    parts = text.split("/")
    try:
        k, n = (int(part) for part in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        k = n = None
    if k is None or n is None or n < 1 or not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"expected K/N with 1 <= K <= N (e.g. 2/8), got {text!r}")
    return k, n


def split(keys: Sequence[str], costs: Dict[str, float], shards: int) -> List[List[str]]:
    """``shards`` lists of ``keys`` (each in sweep order) whose summed ``costs`` are balanced greedily:
    the costliest training first, each to the job with the least cost so far."""
    if shards < 1:
        raise ValueError(f"split needs at least one shard, got {shards}")
    missing = [key for key in keys if key not in costs]
    if missing:
        raise ValueError(f"no cost for the training {missing[0]!r} ({len(missing)} without one)")
    order = sorted(range(len(keys)), key=lambda i: (-costs[keys[i]], i))
    loads, members = [0.0] * shards, [[] for _ in range(shards)]  # type: List[float], List[List[int]]
    for i in order:
        shard = min(range(shards), key=lambda s: (loads[s], s))
        loads[shard] += costs[keys[i]]
        members[shard].append(i)
    return [[keys[i] for i in sorted(indices)] for indices in members]


def work_costs(work: Sequence[TrainingWork], online_iter: int, batch_size: int) -> Dict[str, float]:
    """Cost of each training in image passes: a training step counts 3 (forward and backward), a
    query or prompted pass 1; the basis of a split without a plan."""
    costs = {}
    for item in work:
        train = item.batches * batch_size * (3 * online_iter + 1)
        evaluation = item.eval_images * item.selections + item.query_images + item.final_images * item.experts
        costs[item.key] = float(train + evaluation)
    return costs


def plan_costs(output: Path, keys: Sequence[str], protocol: dict) -> Optional[Dict[str, float]]:
    """The estimates of ``output/plan.json`` for ``keys``; ``None`` when there is no plan file. Raises
    ``ValueError`` when the plan was made for another protocol or lacks one of the trainings."""
    path = Path(output) / PLAN_FILE
    if not path.exists():
        return None
    try:
        plan = read_plan(path)
    except UsageError as error:
        raise ValueError(str(error)) from None
    if plan["protocol"] != protocol:
        raise ValueError(f"{path} was made for another protocol; run the command with --plan again")
    costs = {entry["key"]: float(entry["estimate"]["ours"]) for entry in plan["trainings"]}
    missing = [key for key in keys if key not in costs]
    if missing:
        raise ValueError(f"{path} has no estimate for {missing[0]!r} ({len(missing)} trainings); it was made for "
                         f"another sweep: run the command with --plan again")
    return costs
