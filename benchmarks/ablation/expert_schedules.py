"""Which schedule starts a method's experts: its own, task-correlated (one expert per session) or
self-triggered (a new expert every ``w`` stream samples), chosen by ``Protocol.expert_schedule``.

The task-free methods (FlyPrompt, MVP, MISA, DualPrompt) start their experts on a sample budget
``w = floor(N_train / num_experts)``; the session-aware ones (L2P, HiDe-Prompt, NoRGa, ...) at session starts,
and their session-end hooks assume it, so they take no budget. The paper's tasks x experts study compares the
two schedules for the task-free methods (docs/benchmark.md, Studies).
"""

from __future__ import annotations

from typing import Any, Dict, Union

from fly_modules import SampleBudgetSchedule, SessionSchedule

__all__ = ["EXPERT_SCHEDULES", "build_schedule", "schedule_refusal"]

#: ``Protocol.expert_schedule`` -> what it does
EXPERT_SCHEDULES: Dict[str, str] = {
    "method": "the method's own (session starts for the session-aware methods, a sample budget for the others)",
    "session": "task-correlated: a new expert at each session start",
    "budget": "self-triggered: a new expert every floor(N_train / num_experts) stream samples",
}


def schedule_refusal(method_class: type, schedule: str) -> str:
    """Why ``method_class`` cannot run under ``schedule`` ("" when it can)."""
    if schedule not in EXPERT_SCHEDULES:
        return f"expert_schedule must be one of {', '.join(EXPERT_SCHEDULES)}, got {schedule!r}"
    if schedule == "budget" and method_class.session_aware:
        return (f"{method_class.name} starts its experts at session starts and ends them at session ends; "
                "only the task-free methods take a sample budget")
    return ""


def build_schedule(model: Any, schedule: str, stream_length: int) -> Union[SessionSchedule, SampleBudgetSchedule]:
    """The schedule of ``model``'s experts for a stream of ``stream_length`` samples; ``ValueError`` for one
    :func:`schedule_refusal` refuses."""
    refusal = schedule_refusal(type(model), schedule)
    if refusal:
        raise ValueError(refusal)
    by_session = schedule == "session" or (schedule == "method" and type(model).session_aware)
    if by_session:
        return SessionSchedule(model.num_experts)
    return SampleBudgetSchedule.from_stream_size(stream_length, model.num_experts)
