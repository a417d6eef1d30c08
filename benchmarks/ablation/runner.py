"""Runs of the cross-ablation: one training of a method on a Si-Blurry stream, every requested variant
scored on it, one JSON-serialisable record per variant.

:func:`run_training` trains once and scores all variants (``benchmarks.core.variants``) on the same test
batches; :func:`run_reference` runs one ablation variant through ``fly_modules.adapters.reference``,
as a user would, and is what the tests hold :func:`run_training` to. The loop is
``benchmarks.ablation.training``; its differences from the reference loop are listed in docs/methods.md.
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..backbone import backbone_of
from ..core.checkpointing import CheckpointError, CheckpointStore, capture, frozen_backbone_digest, restore, rng_states
from ..core.metrics import EvaluationLog, summarize
from ..core.protocol import ROUTER_QUERIES, Protocol, RunSpec
from ..core.results import setting_differences
from ..core.stream import Exposure, SiBlurryStream
from ..core.stream_draw import build_si_blurry_stream
from ..core.timer import NO_TIMER, PartTimer
from ..core.variants import ABLATION_VARIANTS, VARIANTS, variants_for
from ..methods import PromptMethod, method_class
from ..parallel import DataParallel
from ..studies.router_components import WithRouters
from ..studies.router_set import check_router_names
from .components import AddedComponents, BuiltinComponents, RetrofitComponents, ScoredComponents
from .diagnostics import ExpertUsage
from .evaluation import PredictEvaluator, VariantEvaluator
from .preemption import RunInterrupted, any_process
from .run_log import TrainingLog
from .training import OnlineTrainer

__all__ = ["CheckpointPolicy", "Run", "build_run", "run_training", "run_reference"]

@dataclass
class CheckpointPolicy:
    """How a training checkpoints itself (``benchmarks.core.checkpointing``) and when it stops early.

    Attributes:
        store: the training's checkpoint files.
        period: ``"evaluation"`` (after every anytime evaluation), a number of stream batches, or ``0``
            (only when stopped).
        setting: the sweep's protocol and data setting, stored in each checkpoint.
        stop_requested: polled at every batch boundary; when it is true on any process the training
            writes a checkpoint and raises ``benchmarks.ablation.preemption.RunInterrupted``.
        resume: the checkpoint to continue from (``CheckpointStore.latest``), ``None`` to start afresh;
            released (set to ``None``) once loaded, so that its tensors do not stay in memory.
        lead: whether this process writes the files (rank 0).
    """

    store: CheckpointStore
    period: Union[str, int] = "evaluation"
    setting: Dict[str, Any] = field(default_factory=dict)
    stop_requested: Callable[[], bool] = lambda: False
    resume: Optional[Dict[str, Any]] = None
    lead: bool = True


def run_training(
    method: str,
    dataset: str,
    seed: int,
    variants: Sequence[str],
    protocol: Protocol,
    train: Any,
    test: Any,
    *,
    device: torch.device,
    progress: Optional[Callable[..., Any]] = None,
    process_group: Optional[Any] = None,
    checkpointing: Optional[CheckpointPolicy] = None,
    routers: Sequence[str] = (), aggregations: Sequence[str] = (), heads: Sequence[str] = (), cka: bool = False,
    log: Optional[TrainingLog] = None,
) -> Dict[str, Dict[str, Any]]:
    """Train ``method`` once on the Si-Blurry stream of ``train``; score every variant on ``test``.

    ``train``/``test`` are ``benchmarks.data`` records and ``variants`` names from
    ``benchmarks.core.variants.VARIANTS`` that the method runs (``variants_for``). Returns one record per
    variant: the spec, the metrics (official-code and paper definitions), the evaluation log, the
    diagnostics (docs/diagnostics.md), timings and memory of the shared training.

    With an initialised ``torch.distributed`` (``process_group``, or the default group when it has more
    than one process) the run is data-parallel and computes what one process computes, up to
    floating-point summation order: every rank trains on every ``world``-th sample of each global
    batch, gradients are summed with weights ``n_rank / n_global``, the methods' statistics, the router
    and the ensemble see the global batch (``benchmarks.parallel``), and each rank scores a share of
    the test subset whose counts are summed.

    With ``checkpointing`` the training saves itself at its period, resumes from ``checkpointing.resume``
    (a checkpoint of these variants, which continues exactly as the uninterrupted run would), and stops
    with ``RunInterrupted`` after saving when a stop is requested; the records then say what was
    written and where the training resumed (``checkpoints``).

    ``routers``, ``aggregations`` and ``heads`` add the studies (docs/benchmark.md, "Studies"): each router
    trained beside REAR, scored in the routed variants; each TE2 rule, and each subset of the ensemble's heads,
    scored in the ensemble variants. ``cka`` adds the linear CKA between the experts at the end of the stream
    (``benchmarks.studies.cka``). ``log`` shows the training in dashboards as it goes (``--log``,
    ``benchmarks.ablation.run_log``); it changes no number of the records.
    """
    built = build_run(method, dataset, seed, variants, protocol, train, test, device=device, process_group=process_group,
                      routers=routers, aggregations=aggregations, heads=heads, cka=cka)
    trainer, key = built.trainer, f"{dataset}/{method}/{'+'.join(built.variants)}/seed{seed}"
    checkpointer = _resumed(checkpointing, built, device)
    try:
        if log is not None:
            log.open(built.evaluator, samples_seen=trainer.position.samples_seen,
                     train_seconds=trainer.position.train_seconds)
        measured = _train(trainer, built.stream, protocol, device, progress, key, boundary=checkpointer, watch=log)
        records = _records(built, protocol, measured, checkpointer)
        if log is not None:
            log.finish(records, trainer.position.samples_seen)
    finally:
        if log is not None:
            log.close()
    return records


def _records(built: "Run", protocol: Protocol, measured: "_Measured",
             checkpointer: Optional["_CheckpointHook"]) -> Dict[str, Dict[str, Any]]:
    """The record of each variant of a finished training."""
    notes = method_class(next(iter(built.specs.values())).method).protocol_notes(protocol)
    records = {}
    for name, spec in built.specs.items():
        record = _record(spec, protocol, built.evaluator.logs[name], built.stream, built.exposure, measured, notes=notes)
        record["variants_trained_together"] = built.variants
        record["diagnostics"] = built.evaluator.diagnostics(name)
        if checkpointer is not None:
            record["checkpoints"] = dict(checkpointer.history)
        records[name] = record
    return records


def _resumed(checkpointing: Optional[CheckpointPolicy], built: "Run", device: torch.device) -> Optional["_CheckpointHook"]:
    """The checkpoint hook of a run built by :func:`build_run`, its checkpoint loaded (``None``: no checkpoints)."""
    if checkpointing is None:
        return None
    spec = next(iter(built.specs.values()))
    run = {"dataset": spec.dataset, "method": spec.method, "seed": spec.seed, "variants": built.variants}
    checkpointer = _CheckpointHook(checkpointing, built.trainer, built.evaluator, run=run, parallel=built.parallel,
                                   device=device, key=f"{spec.dataset}/{spec.method}/seed{spec.seed}")
    checkpointer.resume()
    return checkpointer


@dataclass
class Run:
    """One training's objects, built but not started (:func:`build_run`)."""

    model: PromptMethod
    variants: List[str]
    specs: Dict[str, RunSpec]
    stream: SiBlurryStream
    exposure: Exposure
    evaluator: VariantEvaluator
    trainer: OnlineTrainer
    parallel: DataParallel


