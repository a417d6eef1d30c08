"""Seq FT and Seq FT w/ SL: the whole ViT and its head train through the runner by SGD with two learning rates
(the slow learner's backbone 100 times slower than its head); the router is refused with its reason, the EMA
heads are admitted; a run resumed from a checkpoint equals the uninterrupted run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

pytest.importorskip("timm")

from benchmarks.ablation.runner import build_run, run_training  # noqa: E402
from benchmarks.backbone import backbone_of  # noqa: E402
from benchmarks.core.protocol import Protocol  # noqa: E402
from benchmarks.core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS, skipped_variants, variants_for  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.methods import create_method, method_class  # noqa: E402
from benchmarks.methods.seq_ft import SEQ_FT_HEAD_LR, SEQ_FT_WEIGHT_DECAY  # noqa: E402
from benchmarks.methods.single_expert import SINGLE_EXPERT_ROUTER_REFUSAL  # noqa: E402

CPU = torch.device("cpu")
PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2),
    pretrained=False, image_size=32, batch_size=12, online_iter=2, eval_period=30, test_batch_size=16,
    num_sessions=2, num_experts=2, expansion_dim=64, ridge=1e2, amp=False, router_query="clean",
)


@pytest.fixture(scope="module")
def data():
    return make_synthetic_train_test(6, train_per_class=8, test_per_class=4, seed=0, image_size=32)


def test_the_router_is_refused_and_the_ensemble_admitted():
    for name in ("seq-ft", "seq-ft-sl"):
        cls = method_class(name)
        assert variants_for(cls, [*ABLATION_VARIANTS, *ORACLE_VARIANTS]) == ["baseline", "ensemble", "oracle", "oracle_both"]
        assert skipped_variants(cls, ABLATION_VARIANTS) == {"router": SINGLE_EXPERT_ROUTER_REFUSAL,
                                                            "both": SINGLE_EXPERT_ROUTER_REFUSAL}
    with pytest.raises(ValueError, match="num_experts must be 1, found 3"):
        create_method("seq-ft", backbone_of(PROTOCOL), 6, num_experts=3)
    for bad in ({"head_lr": 0}, {"head_lr": float("nan")}, {"weight_decay": -1e-4}, {"weight_decay": True}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be"):
            create_method("seq-ft", backbone_of(PROTOCOL), 6, **bad)


def test_the_optimizer_is_sgd_with_the_backbones_and_the_heads_learning_rates(data):
    for name, backbone_lr in (("seq-ft", 0.005), ("seq-ft-sl", 5e-5)):
        run = build_run(name, "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU)
        model, optimizer = run.model, run.trainer.optimizer
        assert type(model).default_lr == backbone_lr and isinstance(optimizer, torch.optim.SGD)
        backbone, head = optimizer.param_groups
        assert (backbone["lr"], head["lr"]) == (backbone_lr, SEQ_FT_HEAD_LR)
        assert backbone["weight_decay"] == head["weight_decay"] == SEQ_FT_WEIGHT_DECAY
        assert backbone["momentum"] == head["momentum"] == 0
        assert {id(p) for p in backbone["params"]} == {id(p) for p in model.backbone.parameters()}
        assert {id(p) for p in head["params"]} == {id(p) for p in model.head.parameters()}
    other = dataclasses.replace(PROTOCOL, lr=1e-3)
    assert method_class("seq-ft-sl").protocol_notes(other) == (
        "--lr 0.001 is the backbone's learning rate (default 5e-05); the head's is 0.005")
    assert method_class("seq-ft-sl").protocol_notes(PROTOCOL) == ""


def test_the_whole_vit_trains_and_the_ema_heads_change_predictions(data):
    run = build_run("seq-ft", "synthetic", 1, ["baseline", "ensemble"], PROTOCOL, *data, device=CPU)
    initial = {name: tensor.clone() for name, tensor in run.model.backbone.state_dict().items()}
    run.trainer.train()
    trained = run.model.backbone.state_dict()
    assert all(not torch.equal(initial[name], trained[name]) for name in initial if name.startswith("blocks."))
    baseline, ensemble = (run.evaluator.logs[variant] for variant in ("baseline", "ensemble"))
    assert json.dumps(baseline.to_dict()["records"]) != json.dumps(ensemble.to_dict()["records"])


def test_a_run_stopped_and_resumed_from_its_checkpoint_equals_the_uninterrupted_run(data, tmp_path):
    from benchmarks.ablation.preemption import RunInterrupted
    from benchmarks.ablation.runner import CheckpointPolicy
    from benchmarks.core.checkpointing import CheckpointStore

    whole = run_training("seq-ft-sl", "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU)
    store = CheckpointStore(tmp_path / "checkpoints")
    calls = iter(range(1000))
    stop = CheckpointPolicy(store, period="evaluation", stop_requested=lambda: next(calls) == 2)
    with pytest.raises(RunInterrupted):
        run_training("seq-ft-sl", "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU, checkpointing=stop)
    resumed = run_training("seq-ft-sl", "synthetic", 1, ["baseline"], PROTOCOL, *data, device=CPU,
                           checkpointing=CheckpointPolicy(store, period="evaluation", resume=store.latest()[1]))
    for key in ("metrics", "log"):
        assert json.dumps(resumed["baseline"][key]) == json.dumps(whole["baseline"][key]), key
