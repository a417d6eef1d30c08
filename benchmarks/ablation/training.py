"""The online training loop: one pass over a Si-Blurry stream, calling the method's hooks, the
components' steps and the evaluations in the order docs/methods.md ("The training loop") documents
and tests/test_runner.py checks. Every piece of run state lives in an object with ``state_dict``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from fly_modules import SampleBudgetSchedule, SessionSchedule

from ..core.metrics import AnytimeEvalTrigger
from ..core.stream import Exposure, SiBlurryStream, StreamBatch
from ..core.timer import NO_TIMER, PartTimer
from ..methods.base import MethodOutput, PromptMethod
from ..parallel import BatchShare, DataParallel
from .components import Components
from .diagnostics import ExpertUsage
from .expert_schedules import build_schedule
from .logit_masks import TrainingMask

__all__ = ["MixedPrecision", "OnlineTrainer", "StreamPosition"]


class MixedPrecision:
    """float16 autocast and a GradScaler on CUDA when enabled; plain fp32 steps otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled)
        if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
            self.scaler = torch.amp.GradScaler("cuda", enabled=self.enabled)
        else:
            self.scaler = torch.cuda.amp.GradScaler(enabled=self.enabled)

    def autocast(self) -> Any:
        # torch < 2.1 rejects a float16 CPU autocast even when it is disabled: no context at all then.
        return torch.autocast("cuda", dtype=torch.float16) if self.enabled else contextlib.nullcontext()

    def step(self, loss: Tensor, optimizer: torch.optim.Optimizer, parameters: list, share: BatchShare) -> bool:
        """Backward of ``loss`` (scaled by the share), gradients summed over the processes, one step.

        Returns whether the optimizer stepped (AMP skips a step whose gradients overflowed).
        """
        scale = self.scaler.get_scale() if self.enabled else 1.0
        self.scaler.scale(loss * share.fraction).backward()
        DataParallel.sum_gradients(parameters, share)
        self.scaler.step(optimizer)
        self.scaler.update()
        return not self.enabled or self.scaler.get_scale() >= scale

    def state_dict(self) -> Dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)


@dataclass
class StreamPosition:
    """Where the loop is: the current session (-1 before the first), samples consumed, training time."""

    session: int = -1
    samples_seen: int = 0
    batches: int = 0
    train_seconds: float = 0.0

    def state_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