def build_run(
    method: str, dataset: str, seed: int, variants: Sequence[str], protocol: Protocol, train: Any, test: Any, *,
    device: torch.device, process_group: Optional[Any] = None, timer: PartTimer = NO_TIMER, routers: Sequence[str] = (),
    aggregations: Sequence[str] = (), heads: Sequence[str] = (), cka: bool = False,
) -> Run:
    """The method, its components, the evaluator and the trainer of :func:`run_training` (``timer``
    times their parts: the profile and the plan's probe)."""
    cls = method_class(method)
    variants = list(variants)
    if not variants or variants_for(cls, variants) != variants:
        raise ValueError(
            f"{method!r} runs the variants {variants_for(cls, variants or list(ABLATION_VARIANTS))} "
            f"for {variants or 'no variant'}; got {variants}"
        )
    parallel = DataParallel.from_process_group(process_group)
    model, stream, exposure = _prepare(method, seed, protocol, train, device)
    components: ScoredComponents
    if cls.builtin_components:
        components = BuiltinComponents(model)
    else:
        components = AddedComponents(
            model, expansion_dim=protocol.expansion_dim, ridge=protocol.ridge, seed=seed, decays=protocol.decays,
            aggregate=protocol.aggregate,
        )
    if getattr(components, "router", None) is None:
        routers = []  # a method no router can choose for (router_refusal): no study router either
    if routers:
        routers = check_router_names(routers)
        components = WithRouters(components, model, routers, seed=seed)
    lr = _learning_rate(model, protocol)
    usage = ExpertUsage(len(train.classes), model.num_experts, device)
    members = ["online", *(f"ema_{decay:g}" for decay in components.ensemble.decays.tolist())]
    specs = {name: RunSpec(method, name, dataset, seed) for name in variants}
    evaluator = VariantEvaluator(
        model, components, usage, variants, test=test, exposure=exposure, parallel=parallel, device=device,
        batch_size=protocol.test_batch_size, member_names=members,
        meta={name: {"spec": asdict(spec), "lr": lr} for name, spec in specs.items()}, timer=timer, routers=routers,
        aggregations=_check_aggregations(aggregations), heads=heads, cka=cka,
    )
    trainer = OnlineTrainer(model, components, evaluator, usage, protocol=protocol, train=train, stream=stream,
                            exposure=exposure, parallel=parallel, device=device, lr=lr, timer=timer, seed=seed)
    return Run(model, variants, specs, stream, exposure, evaluator, trainer, parallel)


