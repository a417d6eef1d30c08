"""One online Si-Blurry run of one method in one cross-ablation variant.

The loop follows reference-protocol section 3.4 (one stream batch): expose the batch's classes ->
``online_iter`` optimizer steps on freshly augmented copies with the training logit mask -> the
method's per-batch hook -> ``Retrofit.end_batch`` (router statistics, task-free expert schedule) ->
anytime evaluation when due -> at a session's last batch, the session-end evaluation *then* the
method's session-end hook (the reference's order, kept so that A_last is comparable; reference bug
6.2.6 notes that this keeps HiDe/NoRGa's final classifier alignment out of A_last).

Variants (``VARIANTS``): ``baseline`` is the method as published; ``router`` / ``ensemble`` / ``both``
retrofit the analytic router and/or the temporal ensemble through ``fly_modules.adapters.reference``
(the same adapter users call). FlyPrompt has both built in and runs as ``full`` only.

Deliberate differences from the reference loop (each one keeps a number comparable or fixes a bug):

* ``Protocol.router_query="first_iteration"`` (the CPU presets) feeds the router the query pass of
  the batch's first online iteration instead of a second, clean pass (the reference's, the default).
* The ensemble's EMA step is skipped when AMP's GradScaler skipped the optimizer step (6.2.10).
* Empty sessions still get their session-end evaluation and hooks (6.2.11).
"""

from __future__ import annotations

import contextlib
import resource
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from fly_modules.adapters import reference as reference_adapter
from torch import nn

from fly_modules import AnalyticRouter, SampleBudgetSchedule, SessionSchedule, batch_seen_class_mask, seen_class_mask

from .backbone import BackboneLoadError as BackboneLoadError
from .backbone import build_backbone as _build_timm_backbone
from .metrics import AnytimeEvalTrigger, EvaluationLog, count_correct, summarize
from .stream import build_si_blurry_stream

__all__ = ["VARIANTS", "PAPER_METHODS", "Protocol", "RunSpec", "run", "build_backbone", "BackboneLoadError"]

#: variant -> (router, ensemble)
VARIANTS: Dict[str, Tuple[bool, bool]] = {
    "baseline": (False, False),
    "router": (True, False),
    "ensemble": (False, True),
    "both": (True, True),
    "full": (False, False),  # FlyPrompt: router and ensemble are built in
}
#: the methods of the paper's cross-ablation table
PAPER_METHODS = ("l2p", "dualprompt", "mvp", "misa", "hide", "norga")


ROUTER_QUERIES = ("clean", "first_iteration")


@dataclass
class Protocol:
    """Every setting of a run except (method, variant, dataset, seed). See ``cross_ablation.py --help``."""

    model: str = "vit_base_patch16_224.orig_in21k"
    model_kwargs: Dict[str, Any] = field(default_factory=dict)
    pretrained: bool = True
    weights: Optional[str] = None
    image_size: int = 224
    batch_size: int = 64
    online_iter: int = 3
    eval_period: int = 1000
    test_batch_size: int = 128
    num_sessions: int = 5
    disjoint_ratio: float = 0.5
    blurry_ratio: float = 0.1
    num_experts: int = 5
    lr: Optional[float] = None  # None: the method's default (Adam 0.005; 0.003 for HiDe-Prompt/NoRGa)
    expansion_dim: int = 10_000
    ridge: float = 1e4
    decays: Tuple[float, ...] = (0.9, 0.99)
    aggregate: str = "softmax_max"
    amp: bool = True  # used on CUDA only
    augment: bool = True
    method_kwargs: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    misa_prompts: Optional[str] = None  # folder with g_prompt.pt and e_prompt.pt
    # Router statistics from "clean": a frozen fp32 pass over the un-augmented batch (the reference,
    # reference-protocol 3.4 step 3), or "first_iteration": the query pass of the batch's first online
    # iteration (augmented, under autocast; one backbone pass fewer).
    router_query: str = "clean"

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunSpec:
    method: str
    variant: str
    dataset: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.method}/{self.variant}/seed{self.seed}"


def build_backbone(protocol: Protocol) -> nn.Module:
    """The protocol's timm ViT (no classifier), weights as :mod:`benchmarks.backbone` resolves them."""
    return _build_timm_backbone(
        protocol.model, protocol.model_kwargs, pretrained=protocol.pretrained, weights=protocol.weights
    )


