"""``handle.verify`` leaves everything exactly as it found it, at any point of a run: the router (its pending
rows too), the ensemble, the model, its gradients, the user's optimizer and every global random number
generator, even when the method's expert start draws random numbers (CODA-P's Gram-Schmidt does)."""

from __future__ import annotations

import copy
import random
from typing import Any, Dict

import numpy
import pytest
import torch
from torch import Tensor

pytest.importorskip("timm")
from fly_modules.adapters import UnrestorableStateError  # noqa: E402
from test_adapters_verify import _flat  # noqa: E402
from upstream_cases import CASES, adapt, batch, trainable  # noqa: E402

from fly_modules import InvalidParameterError  # noqa: E402

CASE = CASES["generic"]


def _build():
    model, original = CASE.build()

    def start_expert(expert: int) -> None:  # a method whose expert start draws from every generator
        with torch.no_grad():
            prompt = model.e_prompt.prompt
            prompt[:, expert].add_(1e-3 * torch.randn_like(prompt[:, expert]))
        numpy.random.rand()
        random.random()

    optimizer = torch.optim.Adam(trainable(model), lr=1e-3)
    handle = adapt(CASE, model, original, optimizer=optimizer, start_expert=start_expert)
    return model, original, optimizer, handle


def _step(model, original, optimizer, handle, seed: int) -> None:
    x, y = batch(seed=seed)
    model.train()
    logits, _ = CASE.forward(model, original, x, task=handle.current_expert)
    optimizer.zero_grad()
    CASE.train_loss(model, logits, y % logits.shape[-1]).backward()
    optimizer.step()
    handle.end_batch()


def _router(router) -> Dict[str, Any]:
    """The router's raw state, read without folding its pending rows, then a folded copy's statistics."""
    raw = {name: t.clone() for name, t in router.named_buffers()}
    raw["pending_rows"] = router.pending_rows
    folded = copy.deepcopy(router)
    folded.flush()
    raw.update({f"folded.{name}": t.clone() for name, t in folded.named_buffers()})
    return raw


def _everything(model, optimizer, handle) -> Dict[str, Any]:
    state = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
        "optimizer": {k: (v.clone() if isinstance(v, Tensor) else v) for k, v in _flat(optimizer.state_dict())},
        "router": _router(handle.router),
        "ensemble": {k: (v.clone() if isinstance(v, Tensor) else copy.deepcopy(v))
                     for k, v in _flat(handle.ensemble.state_dict())},
        "current_expert": handle.current_expert,
        "torch": torch.random.get_rng_state(),
        "numpy": numpy.random.get_state()[1].copy(),
        "python": random.getstate(),
    }
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _assert_same(before: Dict[str, Any], after: Dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for part in before:
        left, right = before[part], after[part]
        pairs = left.items() if isinstance(left, dict) else [(part, left)]
        if isinstance(left, dict):
            assert left.keys() == right.keys(), part
        for name, value in pairs:
            other = right[name] if isinstance(left, dict) else right
            if isinstance(value, Tensor) or isinstance(other, Tensor):
                assert torch.equal(value, other), (part, name)
            elif isinstance(value, numpy.ndarray):
                assert numpy.array_equal(value, other), (part, name)
            elif isinstance(value, list) and value and isinstance(value[0], Tensor):
                assert all(torch.equal(a, b) for a, b in zip(value, other)), (part, name)
            else:
                assert value == other, (part, name)


def _verify_changes_nothing(model, original, optimizer, handle) -> None:
    before = _everything(model, optimizer, handle)
    report = handle.verify(batch(seed=9)[0], forward=lambda x: CASE.forward(model, original, x,
                                                                           task=handle.current_expert)[0])
    assert report.ok, str(report)
    _assert_same(before, _everything(model, optimizer, handle))


def test_verify_leaves_router_ensemble_model_optimizer_and_every_generator_at_each_point():
    model, original, optimizer, handle = _build()
    for seed in range(2):
        _step(model, original, optimizer, handle, seed)
    assert handle.router.pending_rows > 0  # rows not folded into G and Q yet
    _verify_changes_nothing(model, original, optimizer, handle)
    handle.router.flush()  # after a fold
    _verify_changes_nothing(model, original, optimizer, handle)
    handle.start_expert(1)  # mid-session: a second expert, rows pending again, gradients held
    _step(model, original, optimizer, handle, 3)
    assert handle.router.pending_rows > 0
    _verify_changes_nothing(model, original, optimizer, handle)


def test_verify_keeps_the_routing_the_run_learnt():
    model, original, optimizer, handle = _build()
    for expert in range(2):
        handle.start_expert(expert)
        _step(model, original, optimizer, handle, expert)
    features = torch.randn(16, handle.router.in_features, generator=torch.Generator().manual_seed(1))
    expected = copy.deepcopy(handle.router).route(features)
    handle.verify(batch(seed=9)[0], forward=lambda x: CASE.forward(model, original, x, task=handle.current_expert)[0])
    assert torch.equal(handle.router.route(features), expected)
    assert handle.router.num_samples == 16 and bool(handle.router.gram.abs().sum() > 0)


def test_verify_refuses_state_it_cannot_put_back():
    model, original, optimizer, handle = _build()
    with torch.inference_mode():
        model.register_buffer("made_in_inference", torch.zeros(3))
    with pytest.raises(UnrestorableStateError, match="cannot put back .*made_in_inference"):
        handle.verify(batch(seed=9)[0])


def test_a_loops_pair_is_refused_in_one_line_saying_what_to_pass():
    model, original, optimizer, handle = _build()
    x, y = batch(seed=9)
    before = _everything(model, optimizer, handle)
    with pytest.raises(InvalidParameterError, match=r"got a tuple of 2; .* handle.verify\(x, targets=y\)") as error:
        handle.verify((x, y))
    assert "\n" not in str(error.value)
    _assert_same(before, _everything(model, optimizer, handle))
    forward = lambda pair: CASE.forward(model, original, pair[0], task=handle.current_expert)[0]  # noqa: E731
    assert handle.verify((x, y), forward=forward).ok
