"""A sweep's cost and its split over several jobs: ``--plan`` prices the work by a timed probe on this device,
``--shard K/N`` keeps the K-th of N balanced parts of the trainings (balancing in :mod:`benchmarks.ablation.shard`)."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import List, Optional, Sequence, Tuple

import torch

from benchmarks.ablation import preflight
from benchmarks.ablation.arguments import UsageError
from benchmarks.ablation.plan import count_work, format_plan, make_plan, training_key
from benchmarks.ablation.run_specs import run_specs
from benchmarks.ablation.shard import plan_costs, split, work_costs
from benchmarks.ablation.sweep import Sweep, run_setting
from benchmarks.ablation.sweep_data import SweepData
from benchmarks.backbone import BackboneLoadError, cached_weights, downloads_allowed
from benchmarks.core.plan_file import PLAN_FILE
from benchmarks.core.protocol import RunSpec
from benchmarks.core.results import trainings, write_json_atomic


def _device(sweep: Sweep) -> torch.device:
    return torch.device(sweep.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def probed_sweep(sweep: Sweep) -> Tuple[Sweep, bool]:
    """The sweep a plan probes, and whether its weights are random: the sweep's own, or the same architecture
    on random weights when the pretrained ones are neither given nor in the local cache (a pass costs the
    same whatever the weights; a plan fetches nothing)."""
    protocol = sweep.protocol
    if protocol.weights is not None or not protocol.pretrained:
        return sweep, False
    try:
        cached = cached_weights(protocol.model)
    except BackboneLoadError:  # timm registers no pretrained weights for this model
        cached = None
    if cached is not None:
        return sweep, False
    return replace(sweep, protocol=replace(protocol, pretrained=False)), True


#: the router width the plan's checks build (a 10,000-wide router's solve takes seconds on a CPU; the probe
#: times the sweep's own width)
CHECKED_EXPANSION = 64


def _log(line: str) -> None:
    """A step of the plan, as it starts (stderr: the plan's table is the output)."""
    print(line, file=sys.stderr, flush=True)


def run_plan(sweep: Sweep, *, data_root: str, argv: Optional[Sequence[str]] = None) -> int:
    """``--plan``: check what it probes, count the sweep's work, probe each (dataset, method), print and write
    ``plan.json``. Nothing is downloaded: missing datasets are priced by their sizes, missing weights on
    random ones (``plan.json``: ``stand_in_datasets``, ``random_weights``)."""
    probed, random_weights = probed_sweep(sweep)
    _log(f"plan: checking {probed.protocol.model} and {', '.join(sweep.methods)} on one blank image (CPU) ...")
    # The probe builds the router at its width; the check needs only that every method builds and runs.
    narrow = replace(probed.protocol, expansion_dim=min(probed.protocol.expansion_dim, CHECKED_EXPANSION))
    preflight.check(replace(probed, protocol=narrow))
    specs = run_specs(sweep.methods, sweep.variants, sweep.datasets, sweep.seeds)
    with downloads_allowed(False):
        document = make_plan(specs, probed.protocol, SweepData(sweep, data_root, download=False),
                             device=_device(sweep), protocol_record=run_setting(sweep, sweep.datasets[0])["protocol"],
                             command=list(sys.argv[1:] if argv is None else argv),
                             log=_log,
                             studies={"routers": sweep.routers, "aggregations": sweep.aggregations, "heads": sweep.heads},
                             random_weights=random_weights)
    sweep.output.mkdir(parents=True, exist_ok=True)
    write_json_atomic(sweep.output / PLAN_FILE, document)
    print(format_plan(document))
    print(f"written: {sweep.output / PLAN_FILE}")
    return 0


def shard_of(sweep: Sweep, specs: List[RunSpec], todo: List[RunSpec], shard: Tuple[int, int], *, data_root: str,
             download: bool) -> List[RunSpec]:
    """The runs of ``todo`` that belong to the K-th of N parts of the sweep's trainings."""
    keys = [training_key(g[0].dataset, g[0].method, g[0].seed) for g in trainings(specs)]
    try:
        costs = plan_costs(sweep.output, keys, run_setting(sweep, sweep.datasets[0])["protocol"])
    except ValueError as error:
        raise UsageError(f"--shard: {error}") from None
    basis = "the estimates of plan.json"
    if costs is None:
        work = count_work(specs, sweep.protocol, SweepData(sweep, data_root, download))
        costs = work_costs(work, sweep.protocol.online_iter, sweep.protocol.batch_size)
        basis = "counted work (no plan.json: run --plan first to balance by measured estimates)"
    mine = set(split(keys, costs, shard[1])[shard[0] - 1])
    print(f"shard {shard[0]}/{shard[1]}: {len(mine)} of {len(keys)} trainings, balanced by {basis}", flush=True)
    return [s for s in todo if training_key(s.dataset, s.method, s.seed) in mine]
