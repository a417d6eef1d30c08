"""The studies on one training: the routing study's routers beside REAR change nothing else."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("timm")

from benchmarks.ablation.runner import run_training  # noqa: E402
from benchmarks.core.protocol import Protocol  # noqa: E402
from benchmarks.core.variants import ABLATION_VARIANTS  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.studies.router_set import ROUTERS  # noqa: E402

CPU = torch.device("cpu")
PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2),
    pretrained=False, image_size=32, batch_size=12, online_iter=2, eval_period=30, test_batch_size=16,
    num_experts=3, expansion_dim=64, ridge=1e2, amp=False,
)


@pytest.fixture(scope="module")
def data():
    return make_synthetic_train_test(6, train_per_class=12, test_per_class=4, seed=0, image_size=32)


@pytest.mark.parametrize("method,variants", [("dualprompt", list(ABLATION_VARIANTS)), ("flyprompt", ["full"])])
def test_every_router_is_scored_on_one_training_that_it_leaves_unchanged(data, method, variants):
    plain = run_training(method, "synthetic", 1, variants, PROTOCOL, *data, device=CPU)
    studied = run_training(method, "synthetic", 1, variants, PROTOCOL, *data, device=CPU, routers=list(ROUTERS))
    for variant in variants:
        for key in ("metrics", "log"):
            assert json.dumps(studied[variant][key]) == json.dumps(plain[variant][key]), (variant, key)
        diagnostics = dict(studied[variant]["diagnostics"])
        routers = diagnostics.pop("routers", None)
        assert json.dumps(diagnostics) == json.dumps(plain[variant]["diagnostics"])
        if variant in ("baseline", "ensemble"):
            assert routers is None  # the method's own selection: no router to replace
            continue
        assert list(routers) == list(ROUTERS)
        ridge = routers["ridge"]
        assert ridge["A_auc"] == pytest.approx(studied[variant]["metrics"]["A_auc"])
        assert ridge["routing"] == plain[variant]["diagnostics"]["routing"]["rear"]
        for name in ROUTERS:
            assert 0 <= routers[name]["routing"]["modal"]["last"] <= 1, name
            assert 0 <= routers[name]["A_last"] <= 1, name
        assert routers["prototype"]["seconds_per_update"] > 0


def test_unknown_router_is_refused_before_training(data):
    with pytest.raises(ValueError, match="unknown routers \\['lda'\\]"):
        run_training("l2p", "synthetic", 1, ["router"], PROTOCOL, *data, device=CPU, routers=["lda"])


def test_every_aggregation_rule_is_scored_on_the_ensemble_variants(data):
    from fly_modules.ensemble import AGGREGATION_RULES

    plain = run_training("dualprompt", "synthetic", 1, ["ensemble", "router"], PROTOCOL, *data, device=CPU)
    studied = run_training("dualprompt", "synthetic", 1, ["ensemble", "router"], PROTOCOL, *data, device=CPU,
                           aggregations=list(reversed(AGGREGATION_RULES)))
    for key in ("metrics", "log", "diagnostics"):  # no ensemble in the router variant: nothing added
        assert json.dumps(studied["router"][key]) == json.dumps(plain["router"][key]), key
    rules = studied["ensemble"]["diagnostics"]["aggregations"]
    assert list(rules) == list(AGGREGATION_RULES)
    own = rules[PROTOCOL.aggregate]
    assert own["A_auc"] == pytest.approx(plain["ensemble"]["metrics"]["A_auc"])
    assert own["A_last"] == pytest.approx(plain["ensemble"]["metrics"]["A_last"])
    assert len({(r["A_auc"], r["A_last"]) for r in rules.values()}) > 1  # the rules really differ
    with pytest.raises(ValueError, match="unknown aggregation rules"):
        run_training("dualprompt", "synthetic", 1, ["ensemble"], PROTOCOL, *data, device=CPU, aggregations=["vote"])


def test_backbone_presets_select_the_model_and_the_papers_ridge():
    from benchmarks.ablation.arguments import build_parser
    from benchmarks.ablation.sweep import resolve
    from benchmarks.backbone import BACKBONES

    def sweep(*flags):
        return resolve(build_parser().parse_args(["--preset", "paper", "--pretrained", "false", "--datasets",
                                                  "synthetic", *flags]))

    assert {name: b.ridge for name, b in BACKBONES.items()} == {
        "sup21k": 1e4, "sup21k-1k": 1e6, "ibot21k": 1e7, "ibot1k": 1e7, "dino1k": 1e7, "mocov3-1k": 1e6}
    chosen = sweep("--backbone", "sup21k-1k")
    assert (chosen.protocol.model, chosen.protocol.ridge) == ("vit_base_patch16_224.augreg_in21k_ft_in1k", 1e6)
    assert sweep("--backbone", "dino1k", "--ridge", "3e5").protocol.ridge == 3e5
    assert sweep("--study", "routers").routers == list(ROUTERS)
    assert sweep().routers == [] and sweep().aggregations == []


def test_wrapped_official_checkpoints_convert_to_the_model_tensors(tmp_path):
    import timm

    from benchmarks.backbone import BackboneLoadError, unwrap_checkpoint

    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=0, depth=1)
    wrapped = {"teacher": {f"backbone.{k}": v for k, v in model.state_dict().items()} | {"head.w": torch.zeros(2)}}
    torch.save(wrapped, tmp_path / "checkpoint.pth")
    tensors = unwrap_checkpoint(str(tmp_path / "checkpoint.pth"), ("teacher", "backbone."), model)
    assert set(tensors) == set(model.state_dict())
    torch.save({"teacher": {}}, tmp_path / "empty.pth")
    with pytest.raises(BackboneLoadError, match="missing"):
        unwrap_checkpoint(str(tmp_path / "empty.pth"), ("teacher", "backbone."), model)


def test_sup21k_1k_reads_the_official_file_plain_or_under_state_dict(tmp_path):
    """As the official loader of vit_21k_1k_mepo_epoch_0.pth: the state dict itself, or the one under
    ``state_dict``; entries that are not the backbone's (a classifier) are left out."""
    import timm

    from benchmarks.backbone import BACKBONES, unwrap_checkpoint

    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=0, depth=1)
    plain = {**model.state_dict(), "head.weight": torch.zeros(1000, 192)}
    for name, content in (("plain.pth", plain), ("wrapped.pth", {"state_dict": plain, "epoch": 0})):
        torch.save(content, tmp_path / name)
        tensors = unwrap_checkpoint(str(tmp_path / name), BACKBONES["sup21k-1k"].wrapped, model)
        assert set(tensors) == set(model.state_dict()), name
        assert all(torch.equal(tensors[k], v) for k, v in model.state_dict().items()), name


