"""``Retrofit.state_dict()`` / ``load_state_dict()``: a retrofitted upstream-style model resumed mid-stream
gives bit-identical results to an uninterrupted run; checkpoints load with ``weights_only=True``."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from torch import Tensor

pytest.importorskip("timm")
from fold_log import FoldLog  # noqa: E402
from upstream_cases import CASES, adapt, batch, trainable  # noqa: E402

from fly_modules import InvalidParameterError, SampleBudgetSchedule, SessionSchedule, _compat  # noqa: E402

BATCHES, ITERATIONS = 6, 2


def _flat(tree: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(tree, dict):
        out: Dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix: tree}


def _build(name: str):
    case = CASES[name]
    model, original = case.build()
    optimizer = torch.optim.Adam(trainable(model), lr=1e-2)
    schedule = SessionSchedule(2) if case.schedule == "session" else SampleBudgetSchedule(16, 2)
    handle = adapt(case, model, original, optimizer=optimizer, schedule=schedule)
    return case, model, original, optimizer, handle


def _train(case, model, original, optimizer, handle, batches: range, first_iteration: int = 0) -> None:
    for step in batches:
        if case.schedule == "session":
            handle.start_session(step // 3)
        x, y = batch(seed=step, shift=0.5 * (step // 3))
        model.train()
        for _ in range(first_iteration, ITERATIONS):
            logits, _ = case.forward(model, original, x, task=handle.current_expert)
            loss = case.train_loss(model, logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        first_iteration = 0
        handle.end_batch()


def _result(case, model, original, handle) -> List[Tensor]:
    model.eval()
    logits, selection = case.forward(model, original, batch(seed=99)[0])
    return [logits, selection.float(), *(v for v in _flat(handle.state_dict()).values() if isinstance(v, Tensor))]


@pytest.mark.parametrize("name", ["flygcl-dualprompt", "misa-patched-gather", "norga", "jhlee-l2p", "siblurry-mvp",
                                  "flygcl-hide-lora"])
@pytest.mark.parametrize("mid_batch", [False, True])
def test_resume_mid_stream_is_bit_identical(name, mid_batch, tmp_path, monkeypatch):
    folds = FoldLog(monkeypatch)
    case, model, original, optimizer, handle = _build(name)
    _train(case, model, original, optimizer, handle, range(BATCHES))
    expected = _result(case, model, original, handle)
    uninterrupted = folds.take()

    case, model, original, optimizer, handle = _build(name)
    stop = BATCHES // 2
    _train(case, model, original, optimizer, handle, range(stop))
    if mid_batch:  # interrupted after the first online iteration of a batch
        if case.schedule == "session":
            handle.start_session(stop // 3)
        x, y = batch(seed=stop, shift=0.5 * (stop // 3))
        model.train()
        logits, _ = case.forward(model, original, x, task=handle.current_expert)
        loss = case.train_loss(model, logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "retrofit": handle.state_dict()}, path)

    case, model, original, optimizer, handle = _build(name)  # a new process would build everything again
    checkpoint = _compat.load_weights(path)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    handle.load_state_dict(checkpoint["retrofit"])
    if mid_batch:
        _train(case, model, original, optimizer, handle, range(stop, stop + 1), first_iteration=1)
        stop += 1
    _train(case, model, original, optimizer, handle, range(stop, BATCHES))
    got = _result(case, model, original, handle)
    # the router's rows were added in the same updates (a save is no fold boundary): the same summation
    # history, so the same bits on any CPU
    assert folds.take() == uninterrupted
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert handle.current_expert == 1 and handle.router.num_samples == 8 * BATCHES


def test_load_state_dict_refuses_a_mismatch_before_changing_anything():
    case, model, original, optimizer, handle = _build("flygcl-dualprompt")
    _train(case, model, original, optimizer, handle, range(2))
    state = handle.state_dict()
    other = _build("jhlee-l2p")[-1]
    with pytest.raises(InvalidParameterError, match="family 'dualprompt', this is 'l2p'"):
        other.load_state_dict(state)
    _, _, _, _, fresh = _build("flygcl-dualprompt")
    before = fresh.router.gram.clone()
    with pytest.raises(InvalidParameterError, match="lacks `schedule`"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "schedule"})
    with pytest.raises(InvalidParameterError, match="current_expert"):
        fresh.load_state_dict({**state, "current_expert": 7})
    with pytest.raises(InvalidParameterError, match="format"):
        fresh.load_state_dict({"router": {}})
    assert torch.equal(fresh.router.gram, before) and fresh.current_expert == 0
