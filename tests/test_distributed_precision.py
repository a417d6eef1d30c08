"""Mixed precision and compilation around a retrofit, as the distributed launches of the codebases run them
(FlyGCL's trainers: ``autocast`` with a ``GradScaler``): CPU bfloat16 autocast here."""

from __future__ import annotations

import warnings
from typing import List, Tuple

import pytest
import torch
from torch import Tensor

pytest.importorskip("timm")
from upstream_cases import CASES, adapt, batch, trainable  # noqa: E402

from fly_modules import AnalyticRouter, SampleBudgetSchedule  # noqa: E402

#: bfloat16's unit roundoff; a tiny ViT's logits stay within a few of them relative to their scale
BF16_EPS = 2.0 ** -8
ROUNDINGS = 8


def _autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def _trained(name: str, amp: bool, batches: int = 4):
    case = CASES[name]
    model, original = case.build()
    optimizer = torch.optim.Adam(trainable(model), lr=1e-2)
    handle = adapt(case, model, original, optimizer=optimizer, schedule=SampleBudgetSchedule(24, 2))
    starts: List[List[int]] = []
    for step in range(batches):
        x, y = batch(seed=step, n=8, shift=0.5 * step)
        model.train()
        with _autocast(amp):
            logits, _ = case.forward(model, original, x, task=handle.current_expert)
            loss = case.train_loss(model, logits.float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        starts.append(handle.end_batch())
    return case, model, original, handle, starts


def _evaluate(case, model, original, handle, x: Tensor, amp: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """``(logits, experts routed, router scores)`` of ``x`` with autocast on or off."""
    model.eval()
    with torch.no_grad(), _autocast(amp):
        logits, selection = case.forward(model, original, x, task=handle.current_expert)
        scores = handle.router(case.router_features(model, original, x))
    return logits.float(), case.expert_of(selection), scores


@pytest.mark.parametrize("name", ["jhlee-l2p", "flygcl-dualprompt"])
def test_autocast_routes_and_predicts_as_full_precision_within_rounding(name):
    """Trained in full precision, evaluated with and without autocast: the routes are the router's float64 scores'
    argmax either way, those scores move by less than half the router's margin for most samples, and the samples
    routed alike get logits within a few bfloat16 roundings of their scale."""
    case, model, original, handle, _ = _trained(name, amp=False)
    x = batch(seed=99, n=32)[0]
    logits, experts, scores = _evaluate(case, model, original, handle, x, amp=False)
    low_logits, low_experts, low_scores = _evaluate(case, model, original, handle, x, amp=True)
    assert scores.dtype == low_scores.dtype == torch.float64  # the router scores in its statistics' dtype
    assert torch.equal(experts, scores.argmax(1)) and torch.equal(low_experts, low_scores.argmax(1))
    # The routes follow the scores (asserted above); the scores move by less than half the router's margin for
    # most samples, so those cannot change route, whatever the others do.
    top2 = scores.topk(2, dim=1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * (low_scores - scores).abs().amax(1)
    assert clear.float().mean() >= 0.75
    same = experts == low_experts
    bound = ROUNDINGS * BF16_EPS * float(logits[same].abs().max())
    assert float((low_logits[same] - logits[same]).abs().max()) <= bound


def test_autocast_training_keeps_float64_statistics_and_the_schedule():
    """Trained under autocast: the router's statistics and solution stay float64, every query reaches it, the
    schedule starts experts at the same batches, and its statistics are those of full precision within the
    bfloat16 rounding of the features."""
    *_, full, full_starts = _trained("flygcl-dualprompt", amp=False)
    *_, low, low_starts = _trained("flygcl-dualprompt", amp=True)
    router = low.router
    assert router.gram.dtype == router.cross.dtype == router.weight.dtype == torch.float64
    assert router.num_samples == full.router.num_samples == 32 and low_starts == full_starts == [[], [], [1], []]
    full.router.flush()
    router.flush()
    relative = float((router.gram - full.router.gram).norm() / full.router.gram.norm())
    assert 0 < relative <= ROUNDINGS * BF16_EPS


def test_the_router_expands_in_float32_under_autocast():
    """Autocast would run the router's float32 expansion in bfloat16: it is switched off inside, so the same
    features give the same statistics and scores with autocast on (the same computation, bit for bit)."""
    features = torch.randn(40, 16, generator=torch.Generator().manual_seed(0)).bfloat16().float()
    routers = [AnalyticRouter(16, 2, expansion_dim=64, ridge=1.0, seed=3) for _ in range(2)]
    scores = []
    for router, amp in zip(routers, (False, True)):
        with _autocast(amp):
            router.update(features, (torch.arange(40) % 2))
            scores.append(router(features))
    for name in ("gram", "cross"):
        assert torch.equal(getattr(routers[0], name), getattr(routers[1], name)), name
    assert torch.equal(scores[0], scores[1])


def _scaled_step(case, model, original, handle, optimizer, scaler, x, y, plant_inf: bool) -> None:
    model.train()
    with _autocast(True):
        logits, _ = case.forward(model, original, x, task=handle.current_expert)
        loss = case.train_loss(model, logits.float(), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    if plant_inf:
        next(p for p in trainable(model) if p.grad is not None).grad.view(-1)[0] = float("inf")
    scaler.step(optimizer)
    scaler.update()


def test_a_step_gradscaler_skips_leaves_the_ema_copies_untouched():
    """The EMA follows the optimizer's step hook: a step GradScaler skips (an inf gradient) never calls
    ``optimizer.step()``, so neither the weights nor their EMA copies move, and ``end_batch`` does not mistake
    it for a missing optimizer (the copies moved before)."""
    scaler_type = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_type is None:
        pytest.skip("this torch has no device-generic torch.amp.GradScaler (CPU)")
    case = CASES["flygcl-dualprompt"]
    model, original = case.build()
    optimizer = torch.optim.Adam(trainable(model), lr=1e-2)
    handle = adapt(case, model, original, optimizer=optimizer, schedule=SampleBudgetSchedule(24, 2))
    scaler = scaler_type("cpu", init_scale=2.0 ** 8)
    x, y = batch(seed=0, n=8)
    _scaled_step(case, model, original, handle, optimizer, scaler, x, y, plant_inf=False)
    handle.end_batch()
    assert int(handle.ensemble.num_updates.sum()) == 1
    before = [t.clone() for t in (handle.ensemble.ema_weight, handle.ensemble.num_updates, *trainable(model))]
    scale = scaler.get_scale()
    _scaled_step(case, model, original, handle, optimizer, scaler, *batch(seed=1, n=8), plant_inf=True)
    assert scaler.get_scale() == scale / 2  # GradScaler did skip the step
    after = (handle.ensemble.ema_weight, handle.ensemble.num_updates, *trainable(model))
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "EMA copies did not move" warning for a skipped step
        handle.end_batch()


@pytest.mark.slow  # about 40 s on one CPU thread: the graph capture of a ViT, twice (training and eval)
def test_torch_compile_of_a_retrofitted_model_trains_and_infers_as_the_model():
    """``torch.compile`` (the graph capture; the eager backend, no C++ toolchain needed) runs the retrofit's hooks:
    its training forwards feed the router, its inference equals the uncompiled model's."""
    compile_model = getattr(torch, "compile", None)
    if compile_model is None:
        pytest.skip("torch.compile needs torch >= 2")
    case, model, original, handle, _ = _trained("flygcl-dualprompt", amp=False, batches=3)
    compiled = compile_model(model, backend="eager")
    x, y = batch(seed=7, n=8)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph breaks at the hooks' host reads are reported as warnings
        case.train_loss(model, compiled(x), y).backward()
        assert handle.record.query is not None and handle.record.query.shape[0] == 8
        handle.end_batch()
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
    assert handle.router.num_samples == 32
