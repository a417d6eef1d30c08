"""Our side: the reference method built and trained by the cross-ablation's own runner
(``benchmarks.ablation.runner.build_run``: the method's initialisation, ``OnlineTrainer``'s batches,
masks, schedules, evaluations), one stream batch at a time so that the official side can follow."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch import Tensor

from benchmarks.ablation.runner import build_run
from benchmarks.core.metrics import a_auc, a_last
from benchmarks.core.stream import StreamBatch
from benchmarks.methods import method_class
from fly_modules import seen_class_mask

from .pairs import MethodPair
from .setting import Setting

__all__ = ["OursSide"]

CPU = torch.device("cpu")


class _Notifying:
    """The runner's evaluation callable, followed by ``listeners(kind, samples_seen)``."""

    def __init__(self, evaluate: Callable[..., None]) -> None:
        self.evaluate = evaluate
        self.listeners: List[Callable[[str, int], None]] = []

    def __call__(self, kind: str, **where: Any) -> None:
        self.evaluate(kind, **where)
        for listener in self.listeners:
            listener(kind, where["samples_seen"])


class _Reseeded:
    """A session-end hook preceded by ``torch.manual_seed(seed + session)``."""

    def __init__(self, hook: Callable[[int], None], seed: int) -> None:
        self.hook, self.seed = hook, seed

    def __call__(self, session: int) -> None:
        torch.manual_seed(self.seed + session)
        self.hook(session)


class OursSide:
    """The runner's objects for ``pair.method`` on ``setting``; ``evaluations.listeners`` are called after
    each of the runner's evaluations (the official side evaluates at the same points)."""

    def __init__(self, pair: MethodPair, setting: Setting, train: Any, test: Any) -> None:
        protocol = setting.protocol()
        protocol = replace(protocol, method_kwargs={pair.method: {**pair.ours_kwargs, **setting.method_kwargs}})
        variant = "full" if method_class(pair.method).builtin_components else "baseline"
        self.variant = variant
        self.run = build_run(pair.method, "generated", setting.seed, [variant], protocol, train, test, device=CPU)
        self.model, self.trainer, self.setting = self.run.model, self.run.trainer, setting
        if setting.explicit_attention:
            for module in self.model.backbone.modules():
                if hasattr(module, "fused_attn"):
                    module.fused_attn = False
        if pair.session_end_seed is not None:
            self.model.on_session_end = _Reseeded(self.model.on_session_end, pair.session_end_seed)
        self.evaluations = _Notifying(self.trainer.evaluate_at)
        self.trainer.evaluate_at = self.evaluations

    def batches(self) -> Iterator[StreamBatch]:
        return self.run.stream.batches(self.setting.batch_size, rank=None)

    def advance(self, batch: StreamBatch) -> None:
        """What ``OnlineTrainer.train`` does before a batch: end the sessions before it (evaluations)."""
        self.model.train()
        self.trainer.advance_to(batch.session)

    def train(self, batch: StreamBatch) -> None:
        """What ``OnlineTrainer.train`` does for a batch: its online iterations, then an anytime evaluation
        when one is due."""
        self.model.train()
        self.trainer.train_batch(batch)
        self.trainer.after_batch(batch)

    def state(self) -> Dict[str, Tensor]:
        return dict(self.model.state_dict(keep_vars=True))

    def finish(self) -> None:
        self.trainer.advance_to(self.run.stream.num_sessions)

    @torch.no_grad()
    def predict(self, images: Tensor, samples_seen: Optional[int] = None) -> "tuple[Tensor, Tensor]":
        """``(scores, selection)``: the method's own inference with the seen-class mask, and its selection."""
        self.model.eval()
        exposure = self.run.exposure
        mask = seen_class_mask(exposure.num_exposed(samples_seen), self.model.num_classes)
        scores = self.model.predict(images, logit_mask=mask)
        return scores, self.model(images).selection

    def metrics(self) -> "tuple[float, float]":
        """``(A_auc, A_last)`` of the run's evaluation log (the official code's definitions)."""
        log = self.run.evaluator.logs[self.variant]
        return a_auc(log), a_last(log)