def test_a_backbone_on_timm_weights_other_than_the_papers_says_so(capsys):
    from benchmarks.ablation.arguments import build_parser
    from benchmarks.ablation.sweep import resolve

    def warnings(*flags):
        resolve(build_parser().parse_args(["--preset", "paper", "--datasets", "synthetic", "--plan", *flags]))
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]

    (line,) = warnings("--backbone", "sup21k-1k")
    assert "augreg_in21k_ft_in1k" in line and "vit_21k_1k_mepo_epoch_0.pth" in line
    assert "python -m benchmarks.backbone sup21k-1k vit_21k_1k_mepo_epoch_0.pth" in line
    assert "iBOT-21K" in warnings("--backbone", "ibot21k")[0]
    assert warnings("--backbone", "sup21k") == warnings("--backbone", "dino1k") == []  # timm's are the paper's
    assert warnings("--backbone", "sup21k-1k", "--pretrained", "false") == []


def test_a_study_run_stopped_and_resumed_from_its_checkpoint_equals_the_uninterrupted_run(data, tmp_path):
    from benchmarks.ablation.preemption import RunInterrupted
    from benchmarks.ablation.runner import CheckpointPolicy
    from benchmarks.core.checkpointing import CheckpointStore

    studies = dict(routers=list(ROUTERS), aggregations=["mean", "softmax_max"])
    args = ("dualprompt", "synthetic", 1, ["router", "both"], PROTOCOL, *data)
    whole = run_training(*args, device=CPU, **studies)
    store = CheckpointStore(tmp_path / "checkpoints")
    calls = iter(range(1000))
    stop_at_fifth_batch = CheckpointPolicy(store, period=0, stop_requested=lambda: next(calls) == 4)
    with pytest.raises(RunInterrupted):
        run_training(*args, device=CPU, checkpointing=stop_at_fifth_batch, **studies)
    resumed = run_training(*args, device=CPU, checkpointing=CheckpointPolicy(store, period=0, resume=store.latest()[1]),
                           **studies)
    for variant in ("router", "both"):
        for key in ("metrics", "log", "diagnostics"):
            expected, got = dict(whole[variant][key]), dict(resumed[variant][key])
            for name in got.get("routers", {}):  # timings differ between the two runs
                for entry in (expected["routers"][name], got["routers"][name]):
                    entry.pop("seconds_per_update", None)
                    entry.pop("seconds_per_routed_batch", None)
            assert json.dumps(got) == json.dumps(expected), (variant, key)