def _build_method(spec: RunSpec, protocol: Protocol, num_classes: int, device: torch.device) -> nn.Module:
    from .methods import create_method

    torch.manual_seed(spec.seed)
    backbone = build_backbone(protocol)
    kwargs: Dict[str, Any] = {"num_experts": protocol.num_experts}
    kwargs.update(protocol.method_kwargs.get(spec.method, {}))
    if spec.method == "flyprompt":
        kwargs.setdefault("router_seed", spec.seed)  # the expansion R differs per seed, as in the reference
        kwargs.setdefault("router_expansion_dim", protocol.expansion_dim)
        kwargs.setdefault("router_ridge", protocol.ridge)
        kwargs.setdefault("decays", protocol.decays)
        kwargs.setdefault("aggregate", protocol.aggregate)
    if spec.method in ("hide", "norga") and protocol.lr is not None:
        # Classifier alignment runs at the run's lr (reference-protocol 4.7). Its batch stays the
        # method's 64, the paper's B (the CPU presets' smaller B is not used there).
        kwargs.setdefault("ca_lr", protocol.lr)
    if spec.method == "misa" and "g_prompt" not in kwargs:
        if protocol.misa_prompts:
            kwargs["g_prompt"] = f"{protocol.misa_prompts}/g_prompt.pt"
            kwargs["e_prompt"] = f"{protocol.misa_prompts}/e_prompt.pt"
        else:
            # No pretrained prompts supplied: MISA degenerates to DualPrompt with 10 G tokens per layer
            # and a seeded uniform initialisation (the run record says so in its notes).
            layout = {k: v for k, v in kwargs.items() if k not in ("num_experts", "reference_quirks")}
            shapes = create_method("dualprompt", backbone, num_classes, num_experts=protocol.num_experts,
                                   **{"g_prompt_length": 10, **layout})
            generator = torch.Generator().manual_seed(spec.seed)
            kwargs["g_prompt"] = torch.empty_like(shapes.g_prompts).uniform_(-1, 1, generator=generator)
            kwargs["e_prompt"] = torch.empty_like(shapes.e_prompts).uniform_(-1, 1, generator=generator)
    return create_method(spec.method, backbone, num_classes, **kwargs).to(device)


