"""When a new expert starts: at session boundaries, or every ``w`` stream samples (task-free).

Schedules are plain objects with a ``state_dict`` so that a resumed run starts experts at the same
stream positions. They return the experts that start; the caller starts them (prompt
initialisation, ``TemporalEnsembleHead.start_expert``, ``AnalyticRouter.add_expert``).
"""

from __future__ import annotations

from typing import Dict, List

from ._validation import check_int

__all__ = ["SampleBudgetSchedule", "SessionSchedule"]


class SampleBudgetSchedule:
    """Task-free schedule: a new expert every ``samples_per_expert`` stream samples.

    The rule of the reference code (FlyGCL's self-triggered steps): after each stream batch the batch
    size is added to a counter; while the current expert is not the last and the counter has reached
    the budget, the budget is subtracted and the next expert starts. The batch that crosses the
    threshold was already trained under the old expert.

    Args:
        samples_per_expert: the budget ``w`` (the reference uses ``floor(N_train / num_experts)``).
        num_experts: total number of experts; the last one trains until the stream ends.

    Examples::

        >>> schedule = SampleBudgetSchedule(100, num_experts=3)
        >>> [schedule.step(64) for _ in range(4)]
        [[], [1], [], [2]]
    """

    def __init__(self, samples_per_expert: int, num_experts: int) -> None:
        caller = "SampleBudgetSchedule"
        self.samples_per_expert = check_int(samples_per_expert, "samples_per_expert", caller=caller, minimum=1)
        self.num_experts = check_int(num_experts, "num_experts", caller=caller, minimum=1)
        self.current = 0
        self.counter = 0

    @classmethod
    def from_stream_size(cls, num_train_samples: int, num_experts: int) -> "SampleBudgetSchedule":
        """The reference budget ``floor(num_train_samples / num_experts)`` (at least 1)."""
        return cls(max(1, num_train_samples // num_experts), num_experts)

    def step(self, batch_size: int) -> List[int]:
        """Count a finished stream batch; returns the experts that start now (usually none)."""
        self.counter += check_int(batch_size, "batch_size", caller="SampleBudgetSchedule.step", minimum=0)
        started = []
        while self.current < self.num_experts - 1 and self.counter >= self.samples_per_expert:
            self.counter -= self.samples_per_expert
            self.current += 1
            started.append(self.current)
        return started

    def state_dict(self) -> Dict[str, int]:
        return {"current": self.current, "counter": self.counter}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.current, self.counter = int(state["current"]), int(state["counter"])

    def __repr__(self) -> str:
        return f"SampleBudgetSchedule(samples_per_expert={self.samples_per_expert}, num_experts={self.num_experts})"


class SessionSchedule:
    """One expert per benchmark session (uses ground-truth session boundaries).

    Args:
        num_experts: total number of experts; sessions beyond it keep training the last expert.
    """

    def __init__(self, num_experts: int) -> None:
        self.num_experts = check_int(num_experts, "num_experts", caller="SessionSchedule", minimum=1)
        self.current = 0

    def on_session_start(self, session: int) -> List[int]:
        """Called when ``session`` (0-based) starts; returns the experts that start now."""
        session = check_int(session, "session", caller="SessionSchedule.on_session_start", minimum=0)
        target = min(session, self.num_experts - 1)
        started = list(range(self.current + 1, target + 1))
        self.current = max(self.current, target)
        return started

    def state_dict(self) -> Dict[str, int]:
        return {"current": self.current}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.current = int(state["current"])

    def __repr__(self) -> str:
        return f"SessionSchedule(num_experts={self.num_experts})"
