"""The components study's methods: the linear probe (with and without EMA heads) and RanPAC† train through the
runner; RanPAC's classifier is the float64 ridge solve on the random expanded features of the batches after
the first session; the variants they cannot run are refused with their reasons; a run resumed from a
checkpoint equals the uninterrupted run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("timm")
scipy_linalg = pytest.importorskip("scipy.linalg")

from benchmarks.ablation.runner import build_run, run_reference, run_training  # noqa: E402
from benchmarks.backbone import backbone_of  # noqa: E402
from benchmarks.core.protocol import Protocol, RunSpec  # noqa: E402
from benchmarks.core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS, skipped_variants, variants_for  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.methods import create_method, method_class  # noqa: E402
from benchmarks.methods.ranpac import RANPAC_ENSEMBLE_REFUSAL  # noqa: E402
from benchmarks.methods.single_expert import SINGLE_EXPERT_ROUTER_REFUSAL  # noqa: E402

CPU = torch.device("cpu")
RIDGE = 10.0
PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2),
    pretrained=False, image_size=32, batch_size=12, online_iter=2, eval_period=30, test_batch_size=16,
    num_sessions=3, num_experts=3, expansion_dim=64, ridge=1e2, amp=False, router_query="clean",
    method_kwargs={"ranpac": {"ridge": RIDGE, "adapter_width": 8, "adapter_layers": 2}},
)
ALL_VARIANTS = [*ABLATION_VARIANTS, *ORACLE_VARIANTS]


@pytest.fixture(scope="module")
def data():
    return make_synthetic_train_test(8, train_per_class=12, test_per_class=4, seed=0, image_size=32)


def log_text(record):
    return json.dumps({"meta": record["log"]["meta"], "records": record["log"]["records"]})


def test_variants_they_cannot_run_are_refused_with_the_reason():
    probe, ranpac = method_class("linear-probe"), method_class("ranpac")
    assert variants_for(probe, ALL_VARIANTS) == ["baseline", "ensemble", "oracle", "oracle_both"]
    assert skipped_variants(probe, ALL_VARIANTS) == {"router": SINGLE_EXPERT_ROUTER_REFUSAL,
                                                     "both": SINGLE_EXPERT_ROUTER_REFUSAL}
    assert variants_for(ranpac, ALL_VARIANTS) == ["baseline", "oracle"]
    assert skipped_variants(ranpac, ALL_VARIANTS) == {
        "router": SINGLE_EXPERT_ROUTER_REFUSAL, "ensemble": RANPAC_ENSEMBLE_REFUSAL, "both": SINGLE_EXPERT_ROUTER_REFUSAL,
        "oracle_both": RANPAC_ENSEMBLE_REFUSAL}
    with pytest.raises(ValueError, match="'linear-probe' runs the variants \\[\\] for \\['router'\\]"):
        run_training("linear-probe", "synthetic", 1, ["router"], PROTOCOL, None, None, device=CPU)
    backbone = backbone_of(PROTOCOL)
    for name in ("linear-probe", "ranpac"):
        with pytest.raises(ValueError, match="num_experts must be 1, found 3"):
            create_method(name, backbone, 8, num_experts=3)
        method = create_method(name, backbone, 8)
        with pytest.raises(ValueError, match="one expert, 0; found the expert ids \\[1\\]"):
            method(torch.zeros(2, 3, 32, 32), expert=torch.tensor([0, 1]))


def test_a_method_no_router_can_choose_for_trains_no_router_beside_it(data):
    """No routed variant runs for the linear probe, RanPAC† or SD-LoRA: the benchmark keeps no REAR statistics
    for them (a second M x M G beside RanPAC's own classifier), and its checkpoint holds none."""
    for name, router in (("linear-probe", False), ("ranpac", False), ("sd-lora", False), ("dualprompt", True)):
        run = build_run(name, "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU)
        assert (run.trainer.components.router is not None) is router, name
        assert ("router" in run.trainer.components.state_dict()) is router, name


def test_the_variants_of_one_training_equal_their_own_runs_through_the_reference_adapter(data):
    together = run_training("linear-probe", "synthetic", 1, ["baseline", "ensemble"], PROTOCOL, *data, device=CPU)
    for variant in ("baseline", "ensemble"):
        alone = run_reference(RunSpec("linear-probe", variant, "synthetic", 1), PROTOCOL, *data, device=CPU)
        assert log_text(together[variant]) == log_text(alone), variant
    assert log_text(together["baseline"]) != log_text(together["ensemble"])  # the EMA heads change predictions
    assert set(together["ensemble"]["diagnostics"]["members"]) == {"online", "ema_0.9", "ema_0.99", "ensemble"}
    ranpac = run_training("ranpac", "synthetic", 1, ["baseline", "oracle"], PROTOCOL, *data, device=CPU)
    alone = run_reference(RunSpec("ranpac", "baseline", "synthetic", 1), PROTOCOL, *data, device=CPU)
    assert log_text(ranpac["baseline"]) == log_text(alone)
    assert ranpac["oracle"]["log"]["records"] == ranpac["baseline"]["log"]["records"]  # one expert: the same


class _Recorder:
    """The rows and labels every ``classifier.update`` of a RanPAC run received, and its state at the first
    session's end."""

    def __init__(self, model) -> None:
        self.model, self.rows, self.labels, self.frozen = model, [], [], None
        self.later_forwards = self.later_batches = 0
        update, end, forward, batch_end = model.classifier.update, model.on_session_end, model.forward, model.on_batch_end
        model.classifier.update = lambda rows, labels: (self.rows.append(rows.double()),
                                                        self.labels.append(labels), update(rows, labels))[-1]
        model.on_session_end = lambda session: (self.freeze_point(session), end(session))[-1]
        model.forward = lambda *args, **kwargs: (self.count("later_forwards"), forward(*args, **kwargs))[-1]
        model.on_batch_end = lambda *args, **kwargs: (self.count("later_batches"), batch_end(*args, **kwargs))[-1]

    def count(self, name: str) -> None:
        if self.model.training and self.model.first_session_done:
            setattr(self, name, getattr(self, name) + 1)

    def freeze_point(self, session: int) -> None:
        if session == 0:
            assert self.model.classifier.num_samples == 0 and self.model.trains_online()
            self.frozen = {k: v.clone() for k, v in self.model.state_dict().items() if k.startswith(("adapter", "head"))}


def test_ranpac_trains_its_adaptation_in_the_first_session_then_solves_the_ridge_classifier(data):
    run = build_run("ranpac", "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU)
    model = run.model
    initial = {k: v.clone() for k, v in model.state_dict().items() if k.startswith(("adapter", "head"))}
    recorder = _Recorder(model)
    run.trainer.train()
    # The first session trained the adapters and the head; nothing moved them after it.
    assert any(not torch.equal(initial[k], recorder.frozen[k]) for k in initial)
    assert all(torch.equal(recorder.frozen[k], model.state_dict()[k]) for k in initial)
    assert not model.trains_online() and not any(p.requires_grad for p in model.trainable_parameters())
    assert recorder.later_forwards == recorder.later_batches > 0  # one forward per batch, no training step
    rows, labels = torch.cat(recorder.rows).numpy(), torch.cat(recorder.labels).numpy()
    assert len(rows) == len(run.stream) - len(run.stream.session_orders[0])  # every later sample, no first-session one
    # The reference: the same rows expanded in float64, G and Q summed, (G + ridge I) W = Q solved by scipy.
    expansion = model.classifier.expansion.weight.double().numpy()
    phi = np.maximum(rows @ expansion.T, 0.0)
    onehot = np.eye(model.num_classes)[labels]
    gram, cross = phi.T @ phi, phi.T @ onehot
    weights = scipy_linalg.solve(gram + RIDGE * np.eye(len(gram)), cross, assume_a="pos")
    np.testing.assert_allclose(model.classifier.gram_matrix().numpy(), gram, rtol=1e-6, atol=1e-9 * np.abs(gram).max())
    test_images = data[1].get_batch(torch.arange(len(data[1])))[0]
    model.eval()
    with torch.no_grad():
        features = model.compute_query(test_images).query
        scores = model(test_images).logits
    expected = np.maximum(features.double().numpy() @ expansion.T, 0.0) @ weights
    # The features are float32: the classifier expands them with a float32 product (docs/router.md, "Precision").
    np.testing.assert_allclose(scores.numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    assert scores.dtype == features.dtype


@pytest.mark.parametrize("method,variants", [("ranpac", ["baseline", "oracle"]), ("linear-probe", ["baseline", "ensemble"])])
def test_a_run_stopped_and_resumed_from_its_checkpoint_equals_the_uninterrupted_run(data, tmp_path, method, variants):
    from benchmarks.ablation.preemption import RunInterrupted
    from benchmarks.ablation.runner import CheckpointPolicy
    from benchmarks.core.checkpointing import CheckpointStore

    whole = run_training(method, "synthetic", 1, variants, PROTOCOL, *data, device=CPU)
    store = CheckpointStore(tmp_path / "checkpoints")
    calls = iter(range(1000))
    stop = CheckpointPolicy(store, period="evaluation", stop_requested=lambda: next(calls) == 5)
    with pytest.raises(RunInterrupted):
        run_training(method, "synthetic", 1, variants, PROTOCOL, *data, device=CPU, checkpointing=stop)
    resumed = run_training(method, "synthetic", 1, variants, PROTOCOL, *data, device=CPU,
                           checkpointing=CheckpointPolicy(store, period="evaluation", resume=store.latest()[1]))
    for variant in variants:
        for key in ("metrics", "log", "diagnostics"):
            assert json.dumps(resumed[variant][key]) == json.dumps(whole[variant][key]), (variant, key)


def test_ranpac_state_dict_round_trip_restores_the_frozen_phase_and_the_classifier(data):
    run = build_run("ranpac", "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU)
    run.trainer.train()
    state = run.model.state_dict()
    torch.manual_seed(5)
    fresh = build_run("ranpac", "synthetic", 2, ["baseline"], PROTOCOL, *data, device=CPU).model
    assert fresh.trains_online()
    fresh.load_state_dict(state)
    assert not fresh.trains_online() and not any(p.requires_grad for p in fresh.trainable_parameters())
    images = data[1].get_batch(torch.arange(8))[0]
    run.model.eval()
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh(images).logits, run.model(images).logits)


def test_ranpac_adds_the_first_session_to_its_classifier_when_asked_as_flygcls_code_does(data):
    from dataclasses import replace

    default = build_run("ranpac", "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU)
    default.trainer.train()
    options = PROTOCOL.method_kwargs["ranpac"]
    kept = replace(PROTOCOL, method_kwargs={"ranpac": {**options, "first_session_statistics": True}})
    run = build_run("ranpac", "synthetic", 1, ["baseline"], kept, *data, device=CPU)
    run.trainer.train()
    first_session = len(run.stream.session_orders[0])
    assert default.model.classifier.num_samples == len(run.stream) - first_session
    assert run.model.classifier.num_samples == len(run.stream)
    # The first session's rows are the adapters' class tokens after each batch's steps: the classifier holds
    # more than the default's, and the adaptation itself trained as the default's did.
    assert not torch.equal(run.model.classifier.gram_matrix(), default.model.classifier.gram_matrix())
    adapted = [k for k in default.model.state_dict() if k.startswith(("adapter", "head"))]
    assert adapted and all(torch.equal(run.model.state_dict()[k], default.model.state_dict()[k]) for k in adapted)
    with pytest.raises(TypeError, match="first_session_statistics must be True or False"):
        build_run("ranpac", "synthetic", 1, ["baseline"], replace(kept, method_kwargs={"ranpac": {
            **options, "first_session_statistics": "yes"}}), *data, device=CPU)
