"""The step counters of the Si-Blurry lineage (FlyGCL ``task_count``, MISA ``task_id``): the attribute
whose value decides which step's prompts the model trains, moved when the retrofit starts an expert."""

from __future__ import annotations

from typing import Callable, Optional

from torch import nn

from ._handle import StepCounter

__all__ = ["step_counter", "expert_starter"]


def step_counter(model: nn.Module) -> Optional[StepCounter]:
    """FlyGCL's ``task_count`` (advanced by ``process_task_count()``, which also prepares the step), else
    MISA's ``task_id`` (its loop increments it; set directly); ``None`` when the model has neither."""
    if callable(getattr(model, "process_task_count", None)) and isinstance(getattr(model, "task_count", None), int):
        def process(expert: int) -> None:
            while int(model.task_count) < expert:
                model.process_task_count()

        return StepCounter(model, "task_count", process)
    if isinstance(getattr(model, "task_id", None), int):
        return StepCounter(model, "task_id", lambda expert: setattr(model, "task_id", int(expert)))
    return None


def expert_starter(counter: Optional[StepCounter], start_expert: Optional[Callable[[int], None]]) -> Callable[[int], None]:
    """The method's expert start: the user's ``start_expert`` if given, else moving its step counter."""

    def start(expert: int) -> None:
        if start_expert is not None:
            start_expert(expert)
        elif counter is not None:
            counter.advance(expert)

    return start
