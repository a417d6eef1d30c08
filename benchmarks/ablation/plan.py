"""The plan of a sweep: the trainings and evaluations it runs, and their device time estimated from a probe.

The work of each training is counted exactly (its stream's batches, its evaluation points and the test
images each one scores, the forced-expert passes of the last one), without running it. Its cost is
that work times the unit costs :func:`benchmarks.ablation.probe.probe` measures on the user's own
device and model, one probe per (dataset, method). Beside it the plan prices the same table run as the
official code runs it: one training per variant, each evaluation with its own query pass and one
prompted pass, no oracle matrix. docs/benchmark.md ("Cost of a sweep") describes the model and its limits.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ..core.metrics import AnytimeEvalTrigger
from ..core.plan_file import PLAN_FORMAT, inference_per_image
from ..core.protocol import Protocol, RunSpec
from ..core.results import trainings
from ..core.stream_draw import build_si_blurry_stream
from ..core.variants import VARIANTS
from ..methods import method_class

__all__ = ["PlanData", "TrainingWork", "count_work", "estimate", "format_plan", "make_plan", "training_key"]



def training_key(dataset: str, method: str, seed: int) -> str:
    """The name of one training of the sweep (it scores every variant of the method)."""
    return f"{dataset}/{method}/seed{seed}"


@dataclass
class TrainingWork:
    """What one training does, counted from its stream: no model runs.

    Attributes:
        batches: stream batches (each ``online_iter`` optimizer steps).
        evaluations: evaluation points (anytime and session ends).
        eval_images: test images scored, summed over the evaluation points.
        query_images: test images whose frozen pass runs: those of every evaluation whose subset differs
            from the previous one's (a class was exposed in between); the others are reused.
        final_images: test images of the last evaluation (each gets a forced pass per trained expert).
        selections: prompted passes per scored image at most (own, routed, oracle).
    """

    dataset: str
    method: str
    seed: int
    variants: List[str]
    batches: int
    evaluations: int
    eval_images: int
    query_images: int
    final_images: int
    experts: int
    selections: int

    @property
    def key(self) -> str:
        return training_key(self.dataset, self.method, self.seed)


def evaluation_points(stream: Any, protocol: Protocol) -> List[int]:
    """``samples_seen`` of every evaluation of a training on ``stream``, in the training loop's order
    (``benchmarks.ablation.training.OnlineTrainer``: session ends and the anytime trigger)."""
    trigger, points, session, seen = AnytimeEvalTrigger(protocol.eval_period), [], -1, 0
    for batch in stream.batches(protocol.batch_size, rank=None):
        while session < batch.session:
            if session >= 0:
                points.append(seen)
            session += 1
        seen = batch.samples_seen
        if trigger.step(batch.samples_seen, batch.global_size) is not None:
            points.append(seen)
    points.extend([seen] * (stream.num_sessions - max(session, 0)))  # the last session and trailing empty ones
    return points


def count_work(specs: Sequence[RunSpec], protocol: Protocol, data: Callable[[str], Any]) -> List[TrainingWork]:
    """One :class:`TrainingWork` per training of ``specs`` (grouped as the sweep trains them);
    ``data(dataset)`` returns the ``(train, test)`` records (only their targets are read)."""
    work = []
    for group in trainings(specs):
        first = group[0]
        train, test = data(first.dataset)
        stream = build_si_blurry_stream(train.targets, num_sessions=protocol.num_sessions,
                                        disjoint_ratio=protocol.disjoint_ratio, blurry_ratio=protocol.blurry_ratio,
                                        seed=first.seed)
        exposure = stream.exposure()
        points = evaluation_points(stream, protocol)
        sizes = [len(exposure.eval_subset(test.targets, seen)[0]) for seen in points]
        exposed = [exposure.num_exposed(seen) for seen in points]
        changed = [size for i, size in enumerate(sizes) if i == 0 or exposed[i] != exposed[i - 1]]
        variants = [spec.variant for spec in group]
        selections = {VARIANTS[v].selection for v in variants} | {"own"}
        if method_class(first.method).builtin_components:
            selections.discard("routed")  # its own selection is its router's
        work.append(TrainingWork(
            dataset=first.dataset, method=first.method, seed=first.seed, variants=variants,
            batches=stream.num_batches(protocol.batch_size), evaluations=len(points), eval_images=sum(sizes),
            query_images=sum(changed), final_images=sizes[-1] if sizes else 0,
            experts=protocol.num_experts, selections=len(selections),
        ))
    return work


def estimate(work: TrainingWork, unit: Dict[str, Any]) -> Dict[str, float]:
    """Seconds of one training from a probe's unit costs: ``ours`` (one training scoring every variant)
    and ``per_variant`` (one training per variant, as the official code runs the table)."""
    train = work.batches * unit["per_batch"]
    # The probe's per-image cost holds the passes it made; the estimate charges every distinct selection.
    prompted = unit["prompted_per_image"]
    scoring = unit["eval_per_image"]
    evaluation = (work.eval_images * (scoring + work.selections * prompted)
                  + work.query_images * unit["frozen_per_image"]
                  + work.final_images * work.experts * prompted)
    single = work.eval_images * inference_per_image(unit)
    per_variant = len(work.variants) * (unit["build"] + train + single)
    return {"build": unit["build"], "train": train, "evaluation": evaluation,
            "ours": unit["build"] + train + evaluation, "per_variant": per_variant}


def format_plan(plan: Dict[str, Any]) -> str:
    """The plan as a table: one row per (dataset, method), then the totals."""
    rows = {}
    for entry in plan["trainings"]:
        row = rows.setdefault((entry["dataset"], entry["method"]), {"n": 0, "ours": 0.0, "per_variant": 0.0,
                                                                    **entry})
        row["n"] += 1
        row["ours"] += entry["estimate"]["ours"]
        row["per_variant"] += entry["estimate"]["per_variant"]
    probes = {(p["dataset"], p["method"]): p for p in plan["probes"]}
    lines = [
        f"plan of {len(plan['trainings'])} trainings ({plan['results']} results) on {plan['device']}; unit costs "
        f"measured by a probe of {plan['probe_batches']} stream batch(es) and two evaluations per method",
        "",
        "| dataset | method | trainings | batches | evaluations | images scored | ms/batch | ms/test image "
        "| hours | hours, a training per variant |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (dataset, method), row in rows.items():
        unit = probes[(dataset, method)]
        image = unit["eval_per_image"] + row["selections"] * unit["prompted_per_image"]
        lines.append(
            f"| {dataset} | {method} | {row['n']} | {row['batches']} | {row['evaluations']} | {row['eval_images']} "
            f"| {1000 * unit['per_batch']:.1f} | {1000 * image:.2f} | {row['ours'] / 3600:.3f} "
            f"| {row['per_variant'] / 3600:.3f} |"
        )
    total = plan["total_seconds"]
    lines += _priced_on(plan)
    lines += ["", f"estimated device time: {total['ours'] / 3600:.2f} h ({total['train'] / 3600:.2f} h training, "
                  f"{total['evaluation'] / 3600:.2f} h evaluation, {total['build'] / 3600:.2f} h set-up); "
                  f"one training per variant: {total['per_variant'] / 3600:.2f} h"]
    return "\n".join(lines)


def _priced_on(plan: Dict[str, Any]) -> List[str]:
    """Lines saying what the probe stood in for: datasets by their sizes, pretrained weights by random ones."""
    lines = []
    scaled = {tuple(p["scaled"]["batch_size"]) + tuple(p["scaled"]["online_iter"]) for p in plan["probes"] if "scaled" in p}
    for small, batch, few, iterations in sorted(scaled):
        if (small, few) != (batch, iterations):
            lines.append(f"scaled: the probe trained batches of {small} images with {few} online iteration(s); each "
                         f"part was scaled linearly to the protocol's {batch} images and {iterations} iteration(s)")
    if plan.get("stand_in_datasets"):
        lines.append(f"datasets not on this machine, counted from their sizes and probed on noise images of their "
                     f"shape: {', '.join(plan['stand_in_datasets'])}")
    if plan.get("random_weights"):
        model = plan.get("protocol", {}).get("model", "the model")
        lines.append(f"pretrained weights of {model} not on this machine: the probe timed its architecture on random "
                     f"weights (a pass costs the same)")
    return [""] + lines if lines else []


def summarize(work: Sequence[TrainingWork], units: Dict[tuple, Dict[str, Any]], *, device: str, results: int,
              probe_batches: int, probe_seconds: float, command: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The plan document (``plan.json``): every training with its work and estimate, the probes, the totals."""
    entries, total = [], {"build": 0.0, "train": 0.0, "evaluation": 0.0, "ours": 0.0, "per_variant": 0.0}
    for item in work:
        cost = estimate(item, units[(item.dataset, item.method)])
        entries.append({"key": item.key, **asdict(item), "estimate": cost})
        for name in total:
            total[name] += cost[name]
    return {"format": PLAN_FORMAT, "device": device, "results": results, "probe_batches": probe_batches,
            "probe_seconds": probe_seconds, "trainings": entries, "probes": list(units.values()),
            "total_seconds": total, "torch": torch.__version__, **({"command": list(command)} if command else {})}


