"""Logit masks and expert-start schedules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fly_modules import (
    InvalidParameterError,
    SampleBudgetSchedule,
    SessionSchedule,
    batch_seen_class_mask,
    class_mask,
    seen_class_mask,
)

INF = float("-inf")


def test_masks():
    assert batch_seen_class_mask(torch.tensor([3, 1, 3]), 5).tolist() == [INF, 0, INF, 0, INF]
    assert seen_class_mask(2, 4).tolist() == [0, 0, INF, INF]
    assert seen_class_mask(0, 2).tolist() == [INF, INF]
    assert class_mask(torch.tensor([0]), 2, dtype=torch.float64).dtype == torch.float64
    for dtype in (torch.uint8, torch.int16, torch.int32):  # uint8 must not be read as a boolean mask
        assert batch_seen_class_mask(torch.tensor([3, 1, 3], dtype=dtype), 5).tolist() == [INF, 0, INF, 0, INF]
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        batch_seen_class_mask(torch.tensor([5]), 5)
    with pytest.raises(TypeError, match="integer tensor"):
        batch_seen_class_mask(torch.tensor([1.0]), 5)
    with pytest.raises(ValueError, match="num_seen"):
        seen_class_mask(6, 5)


def test_sample_budget_schedule_follows_the_reference_counter():
    schedule = SampleBudgetSchedule(100, 3)
    started = [schedule.step(64) for _ in range(6)]
    # counter: 64, 128 -> start 1 (28 left), 92, 156 -> start 2 (56), then the last expert keeps training
    assert started == [[], [1], [], [2], [], []]
    assert schedule.current == 2
    jump = SampleBudgetSchedule(10, 5)
    assert jump.step(35) == [1, 2, 3]  # several budgets crossed by one batch
    restored = SampleBudgetSchedule(10, 5)
    restored.load_state_dict(jump.state_dict())
    assert restored.step(5) == jump.step(5) == [4]
    assert SampleBudgetSchedule.from_stream_size(50_000, 5).samples_per_expert == 10_000
    with pytest.raises(ValueError, match="samples_per_expert"):
        SampleBudgetSchedule(0, 2)


def test_session_schedule():
    schedule = SessionSchedule(3)
    assert schedule.on_session_start(0) == []
    assert schedule.on_session_start(2) == [1, 2]  # an empty session in between still starts its expert
    assert schedule.on_session_start(4) == []
    assert schedule.current == 2
    with pytest.raises(ValueError, match="session"):
        schedule.on_session_start(-1)


@pytest.mark.parametrize(
    "call",
    [
        lambda: SampleBudgetSchedule(True, 2),
        lambda: SampleBudgetSchedule(10, 2).step(-1),
        lambda: SampleBudgetSchedule(10, 2).step(2.0),
        lambda: SessionSchedule(0),
        lambda: SessionSchedule(2).on_session_start("1"),
        lambda: class_mask([0, 1], 3),
        lambda: class_mask(torch.tensor([3]), 3),
        lambda: class_mask(torch.tensor([0]), -1),
        lambda: seen_class_mask(True, 3),
    ],
)
def test_every_parameter_error_is_an_invalid_parameter_error(call):
    with pytest.raises(InvalidParameterError):
        call()


def test_integer_parameters_accept_numpy_integers():
    schedule = SampleBudgetSchedule(np.int64(10), np.int32(3))
    assert schedule.step(np.int64(10)) == [1]
    assert SessionSchedule(np.int64(3)).on_session_start(np.int16(1)) == [1]
    assert seen_class_mask(np.int64(1), np.int64(2)).tolist() == [0, INF]