def _check_aggregations(rules: Sequence[str]) -> List[str]:
    from fly_modules.ensemble import AGGREGATION_RULES

    unknown = [rule for rule in rules if rule not in AGGREGATION_RULES]
    if unknown:
        raise ValueError(f"unknown aggregation rules {unknown}; expected some of {list(AGGREGATION_RULES)}")
    return [rule for rule in AGGREGATION_RULES if rule in rules]


def run_reference(
    spec: RunSpec,
    protocol: Protocol,
    train: Any,
    test: Any,
    *,
    device: torch.device,
    progress: Optional[Callable[..., Any]] = None,
) -> Dict[str, Any]:
    """One ablation variant (or ``full``) through ``fly_modules.adapters.reference``, in one process.

    The method is retrofitted with the variant's router and/or ensemble, as a user would, and scored
    with ``model.predict``; the record has no diagnostics.
    """
    cls = method_class(spec.method)
    if spec.variant not in (*ABLATION_VARIANTS, "full") or variants_for(cls, [spec.variant]) != [spec.variant]:
        raise ValueError(f"run_reference runs the ablation variants of a method; {spec.key} is not one")
    if DataParallel.from_process_group().world > 1:
        raise ValueError("run_reference runs in one process; use run_training for data-parallel runs")
    model, stream, exposure = _prepare(spec.method, spec.seed, protocol, train, device)
    variant = VARIANTS[spec.variant]
    components = RetrofitComponents(
        model, router=variant.selection == "routed", ensemble=variant.head == "ensemble" and not cls.builtin_components,
        expansion_dim=protocol.expansion_dim, ridge=protocol.ridge, seed=spec.seed, decays=protocol.decays,
        aggregate=protocol.aggregate, device=device,
    )
    lr = _learning_rate(model, protocol)
    evaluator = PredictEvaluator(model, test=test, exposure=exposure, parallel=DataParallel(), device=device,
                                 batch_size=protocol.test_batch_size, meta={"spec": asdict(spec), "lr": lr})
    usage = ExpertUsage(len(train.classes), model.num_experts, device)
    trainer = OnlineTrainer(model, components, evaluator, usage, protocol=protocol, train=train, stream=stream,
                            exposure=exposure, parallel=DataParallel(), device=device, lr=lr, seed=spec.seed)
    measured = _train(trainer, stream, protocol, device, progress, spec.key)
    components.remove()
    return _record(spec, protocol, evaluator.log, stream, exposure, measured, notes=cls.protocol_notes(protocol))


# ------------------------------------------------------------------------------------- set-up
def _prepare(
    method: str, seed: int, protocol: Protocol, train: Any, device: torch.device
) -> Tuple[PromptMethod, SiBlurryStream, Exposure]:
    """The method (seeded: backbone, then the method's own initialisation) and the run's stream."""
    if protocol.router_query not in ROUTER_QUERIES:
        raise ValueError(f"router_query must be one of {ROUTER_QUERIES}, got {protocol.router_query!r}")
    if device.type == "cuda":  # deterministic cuDNN kernels, as the reference sets (docs/protocol.md §3.9)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(seed)
    backbone = backbone_of(protocol)
    model = method_class(method).from_protocol(backbone, len(train.classes), protocol, seed).to(device)
    stream = build_si_blurry_stream(
        train.targets, num_sessions=protocol.num_sessions, disjoint_ratio=protocol.disjoint_ratio,
        blurry_ratio=protocol.blurry_ratio, seed=seed,
    )
    return model, stream, stream.exposure()


def _learning_rate(model: PromptMethod, protocol: Protocol) -> float:
    return protocol.lr if protocol.lr is not None else type(model).default_lr


# ------------------------------------------------------------------------------------- record
@dataclass
class _Measured:
    num_batches: int
    train_seconds: float
    peak_memory_mb: float
    device: str


