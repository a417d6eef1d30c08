"""What a harness supplies about one repository x family, and the loop that drives it.

A ``Pair`` builds the repository's real model (and its trainer, engine or learner), makes the
repository's own per-batch training call and evaluation call, and names the counters and prompt slots
the checks observe. ``run_loop`` wraps those calls in the README retrofit loop.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import torch

from benchmarks.upstream.loading import quiet


class Pair:
    """name, method (the retrofit method string), schedule ('samples' or 'session'), counter_name (the
    method's own step counter that check (f) reads; None when the method has none, counter_na says why)."""

    name = "?"
    method = "?"
    schedule = "samples"
    counter_name: Optional[str] = None
    counter_na = "the method trains no per-step slots and keeps no step counter"
    # Why the repository's own loop replaces Parameter objects (then (g) compares their names, not identities).
    replaces_own_parameters = ""

    def meta(self) -> Dict[str, Any]:
        """What was built (printed and stored with the results)."""
        return {}

    def build(self, seed: int) -> SimpleNamespace:
        """A fresh context: at least ``model`` and ``optimizer``."""
        raise NotImplementedError

    def family_options(self, ctx: SimpleNamespace) -> Dict[str, Any]:
        """Extra retrofit keyword arguments (num_experts, original_model, ...)."""
        return {}

    def start_task(self, ctx: SimpleNamespace, task: int, own_advance: bool) -> None:
        """The repository's own actions at a task start; ``own_advance``: its own step-counter advance runs."""

    def train_batch(self, ctx: SimpleNamespace, x: torch.Tensor, y: torch.Tensor, task: int) -> List[float]:
        """The repository's own training call(s) on one stream batch; the losses of its iterations."""
        raise NotImplementedError

    def after_batch(self, ctx: SimpleNamespace, x: torch.Tensor, handle: Any, task: int) -> None:
        """Between one batch and the next: the README's ``end_batch``."""
        if handle is not None:
            handle.end_batch(len(x))

    def eval_logits(self, ctx: SimpleNamespace, x: torch.Tensor, y: torch.Tensor):
        """(logits, pool row each sample used or None) as the repository's evaluation computes them."""
        raise NotImplementedError

    def counter(self, ctx: SimpleNamespace) -> Optional[int]:
        """The method's own training step counter (check f), None when it has none."""
        return None

    def sync_counter(self, ctx: SimpleNamespace) -> Optional[int]:
        """The counter the README loop keeps the handle in step with (default: ``counter``)."""
        return self.counter(ctx)

    def slot_usage(self, ctx: SimpleNamespace) -> Optional[torch.Tensor]:
        """A per-slot usage count of the training forwards (diffed around a batch), or None."""
        return None

    def expert_slots(self, ctx: SimpleNamespace, expert: int) -> Optional[List[int]]:
        return None

    def verify_forward(self, ctx: SimpleNamespace, handle: Any) -> Callable:
        """``forward(batch)`` as the repository's loop calls the model (for ``handle.verify``)."""
        return lambda x: ctx.model(x)

    def probes(self, ctx: SimpleNamespace, adapters: Any) -> List[tuple]:
        """Extra informational retrofit attempts: (key, status, title, detail) rows."""
        return []

    def optimizers(self, ctx: SimpleNamespace) -> List[Any]:
        return [ctx.optimizer]

    def roots(self, ctx: SimpleNamespace) -> Dict[str, torch.nn.Module]:
        """The modules whose structure check (g) compares."""
        return {"model": ctx.model, "original_model": getattr(ctx, "original_model", None)}


def active_handle(ctx: SimpleNamespace) -> Any:
    """The live retrofit handle of a context (None when absent or removed)."""
    handle = getattr(ctx, "handle", None)
    return handle if handle is not None and not handle.removed else None


def run_loop(pair: Pair, ctx: SimpleNamespace, train, handle=None, *, sync_expert: bool, own_advance: bool,
             session_calls: bool, on_batch: Optional[Callable] = None, verbose: bool = False) -> List[float]:
    """The README loop around the repository's own calls; returns the training losses.

    ``sync_expert`` (no schedule): the documented sync -- whenever the method's own counter differs from
    the handle's current expert (right after the repository advanced it, before end_batch), call
    ``handle.start_expert(counter)``; methods without a counter get ``start_expert(task)`` at task start.
    ``session_calls``: ``handle.start_session(task)`` at each task start (SessionSchedule).
    """
    losses: List[float] = []

    def sync(task: int) -> None:
        if handle is None or not sync_expert:
            return
        counter = pair.sync_counter(ctx)
        target = task if counter is None else counter
        if target != handle.current_expert:
            handle.start_expert(int(target))

    for task, batches in enumerate(train):
        with quiet(not verbose):
            pair.start_task(ctx, task, own_advance)
        if handle is not None and session_calls:
            handle.start_session(task)
        sync(task)
        for x, y in batches:
            before = pair.slot_usage(ctx)
            with quiet(not verbose):
                losses += pair.train_batch(ctx, x.clone(), y.clone(), task)
            if on_batch is not None:
                on_batch(task, before, pair.slot_usage(ctx))
            if pair.sync_counter(ctx) is not None:
                sync(task)
            pair.after_batch(ctx, x, handle, task)
    return losses
