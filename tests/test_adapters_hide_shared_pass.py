"""FlyGCL's HiDe-LoRA / HiDe-Adapter (``hide`` family, stand-ins of ``flygcl_standins``): the router's
features and the model's gate share one frozen ``backbone.forward_features`` pass. Counted per stream
batch and per routed inference call against the un-retrofitted model, and compared with an explicit
separate frozen pass: same router statistics, routes, predictions and gate outputs."""

from __future__ import annotations

import copy
from typing import Any, List, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

pytest.importorskip("timm")
from fly_modules.adapters import retrofit  # noqa: E402
from flygcl_standins import FlyGCLExpertModel  # noqa: E402
from upstream_cases import ROUTER, batch, trainable  # noqa: E402
from upstream_standins import TASK_OF_CLASS  # noqa: E402

from fly_modules import SessionSchedule  # noqa: E402

ONLINE_ITER = 2  # the trainer's online iterations per stream batch


class CountedPasses:
    """Counts the frozen passes of a backbone: the calls of its ``forward_features`` (the expert modules run
    the blocks themselves). Installed as the instance attribute before the retrofit, which wraps it."""

    def __init__(self, backbone: nn.Module) -> None:
        self.calls = 0
        self.inner = backbone.forward_features
        backbone.forward_features = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner(*args, **kwargs)