def _train(
    trainer: OnlineTrainer, stream: SiBlurryStream, protocol: Protocol, device: torch.device,
    progress: Optional[Callable[..., Any]], key: str, boundary: Optional[Callable[[bool], None]] = None,
    watch: Optional[TrainingLog] = None,
) -> _Measured:
    """Run the trainer over (the rest of) the stream, with a progress bar, and measure it."""
    memory = _PeakMemory(device)
    num_batches = stream.num_batches(protocol.batch_size)
    bar = progress(total=num_batches, initial=trainer.position.batches, desc=key, leave=False) if progress else None
    try:
        trainer.train(bar, boundary, watch)
    finally:
        if bar is not None:
            bar.close()
    return _Measured(num_batches, trainer.position.train_seconds, memory.read_mb(), str(device))


def _record(
    spec: RunSpec, protocol: Protocol, log: EvaluationLog, stream: SiBlurryStream, exposure: Exposure,
    measured: _Measured, *, notes: str,
) -> Dict[str, Any]:
    class_session = exposure.per_exposure(stream.home_session)
    return {
        "spec": asdict(spec),
        "protocol": protocol.to_dict(),
        "metrics": summarize(log),
        "metrics_paper": summarize(log, definition="paper", class_session=class_session),
        "log": log.to_dict(),
        "num_batches": measured.num_batches,
        "stream_length": len(stream),
        "seconds_per_batch": measured.train_seconds / max(measured.num_batches, 1),
        "peak_memory_mb": measured.peak_memory_mb,
        "device": measured.device,
        "notes": notes,
    }


class _CheckpointHook:
    """The trainer's batch-boundary hook: a checkpoint at every period, and on a stop request a last
    one and :class:`RunInterrupted`. Only the lead process writes; every process takes part in the
    agreement on stopping and in gathering the random-number states."""

    def __init__(
        self, config: CheckpointPolicy, trainer: OnlineTrainer, evaluator: Any, *, run: Dict[str, Any],
        parallel: DataParallel, device: torch.device, key: str,
    ) -> None:
        self.config, self.trainer, self.evaluator, self.run = config, trainer, evaluator, run
        self.parallel, self.device, self.key = parallel, device, key
        self.total = trainer.stream.num_batches(trainer.protocol.batch_size)
        self.history: Dict[str, Any] = {"written": 0, "write_seconds": 0.0, "bytes": 0, "resumed_at_batches": []}
        self.digest: Optional[str] = None

    def resume(self) -> None:
        """Load ``config.resume`` (if any) into the freshly built trainer and evaluator."""
        payload = self.config.resume
        if payload is None:
            return
        if payload["run"] != self.run or setting_differences(payload["setting"], self.config.setting, self.run["method"]):
            raise CheckpointError(
                f"the checkpoint of {self.key} was written by another run or setting "
                f"({payload['run']} -> {self.run}); the sweep compares settings before it starts"
            )
        restore(payload, self.trainer, self.evaluator, rank=self.parallel.rank, world=self.parallel.world,
                device=self.device)
        self.config.resume = None
        resumed = [*payload["history"]["resumed_at_batches"], payload["batches"]]
        self.history = {**payload["history"], "resumed_at_batches": resumed}
        if self.config.lead:  # the file's own size, which it could not hold
            self.history["bytes"] = self.config.store.path(payload["batches"]).stat().st_size

    def __call__(self, evaluated: bool) -> None:
        batches, period = self.trainer.position.batches, self.config.period
        stop = any_process(self.config.stop_requested(), self.parallel, self.device)
        due = evaluated if period == "evaluation" else (int(period) > 0 and batches % int(period) == 0)
        path = self.save(stopping=stop) if due or stop else None
        if stop:
            raise RunInterrupted(self.key, path, batches, self.total)

    def save(self, *, stopping: bool) -> Optional[Any]:
        started = time.perf_counter()
        rng = self._gather(rng_states(self.device))
        path = None
        if self.config.lead:
            if self.digest is None:  # the frozen backbone never changes: one digest per run
                self.digest = frozen_backbone_digest(self.trainer.model)
            history = {**self.history, "written": self.history["written"] + 1}
            payload = capture(self.trainer, self.evaluator, run=self.run, setting=self.config.setting, rng=rng,
                              history=history, backbone_digest=self.digest)
            path, self.history["bytes"] = self.config.store.save(payload)
        if stopping and self.parallel.world > 1:
            import torch.distributed as dist

            dist.barrier(group=self.parallel.group)  # the others exit only once the file is complete
        self.history["written"] += 1
        self.history["write_seconds"] += time.perf_counter() - started
        return path

    def _gather(self, state: Dict[str, Any]) -> List[Dict[str, Any]]:
        """Every process's random-number states, in rank order."""
        if self.parallel.world == 1:
            return [state]
        import torch.distributed as dist

        states: List[Any] = [None] * self.parallel.world
        dist.all_gather_object(states, state, group=self.parallel.group)
        return states


class _PeakMemory:
    """Peak memory of a run: CUDA allocator peak, or the process's peak resident set on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def read_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