def make_plan(
    specs: Sequence[RunSpec], protocol: Protocol, data: Callable[[str], Any], *, device: torch.device,
    probe_batches: int = 1, eval_samples: int = 16, protocol_record: Optional[Dict[str, Any]] = None,
    command: Optional[Sequence[str]] = None, log: Callable[[str], None] = lambda line: None,
    studies: Optional[Dict[str, Sequence[str]]] = None, random_weights: bool = False,
) -> Dict[str, Any]:
    """Count every training of ``specs`` and probe each method once on ``device`` (on its first dataset: the
    others share the image size, and the probe's costs are per image and per batch); the plan document.

    ``studies`` (``{"routers": [...], "aggregations": [...]}``) are probed with the trainings they join.
    ``random_weights``: ``protocol`` is the sweep's architecture on random weights, the pretrained ones being
    absent (the document says so)."""
    data = PlanData(data, protocol.image_size, log)
    log(f"counting the work of {len(trainings(specs))} trainings (their streams and evaluations; nothing runs) ...")
    work = count_work(specs, protocol, data)
    units: Dict[tuple, Dict[str, Any]] = {}
    started = time.perf_counter()
    prober = _Prober(protocol, device, probe_batches, eval_samples, log, studies or {}, random_weights)
    probed: Dict[str, Dict[str, Any]] = {}
    for item in work:
        if (item.dataset, item.method) in units:
            continue
        if item.method not in probed:
            train, test = data(item.dataset)
            probed[item.method] = prober(item, train, test)
        units[(item.dataset, item.method)] = {**probed[item.method], "dataset": item.dataset,
                                              "probed_on": probed[item.method]["dataset"]}
    document = summarize(work, units, device=str(device), results=len(specs), probe_batches=probe_batches,
                         probe_seconds=time.perf_counter() - started, command=command)
    priced_on = {"stand_in_datasets": sorted(data.stand_ins), "random_weights": prober.random_weights}
    return {**document, **priced_on,
            "protocol": protocol_record if protocol_record is not None else protocol.to_dict()}


