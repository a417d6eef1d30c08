"""The runner: one training scores every variant exactly as its own run would; the loop's hook order."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("timm")

from benchmarks.ablation.evaluation import VariantEvaluator  # noqa: E402
from benchmarks.ablation.runner import run_reference, run_training  # noqa: E402
from benchmarks.core.metrics import AnytimeEvalTrigger  # noqa: E402
from benchmarks.core.protocol import Protocol, RunSpec  # noqa: E402
from benchmarks.core.stream_draw import build_si_blurry_stream  # noqa: E402
from benchmarks.core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS, variants_for  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.methods import method_class  # noqa: E402
from fly_modules import AnalyticRouter, SampleBudgetSchedule, SessionSchedule, TemporalEnsembleHead  # noqa: E402

CPU = torch.device("cpu")
PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2),
    pretrained=False, image_size=32, batch_size=12, online_iter=2, eval_period=30, test_batch_size=16,
    num_experts=3, expansion_dim=64, ridge=1e2, amp=False, router_query="clean",
    method_kwargs={"l2p": {"pool_size": 6, "top_k": 2}, "hide": {"ca_steps": 10, "ca_samples_per_class": 8}},
)


@pytest.fixture(scope="module")
def data():
    return make_synthetic_train_test(6, train_per_class=12, test_per_class=4, seed=0, image_size=32)


def records(log):
    return json.dumps({"meta": log["meta"], "records": log["records"]})


def test_every_variant_of_one_training_equals_its_own_run(data):
    """Neither the router nor the ensemble changes training: each variant scored on the shared training
    has the evaluation log, bit for bit, of a run through the reference adapter (ablation variants) or
    of a training that scores that variant alone (oracle variants)."""
    differing = 0
    for method in ("l2p", "dualprompt", "mvp", "hide", "flyprompt"):
        variants = variants_for(method_class(method), [*ABLATION_VARIANTS, *ORACLE_VARIANTS])
        together = run_training(method, "synthetic", 1, variants, PROTOCOL, *data, device=CPU)
        assert list(together) == variants
        for variant in variants:
            if variant in ORACLE_VARIANTS:
                alone = run_training(method, "synthetic", 1, [variant], PROTOCOL, *data, device=CPU)[variant]
            else:
                alone = run_reference(RunSpec(method, variant, "synthetic", 1), PROTOCOL, *data, device=CPU)
            assert records(together[variant]["log"]) == records(alone["log"]), (method, variant)
            assert together[variant]["metrics"] == pytest.approx(alone["metrics"], nan_ok=True)
        differing += len({json.dumps(together[v]["log"]["records"]) for v in variants}) > 1
    assert differing >= 2  # the variants really score different predictions


def test_variant_names_are_checked_before_any_work(data):
    with pytest.raises(ValueError, match="'flyprompt' runs the variants \\['full'\\]"):
        run_training("flyprompt", "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU)
    with pytest.raises(ValueError, match="unknown variants \\['bogus'\\]"):
        run_training("l2p", "synthetic", 1, ["bogus"], PROTOCOL, *data, device=CPU)
    with pytest.raises(ValueError, match="ablation variants"):
        run_reference(RunSpec("l2p", "oracle", "synthetic", 1), PROTOCOL, *data, device=CPU)


def _spy(monkeypatch, calls, target, name, label=None, when=None):
    original = getattr(target, name)

    def wrapper(self, *args, **kwargs):
        if when is None or when(self, *args, **kwargs):
            calls.append(label(self, *args, **kwargs) if callable(label) else (label or name))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(target, name, wrapper)


@pytest.mark.parametrize("method", ["hide", "dualprompt"])  # session-aware and sample-budget schedules
def test_hooks_run_in_the_documented_order(method, data, monkeypatch):
    """The order ``benchmarks.ablation.training`` documents, call by call (dropping a hook, such as HiDe's
    session-end classifier alignment, fails this test)."""
    cls = method_class(method)
    calls = []
    for hook in ("on_expert_start", "on_optimizer_step", "on_batch_end", "on_evaluate", "on_session_end", "loss"):
        _spy(monkeypatch, calls, cls, hook)
    _spy(monkeypatch, calls, cls, "forward", when=lambda self, *a, **k: self.training)
    _spy(monkeypatch, calls, torch.optim.Adam, "step")
    _spy(monkeypatch, calls, TemporalEnsembleHead, "update", "ema")
    _spy(monkeypatch, calls, AnalyticRouter, "update", "router")
    _spy(monkeypatch, calls, VariantEvaluator, "__call__", lambda self, kind, **k: f"evaluate {kind}")
    run_training(method, "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU)

    train = data[0]
    stream = build_si_blurry_stream(train.targets, num_sessions=PROTOCOL.num_sessions, seed=1)
    trigger = AnytimeEvalTrigger(PROTOCOL.eval_period)
    sessions = SessionSchedule(PROTOCOL.num_experts) if cls.session_aware else None
    budget = None if cls.session_aware else SampleBudgetSchedule.from_stream_size(len(stream), PROTOCOL.num_experts)
    iteration = ["forward", "loss", "step", "on_optimizer_step", "ema"]
    expected = []
    for session, batches in stream.sessions(PROTOCOL.batch_size, rank=None):
        expected += ["on_expert_start"] * (len(sessions.on_session_start(session)) if sessions else 0)
        for batch in batches:
            expected += iteration * PROTOCOL.online_iter + ["on_batch_end", "router"]
            expected += ["on_expert_start"] * (len(budget.step(batch.global_size)) if budget else 0)
            if trigger.step(batch.samples_seen, batch.global_size) is not None:
                expected += ["on_evaluate", "evaluate anytime"]
        expected += ["on_evaluate", "evaluate session_end", "on_session_end"]
    assert calls == expected


def test_a_run_with_a_progress_bar_warns_nothing_and_reports_every_batch(data):
    bars = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.count, self.postfixes, self.closed = kwargs, 0, [], False
            bars.append(self)

        def update(self, count):
            self.count += count

        def set_postfix(self, **values):
            self.postfixes.append(values)

        def close(self):
            self.closed = True

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_training("dualprompt", "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU, progress=Bar)
    stream = build_si_blurry_stream(data[0].targets, num_sessions=PROTOCOL.num_sessions,
                                    disjoint_ratio=PROTOCOL.disjoint_ratio, blurry_ratio=PROTOCOL.blurry_ratio, seed=1)
    batches = list(stream.batches(PROTOCOL.batch_size, rank=None))
    (bar,) = bars
    assert bar.closed and bar.kwargs["total"] == bar.count == len(batches) == len(bar.postfixes)
    assert [postfix["session"] for postfix in bar.postfixes] == [batch.session for batch in batches]
    losses = [float(postfix["loss"]) for postfix in bar.postfixes]
    assert all(math.isfinite(loss) and loss > 0 for loss in losses) and len(set(losses)) > 1


def test_protocol_records_checkout_weights_by_their_path_in_the_checkout(tmp_path):
    inside = Path(__file__).resolve().parents[1] / "benchmarks" / "proxy" / "weights" / "proxy_vit.safetensors"
    assert Protocol(weights=str(inside)).to_dict()["weights"] == "benchmarks/proxy/weights/proxy_vit.safetensors"
    outside = tmp_path / "vit.safetensors"
    assert Protocol(weights=str(outside)).to_dict()["weights"] == str(outside)
    assert Protocol().to_dict()["weights"] is None