class Run:
    """A stand-in trained and evaluated FlyGCL's way (``online_train``: the prompt branch, then the gate, one
    optimizer step; ``online_evaluate``: the gate's task, then the prompt branch), its passes counted."""

    def __init__(self, adapter: bool, retrofitted: bool, ensemble: bool = False) -> None:
        self.model = FlyGCLExpertModel(adapter)
        self.frozen = copy.deepcopy(self.model.backbone)  # for the explicit separate frozen pass
        self.passes = CountedPasses(self.model.backbone)
        self.optimizer = torch.optim.SGD(trainable(self.model), lr=0.1)
        self.handle = retrofit(self.model, "hide", ensemble=ensemble, optimizer=self.optimizer,
                               schedule=SessionSchedule(2), **ROUTER) if retrofitted else None

    def online_train(self, x: Tensor, y: Tensor, task: int) -> Tuple[Tensor, ...]:
        self.model.train()
        x = x.clone()  # the trainer's augmented copy: a new tensor every online iteration
        logits, _ = self.model.forward_prompt(x, task_id=task)
        gate_logits, h = self.model.forward_gate(x, detach_backbone=True)
        loss = F.cross_entropy(logits, y) + F.cross_entropy(gate_logits, y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return logits.detach(), gate_logits.detach(), h.detach()

    @torch.no_grad()
    def evaluate(self, x: Tensor, task: Any = None) -> Tuple[Tensor, Tensor]:
        self.model.eval()
        gate_logits, _ = self.model.forward_gate(x)
        task_hat = TASK_OF_CLASS[gate_logits.argmax(dim=1)] if task is None else task
        return self.model.forward_prompt(x, task_id=task_hat)[0], gate_logits

    @torch.no_grad()
    def class_token(self, x: Tensor) -> Tensor:
        """The explicit separate frozen pass: the router features as the retrofit computed them alone."""
        return self.frozen.forward_features(x)[:, 0]


def stream(session: int) -> Tuple[Tensor, Tensor]:
    x, y = batch(seed=10 + session, n=6, shift=3.0 * session)
    return x, y % 3 + 2 * session


@pytest.mark.parametrize("adapter", [False, True])
def test_one_frozen_pass_per_online_iteration_and_per_routed_call(adapter):
    runs = [Run(adapter, retrofitted=False), Run(adapter, retrofitted=True, ensemble=True)]
    plain, ours = runs
    for session in range(2):
        ours.handle.start_session(session)
        x, y = stream(session)
        for run in runs:
            before = run.passes.calls
            for _ in range(ONLINE_ITER):
                run.online_train(x, y, session)
            assert run.passes.calls - before == ONLINE_ITER  # the gate's pass of each iteration, and no other
        ours.handle.end_batch()
    assert ours.handle.routing_active()
    x = torch.cat([stream(0)[0][:3], stream(1)[0][:3]])
    for run in runs:
        before = run.passes.calls
        run.evaluate(x)
        assert run.passes.calls - before == 1
    assert ours.handle.record.routed is not None
    before = ours.passes.calls
    with torch.no_grad():  # a loop that does not run the gate first: the router's own pass
        ours.model.forward_prompt(x, task_id=0)
    assert ours.passes.calls - before == 1
    ours.handle.remove()
    assert ours.model.backbone.forward_features is ours.passes and ours.handle.install.leftovers() == []


@pytest.mark.parametrize("adapter", [False, True])
def test_statistics_routes_and_predictions_match_a_separate_frozen_pass(adapter):
    plain, ours = Run(adapter, retrofitted=False), Run(adapter, retrofitted=True)
    for session in range(2):
        ours.handle.start_session(session)
        x, y = stream(session)
        for _ in range(ONLINE_ITER):
            got, want = ours.online_train(x, y, session), plain.online_train(x, y, session)
            assert all(torch.equal(a, b) for a, b in zip(got, want))  # the gate's outputs too
        assert torch.equal(ours.handle.record.query, ours.class_token(x))
        ours.handle.end_batch()
    x = torch.cat([stream(0)[0][:3], stream(1)[0][:3]])
    expected = ours.handle.router.route(ours.class_token(x))
    assert sorted(set(expected.tolist())) == [0, 1]  # the check below sees both experts
    logits, gate_logits = ours.evaluate(x)
    routed: List[int] = ours.model.experts.last_expert_ids.tolist()
    assert routed == expected.tolist() == ours.handle.record.routed.tolist()
    want_logits, want_gate = plain.evaluate(x, task=expected)
    assert torch.equal(logits, want_logits) and torch.equal(gate_logits, want_gate)


def routed_passes(run: Run, x: Tensor) -> int:
    """The frozen passes of one routed ``forward_prompt`` call, whose routes are checked against the
    explicit separate pass."""
    before = run.passes.calls
    run.model.forward_prompt(x, task_id=0)
    routes = run.handle.router.route(run.class_token(x))
    assert run.model.experts.last_expert_ids.tolist() == routes.tolist()
    return run.passes.calls - before


@pytest.mark.parametrize("adapter", [False, True])
def test_a_pass_is_shared_only_for_the_same_unchanged_input_without_a_graph(adapter):
    ours = Run(adapter, retrofitted=True)
    for session in range(2):
        ours.handle.start_session(session)
        ours.online_train(*stream(session), session)
        ours.handle.end_batch()
    x = torch.cat([stream(0)[0][:3], stream(1)[0][:3]])
    model = ours.model
    model.eval()
    with torch.no_grad():
        model.forward_gate(x)
        assert routed_passes(ours, x.clone()) == 1  # another tensor, the same values: the router's own pass
        probe = x.clone()
        model.forward_gate(probe)
        probe.mul_(-1.0)
        assert routed_passes(ours, probe) == 1  # the gate's input changed in place since
        model.forward_gate(x)
        model.backbone.norm.weight.mul_(1.0)
        assert routed_passes(ours, x) == 1  # the backbone's weights written since
        model.forward_gate(x)
        assert routed_passes(ours, x) == 0  # the gate's very pass
    model.train()
    x, _ = stream(1)
    before = ours.passes.calls
    model.forward_gate(x)  # a loop that runs the gate first: its pass gives the stream batch's query
    model.forward_prompt(x, task_id=1)
    assert ours.passes.calls - before == 1 and torch.equal(ours.handle.record.query, ours.class_token(x))
    ours.handle.end_batch()
    model.backbone.requires_grad_(True)  # the gate's pass would record a graph: it runs its own
    before = ours.passes.calls
    ours.online_train(*stream(1), 1)
    assert ours.passes.calls - before == 2