class OnlineTrainer:
    """Trains ``model`` on ``stream`` and calls ``evaluate(kind, ...)`` at every evaluation point.

    Args:
        model: the method (``benchmarks.methods`` seam contract).
        components: its REAR and TE2 (``benchmarks.ablation.components``), started and stepped with it.
        evaluate: called as ``evaluate(kind, timestamp=, samples_seen=, session=, final=)`` in eval mode.
        usage: the class x expert counts of the training forwards.
        protocol: ``benchmarks.ablation.runner.Protocol``.
        train: the training set (``benchmarks.data`` record: ``get_raw_batch``, ``get_batch``, ``train_transform``).
        lr: the run's learning rate (``model.make_optimizer``'s).
        seed: the run's seed (the random training mask's draws).
        timer: times the parts of each batch (``benchmarks.core.timer``; the profile and the plan's probe).
    """

    def __init__(
        self, model: PromptMethod, components: Components, evaluate: Callable[..., None], usage: ExpertUsage, *,
        protocol: Any, train: Any, stream: SiBlurryStream, exposure: Exposure, parallel: DataParallel,
        device: torch.device, lr: float, timer: PartTimer = NO_TIMER, seed: int = 0,
    ) -> None:
        self.model, self.components, self.evaluate_at, self.usage = model, components, evaluate, usage
        self.protocol, self.train_set, self.stream, self.exposure = protocol, train, stream, exposure
        self.parallel, self.device = parallel, device
        self.num_classes = len(train.classes)
        self.schedule: Any = build_schedule(model, protocol.expert_schedule, len(stream))
        self.mask = TrainingMask(protocol.train_mask, model, exposure, self.num_classes, seed=seed, parallel=parallel,
                                 device=device)
        self.parameters = list(model.trainable_parameters())
        self.optimizer = model.make_optimizer(lr)
        self.precision = MixedPrecision(protocol.amp and device.type == "cuda")
        self.augment = train.train_transform if protocol.augment else None
        self.trigger = AnytimeEvalTrigger(protocol.eval_period)
        self.position = StreamPosition()
        self.timer = timer

    # ---------------------------------------------------------------------------- the stream
    def train(self, progress: Optional[Any] = None, boundary: Optional[Callable[[bool], None]] = None,
              watch: Optional[Any] = None) -> None:
        """The rest of the stream (all of it, or what follows a restored :meth:`load_state_dict`).

        ``progress`` is a tqdm-like bar (``update``, ``set_postfix``); ``boundary(evaluated)`` is called
        after every batch, ``evaluated`` saying whether an anytime evaluation followed it (checkpoints);
        ``watch`` (``benchmarks.ablation.run_log.TrainingLog``) is given each batch's loss and called after
        each anytime evaluation, before the boundary.
        """
        self.model.train()
        for batch in self.stream.batches(self.protocol.batch_size, rank=None):  # whole global batches
            if batch.index < self.position.batches:
                continue  # trained before the checkpoint this run resumed from
            self.advance_to(batch.session)
            loss = self.train_batch(batch)
            if watch is not None:
                watch.batch_trained(loss)
            evaluated = self.after_batch(batch)
            if watch is not None and evaluated:
                watch.evaluated(self)
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{float(loss):.3f}", session=batch.session)
            if boundary is not None:
                boundary(evaluated)
        self.advance_to(self.stream.num_sessions)  # the last session and trailing empty ones

    def advance_to(self, session: int) -> None:
        """Finish the sessions before ``session`` and start the next ones, up to ``session`` itself."""
        while self.position.session < session:
            if self.position.session >= 0:
                self.finish_session(self.position.session)
            self.position.session += 1
            if self.position.session < self.stream.num_sessions:
                self.start_session(self.position.session)

    def start_session(self, session: int) -> None:
        if isinstance(self.schedule, SessionSchedule):
            for expert in self.schedule.on_session_start(session):
                self.components.start_expert(expert)

    def finish_session(self, session: int) -> None:
        seen = self.position.samples_seen
        self.evaluate("session_end", seen, seen, session)
        self.model.on_session_end(session)

    # ------------------------------------------------------------------------------ one batch
    def train_batch(self, batch: StreamBatch) -> Tensor:
        """The batch's online iterations and its per-batch hooks; returns the last loss (detached)."""
        started = time.perf_counter()
        timer = self.timer
        with timer("train/data"):
            local, share = self.parallel.share(batch.indices)
            raw, labels = self.train_set.get_raw_batch(local)
            targets = self.exposure.to_exposure(labels).to(self.device)
            mask = self.training_mask(batch)
            clean = None if self.augment else self.train_set.get_batch(local)[0].to(self.device)
        first: Optional[MethodOutput] = None
        for _ in range(self.protocol.online_iter if self.model.trains_online() else 0):
            with timer("train/augment"):
                images = self.augment(raw).to(self.device) if self.augment else clean
            with timer("train/steps"):
                output, loss = self.train_step(images, targets, mask, share)
            first = output if first is None else first
        if first is None:  # nothing to train on this batch: one forward, for the hooks
            with timer("train/forward_only"):
                images, first, loss = self.forward_only(raw, clean, local, targets, mask, share)
        else:
            with timer("train/router_query"):
                first = self.with_router_features(first, clean, local)
        with timer("train/batch_end"):
            self.model.on_batch_end(images, targets, first, share)
            self.components.end_batch(first.query.router, share)
            if isinstance(self.schedule, SampleBudgetSchedule):
                for expert in self.schedule.step(batch.global_size):
                    self.components.start_expert(expert)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.position.train_seconds += time.perf_counter() - started
        return loss.detach()

    def train_step(self, images: Tensor, targets: Tensor, mask: Tensor, share: BatchShare):
        """One optimizer step on one (augmented) copy of the batch; returns ``(output, loss)``."""
        with self.precision.autocast():
            output = self.model(images, parallel=share)
            loss = self.model.loss(output, targets, mask, parallel=share)
        self.usage.add(targets, self.model.expert_of(output.selection), share)
        self.optimizer.zero_grad(set_to_none=True)
        if self.precision.step(loss, self.optimizer, self.parameters, share):
            self.model.on_optimizer_step(output)
            self.components.after_optimizer_step(output, share)
        return output, loss

    @torch.no_grad()
    def forward_only(
        self, raw: Tensor, clean: Optional[Tensor], local: Tensor, targets: Tensor, mask: Tensor, share: BatchShare,
    ) -> Tuple[Tensor, MethodOutput, Tensor]:
        """``(images, output, loss)`` of the one forward of a batch the method trains nothing on
        (``trains_online()`` false), over the images its router features come from (``Protocol.router_query``:
        the un-augmented batch in fp32, or an augmented copy as a first iteration sees it), so that one pass
        gives both; the loss is only reported."""
        if self.protocol.router_query == "clean":
            images = clean if clean is not None else self.train_set.get_batch(local)[0].to(self.device)
            output = self.model(images, parallel=share)
        else:
            images = self.augment(raw).to(self.device) if self.augment else clean
            with self.precision.autocast():
                output = self.model(images, parallel=share)
        self.usage.add(targets, self.model.expert_of(output.selection), share)
        return images, output, self.model.loss(output, targets, mask, parallel=share)

    def training_mask(self, batch: StreamBatch) -> Tensor:
        """The batch's training logit mask (``Protocol.train_mask``, ``benchmarks.ablation.logit_masks``)."""
        return self.mask(batch)

    def with_router_features(self, first: MethodOutput, clean: Optional[Tensor], local: Tensor) -> MethodOutput:
        """``first`` whose ``query.router`` are the batch's router features (``Protocol.router_query``).

        Without augmentation or autocast the first iteration's query pass already is the clean fp32
        pass over the un-augmented batch; only otherwise does "clean" cost a second backbone pass.
        """
        if self.protocol.router_query != "clean" or not (self.augment is not None or self.precision.enabled):
            return first
        unaugmented = clean if clean is not None else self.train_set.get_batch(local)[0].to(self.device)
        with torch.no_grad():  # the test transform, fp32: what the router sees at test time
            router = self.model.compute_query(unaugmented).router
        return replace(first, query=replace(first.query, router=router))

    def after_batch(self, batch: StreamBatch) -> bool:
        """Count the batch and run the anytime evaluation if one is due; returns whether one ran."""
        self.position.samples_seen = batch.samples_seen
        self.position.batches += 1
        stamp = self.trigger.step(batch.samples_seen, batch.global_size)
        if stamp is not None:
            self.evaluate("anytime", stamp, batch.samples_seen, batch.session)
        return stamp is not None

    # ---------------------------------------------------------------------------- evaluation
    def evaluate(self, kind: str, timestamp: int, samples_seen: int, session: int) -> None:
        self.model.eval()
        self.model.on_evaluate()
        final = kind == "session_end" and session == self.stream.num_sessions - 1
        self.evaluate_at(kind, timestamp=timestamp, samples_seen=samples_seen, session=session, final=final)
        self.model.train()

    def state_dict(self) -> Dict[str, Any]:
        """Every piece of training state, for a checkpoint (the evaluator keeps its own)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "precision": self.precision.state_dict(),
            "schedule": self.schedule.state_dict(),
            "trigger": self.trigger.state_dict(),
            "usage": self.usage.state_dict(),
            "components": self.components.state_dict(),
            "position": self.position.state_dict(),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into a trainer built like the one that saved it; :meth:`train`
        then continues after the last batch it had trained."""
        parts = {
            "model": self.model, "optimizer": self.optimizer, "precision": self.precision, "schedule": self.schedule,
            "trigger": self.trigger, "usage": self.usage, "components": self.components, "position": self.position,
        }
        if set(state) != set(parts):
            raise ValueError(f"OnlineTrainer.load_state_dict: expected the parts {sorted(parts)}, got {sorted(state)}")
        for name, part in parts.items():  # the model before its components (the ensemble wraps its head)
            part.load_state_dict(state[name])
