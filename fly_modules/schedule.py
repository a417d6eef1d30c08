"""When a new expert starts: at session boundaries, or every ``w`` stream samples (task-free).

Schedules are plain objects with a ``state_dict`` so that a resumed run starts experts at the same
stream positions. They return the experts that start; the caller starts them (prompt
initialisation, ``TemporalEnsembleHead.start_expert``, ``AnalyticRouter.add_expert``).
"""

from __future__ import annotations

from typing import Dict, List

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
    """

    def __init__(self, samples_per_expert: int, num_experts: int) -> None:
        for name, value in (("samples_per_expert", samples_per_expert), ("num_experts", num_experts)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SampleBudgetSchedule: {name} must be an int >= 1, got {value!r}")
        self.samples_per_expert = samples_per_expert
        self.num_experts = num_experts
        self.current = 0
        self.counter = 0

    @classmethod
    def from_stream_size(cls, num_train_samples: int, num_experts: int) -> "SampleBudgetSchedule":
        """The reference budget ``floor(num_train_samples / num_experts)`` (at least 1)."""
        return cls(max(1, num_train_samples // num_experts), num_experts)

    def step(self, batch_size: int) -> List[int]:
        """Count a finished stream batch; returns the experts that start now (usually none)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"SampleBudgetSchedule.step: batch_size must be an int >= 0, got {batch_size!r}")
        self.counter += batch_size
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
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(f"SessionSchedule: num_experts must be an int >= 1, got {num_experts!r}")
        self.num_experts = num_experts
        self.current = 0

    def on_session_start(self, session: int) -> List[int]:
        """Called when ``session`` (0-based) starts; returns the experts that start now."""
        if isinstance(session, bool) or not isinstance(session, int) or session < 0:
            raise ValueError(f"SessionSchedule.on_session_start: session must be an int >= 0, got {session!r}")
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