def _configure_determinism(device: torch.device) -> None:
    """cuDNN picks deterministic kernels, as the reference sets (reference-protocol 3.9)."""
    if device.type == "cuda":
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def _distributed_context(process_group: Optional[Any]) -> Tuple[Optional[Any], int, int]:
    """``(group, rank, world)``; ``group`` is ``None`` for a single process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None, 0, 1
    world = dist.get_world_size(process_group)
    if world == 1:
        return None, 0, 1
    group = process_group if process_group is not None else dist.group.WORLD
    return group, dist.get_rank(process_group), world


def _sum_gradients(parameters: Sequence[torch.nn.Parameter], group: Any) -> None:
    """Sum gradients over the ranks in one flat all-reduce. A parameter that received a gradient on
    any rank gets one (zeros) on every rank, so optimizers skip exactly the same parameters."""
    import torch.distributed as dist

    present = torch.tensor([p.grad is not None for p in parameters], dtype=torch.uint8, device=parameters[0].device)
    dist.all_reduce(present, op=dist.ReduceOp.MAX, group=group)
    used = [p for p, flag in zip(parameters, present.tolist()) if flag]
    for p in used:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not used:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in used])
    dist.all_reduce(flat, group=group)
    offset = 0
    for p in used:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()


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


def run(
    spec: RunSpec,
    protocol: Protocol,
    train: Any,
    test: Any,
    *,
    device: torch.device,
    progress: Optional[Callable[..., Any]] = None,
    process_group: Optional[Any] = None,
) -> Dict[str, Any]:
    """Train ``spec.method`` online on the Si-Blurry stream of ``train`` and evaluate on ``test``.

    ``train``/``test`` are ``benchmarks.data.ImageDataset`` records. Returns a JSON-serialisable record:
    the spec, the metrics (official-code and paper definitions), the evaluation log, timings and memory.

    With an initialised ``torch.distributed`` (``process_group``, or the default group when it is
    initialised with more than one process) the run is data-parallel and computes what one process
    computes, up to floating-point summation order: every rank takes every ``world``-th sample of
    each global batch (the stream is not truncated, unlike the reference's sharding), gradients are
    summed with weights ``n_rank / n_global`` (the global mean loss), the routers and the methods'
    batch statistics see the global batch (``AnalyticRouter.process_group``,
    ``PromptMethod.gather_batch``), the ensemble moves the union of the banks the ranks trained,
    and each rank evaluates a share of the test subset whose counts are summed. A global batch
    smaller than the number of ranks is computed whole on every rank.
    """
    if spec.variant not in VARIANTS:
        raise ValueError(f"unknown variant {spec.variant!r}; expected one of {sorted(VARIANTS)}")
    if (spec.method == "flyprompt") != (spec.variant == "full"):
        raise ValueError("FlyPrompt runs as variant 'full' only, and 'full' is FlyPrompt's variant")
    if protocol.router_query not in ROUTER_QUERIES:
        raise ValueError(f"router_query must be one of {ROUTER_QUERIES}, got {protocol.router_query!r}")
    group, rank, world = _distributed_context(process_group)
    _configure_determinism(device)
    num_classes = len(train.classes)
    model = _build_method(spec, protocol, num_classes, device)
    stream = build_si_blurry_stream(
        train.targets, num_sessions=protocol.num_sessions, disjoint_ratio=protocol.disjoint_ratio,
        blurry_ratio=protocol.blurry_ratio, seed=spec.seed,
    )
    exposure = stream.exposure()
    stream_length = sum(int(order.numel()) for order in stream.session_orders)
    if model.session_aware:
        schedule = SessionSchedule(model.num_experts)
    else:
        schedule = SampleBudgetSchedule.from_stream_size(stream_length, model.num_experts)
    lr = protocol.lr if protocol.lr is not None else type(model).default_lr
    optimizer = torch.optim.Adam(model.trainable_parameters(), lr=lr)
    use_router, use_ensemble = VARIANTS[spec.variant]
    handle = reference_adapter.retrofit(
        model, router=use_router, ensemble=use_ensemble, optimizer=None, schedule=schedule,
        expansion_dim=protocol.expansion_dim, ridge=protocol.ridge, seed=spec.seed,
        decays=protocol.decays, aggregate=protocol.aggregate,
    )
    if handle.router is not None:
        handle.router.to(device)
    trainable = list(model.trainable_parameters())

    def set_group(active: Optional[Any], share: float = 1.0) -> None:
        model.process_group = active
        model.batch_share = share
        handle.process_group = active
        for module in [*model.modules(), *([handle.router] if handle.router is not None else [])]:
            if isinstance(module, AnalyticRouter):
                module.process_group = active

    amp = protocol.amp and device.type == "cuda"
    scaler = _grad_scaler(amp)
    # amp is CUDA-only; torch < 2.1 rejects a float16 CPU autocast even when it is disabled.
    autocast = (lambda: torch.autocast("cuda", dtype=torch.float16)) if amp else contextlib.nullcontext
    augment = train.train_transform if protocol.augment else None
    seen_mask_training = getattr(model, "train_logit_mask", "batch") == "seen"
    log = EvaluationLog(meta={"spec": asdict(spec), "lr": lr})
    trigger = AnytimeEvalTrigger(protocol.eval_period)
    test_targets = test.targets

    def evaluate(kind: str, timestamp: int, samples_seen: int, session: int) -> None:
        model.eval()
        model.on_evaluate()
        exposed = exposure.num_exposed(samples_seen)
        indices, targets = exposure.eval_subset(test_targets, samples_seen)
        mask = seen_class_mask(exposed, num_classes, device=device)
        indices, targets = indices[rank::world], targets[rank::world]  # this rank's share
        predictions = []
        with torch.no_grad():
            for chunk in torch.split(indices, protocol.test_batch_size):
                images, _ = test.get_batch(chunk)
                predictions.append(model.predict(images.to(device), mask).argmax(dim=1).cpu())
        predicted = torch.cat(predictions) if predictions else torch.empty(0, dtype=torch.long)
        correct, total = count_correct(predicted, targets, exposed)
        if group is not None:
            counts = torch.stack([correct, total]).to(device)
            torch.distributed.all_reduce(counts, group=group)
            correct, total = counts.cpu()
        log.record(kind, timestamp=timestamp, samples_seen=samples_seen, session=session, correct=correct, total=total)
        model.train()

    def finish_session(session: int, samples_seen: int) -> None:
        evaluate("session_end", samples_seen, samples_seen, session)
        model.on_session_end(session)

    memory = _PeakMemory(device)
    train_seconds = 0.0
    num_batches = stream.num_batches(protocol.batch_size)
    bar = progress(total=num_batches, desc=spec.key, leave=False) if progress else None
    current_session, samples_seen = -1, 0
    model.train()
    for batch in stream.batches(protocol.batch_size, rank=None):  # whole global batches
        while current_session < batch.session:  # also walks over empty sessions
            if current_session >= 0:
                finish_session(current_session, samples_seen)
            current_session += 1
            handle.start_session(current_session)
        started = time.perf_counter()
        # A global batch smaller than the number of ranks is computed whole on every rank (identically).
        sharded = group is not None and batch.global_size >= world
        local = batch.indices[rank::world] if sharded else batch.indices
        set_group(group, local.numel() / batch.global_size) if sharded else set_group(None)
        raw, labels = train.get_raw_batch(local)
        targets = exposure.to_exposure(labels).to(device)
        if seen_mask_training:
            mask = seen_class_mask(exposure.num_exposed(batch.samples_seen), num_classes, device=device)
        else:  # the classes of the global batch, as one process would see them
            mask = batch_seen_class_mask(exposure.to_exposure(batch.targets), num_classes, device=device)
        clean = None if augment else train.get_batch(local)[0].to(device)
        first_output = None
        for _ in range(protocol.online_iter):
            images = augment(raw).to(device) if augment else clean
            with autocast():
                output = model(images)
                loss = model.loss(output, targets, mask)
            optimizer.zero_grad(set_to_none=True)
            scale = scaler.get_scale() if amp else 1.0
            weight = local.numel() / batch.global_size if sharded else 1.0
            scaler.scale(loss * weight).backward()
            if sharded:
                _sum_gradients(trainable, group)
            scaler.step(optimizer)
            scaler.update()
            if not amp or scaler.get_scale() >= scale:  # the step was not skipped
                model.on_optimizer_step(output)
                handle.update_ensemble()
            first_output = first_output or output
        router_query = None
        has_router = handle.router is not None or isinstance(getattr(model, "router", None), AnalyticRouter)
        # Without augmentation or autocast the first iteration's query pass already is the clean fp32
        # pass over the un-augmented batch; only otherwise does "clean" cost a second backbone pass.
        if protocol.router_query == "clean" and has_router and (augment is not None or amp):
            # The un-augmented batch, test transform, fp32, no grad: what the router sees at test time.
            unaugmented = clean if clean is not None else train.get_batch(local)[0].to(device)
            with torch.no_grad():
                router_query = model.compute_query(unaugmented).router
            first_output = replace(first_output, query=replace(first_output.query, router=router_query))
        model.on_batch_end(images, targets, first_output)
        handle.end_batch(batch.global_size, query=router_query)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train_seconds += time.perf_counter() - started
        samples_seen = batch.samples_seen
        stamp = trigger.step(batch.samples_seen, batch.global_size)
        if stamp is not None:
            evaluate("anytime", stamp, batch.samples_seen, batch.session)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss):.3f}", session=batch.session)
    while current_session < protocol.num_sessions:  # last session and trailing empty ones
        if current_session >= 0:
            finish_session(current_session, samples_seen)
        current_session += 1
        if current_session < protocol.num_sessions:
            handle.start_session(current_session)
    if bar is not None:
        bar.close()
    set_group(None)
    handle.remove()
    class_session = exposure.per_exposure(stream.home_session)
    return {
        "spec": asdict(spec),
        "protocol": protocol.to_dict(),
        "metrics": summarize(log),
        "metrics_paper": summarize(log, definition="paper", class_session=class_session),
        "log": log.to_dict(),
        "num_batches": num_batches,
        "stream_length": stream_length,
        "seconds_per_batch": train_seconds / max(num_batches, 1),
        "peak_memory_mb": memory.read_mb(),
        "device": str(device),
        "notes": "MISA without pretrained prompts (uniform init)" if spec.method == "misa" and not protocol.misa_prompts else "",
    }


def _grad_scaler(enabled: bool) -> Any:
    """A CUDA GradScaler: ``torch.amp.GradScaler`` (torch >= 2.3), else the older ``torch.cuda.amp`` one."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)