class PlanData:
    """The sweep's datasets where they are found, and stand-ins of the paper's datasets' sizes where they
    are not (``benchmarks.core.dataset_sizes``): a plan is made before anything is downloaded."""

    def __init__(self, load: Callable[[str], Any], image_size: int, log: Callable[[str], None]) -> None:
        self.load, self.image_size, self.log = load, int(image_size), log
        self.stand_ins: set = set()

    def __call__(self, name: str) -> Any:
        from ..core.dataset_sizes import DATASET_SIZES, stand_in
        from ..data.records import DatasetNotFoundError

        if name in self.stand_ins:
            return stand_in(name, self.image_size)
        try:
            return self.load(name)
        except DatasetNotFoundError as error:
            if name not in DATASET_SIZES:
                raise
            self.log(f"{str(error).splitlines()[0].split(':')[0]}: the plan counts its work from its sizes and times "
                     f"the probe on images of its shape")
            self.stand_ins.add(name)
            return stand_in(name, self.image_size)


class _Prober:
    """One probe per method; on randomly initialised weights when the pretrained ones are not on this machine
    (a pass costs the same whatever the weights). A warm-up batch on CUDA only (its first kernels and
    allocations); a CPU's first batch costs what the others do."""

    def __init__(self, protocol: Protocol, device: torch.device, batches: int, eval_samples: int,
                 log: Callable[[str], None], studies: Dict[str, Sequence[str]], random_weights: bool) -> None:
        self.protocol, self.device, self.batches, self.eval_samples, self.log = protocol, device, batches, eval_samples, log
        self.studies = studies
        self.random_weights = random_weights

    def __call__(self, item: TrainingWork, train: Any, test: Any) -> Dict[str, Any]:
        from ..backbone import BackboneLoadError
        from .probe import probe  # builds models: imported only when a plan is made

        self.log(f"probing {item.method} on {item.dataset} ({self.device}); its unit costs price every dataset ...")
        try:
            return probe(item.method, item.dataset, item.variants, self.protocol, train, test, device=self.device,
                         seed=item.seed, batches=self.batches, eval_samples=self.eval_samples, log=self.log,
                         warmup=1 if self.device.type == "cuda" else 0, **self.studies)
        except BackboneLoadError as error:
            if self.random_weights:
                raise
            self.log(f"{str(error).splitlines()[0]}; the probe times randomly initialised weights instead")
            self.protocol = replace(self.protocol, pretrained=False, weights=None)
            self.random_weights = True
            return self(item, train, test)
