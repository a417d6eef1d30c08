"""The CPU proxy benchmark: hard generated data, the pretraining script, the committed checkpoint, and a
reduced proxy cross-ablation end to end."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.ablation import cli as cross_ablation
from benchmarks.backbone import backbone_of
from benchmarks.core.presets import PRESETS
from benchmarks.core.protocol import Protocol
from benchmarks.data import make_synthetic_dataset, make_synthetic_train_test, synthetic_class_split
from benchmarks.proxy.pretrain import MODEL_KWARGS, MODEL_NAME

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "benchmarks" / "proxy" / "weights" / "proxy_vit.safetensors"
SIDECAR = CHECKPOINT.with_suffix(".json")


def test_hard_data_is_deterministic_and_differs_from_standard():
    a = make_synthetic_dataset([400, 401, 402], 5, seed=0, difficulty="hard")
    b = make_synthetic_dataset([400, 401, 402], 5, seed=0, difficulty="hard")
    assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)
    assert a.images.shape == (15, 3, 32, 32) and a.images.dtype == torch.uint8
    standard = make_synthetic_dataset([400, 401, 402], 5, seed=0)
    assert not torch.equal(a.images, standard.images)
    # A class looks the same whatever other classes are generated with it (disjoint id ranges work).
    alone = make_synthetic_dataset([401], 6, seed=0, shuffle=False, noise_std=0.0, difficulty="hard")
    mixed = make_synthetic_dataset([400, 401], 6, seed=0, shuffle=False, noise_std=0.0, difficulty="hard")
    assert torch.equal(alone.images, mixed.images[6:])
    with pytest.raises(ValueError):
        make_synthetic_dataset(2, 2, difficulty="easy")


def test_hard_data_defeats_a_pixel_nearest_class_mean():
    """The standard data are nearly separable on pixels; the hard data are not (chance is 5%)."""
    _, ids = synthetic_class_split(400, 20)

    def ncm(difficulty):
        train, test = make_synthetic_train_test(ids, train_per_class=30, test_per_class=10, difficulty=difficulty)
        x, y = train.get_batch(range(len(train)))
        xt, yt = test.get_batch(range(len(test)))
        means = torch.stack([x[y == c].flatten(1).mean(0) for c in range(20)])
        return float((torch.cdist(xt.flatten(1), means).argmin(1) == yt).float().mean())

    assert ncm("standard") > 0.6
    assert ncm("hard") < 0.3


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_loads_through_runner(path: Path, model_kwargs) -> None:
    from safetensors.torch import load_file

    stored = load_file(str(path))
    assert not any(k.startswith("head.") for k in stored)
    model = backbone_of(Protocol(model=MODEL_NAME, model_kwargs=dict(model_kwargs), pretrained=True, weights=str(path)))
    state = model.state_dict()
    assert set(state) == set(stored)  # strict: every backbone tensor comes from the file, nothing else
    assert all(torch.equal(state[k], stored[k].to(state[k].dtype)) for k in stored)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, model_kwargs["embed_dim"])


def test_safetensors_weights_never_take_the_jax_npz_reader(monkeypatch):
    """timm 1.0.29 keeps the registry's ``custom_load`` (True for the augreg ViTs) when a local file is
    given, and then hands the file to the ViT's JAX .npz reader, which rejects safetensors. Emulated here:
    an overlay without ``custom_load`` gets the registry's value, and the reader accepts .npz only."""
    import timm
    from timm.models import get_pretrained_cfg
    from timm.models.vision_transformer import VisionTransformer

    create_model = timm.create_model

    def keeps_registry_custom_load(name, **kwargs):
        overlay = kwargs.get("pretrained_cfg_overlay")
        if overlay is not None and "custom_load" not in overlay:
            kwargs["pretrained_cfg_overlay"] = dict(overlay, custom_load=get_pretrained_cfg(name).custom_load)
        return create_model(name, **kwargs)

    def npz_only(self, checkpoint_path, prefix=""):
        raise ValueError(f"expected a JAX .npz checkpoint, got {checkpoint_path}")

    assert get_pretrained_cfg(MODEL_NAME).custom_load  # otherwise this test shows nothing
    monkeypatch.setattr(timm, "create_model", keeps_registry_custom_load)
    monkeypatch.setattr(VisionTransformer, "load_pretrained", npz_only)
    _assert_loads_through_runner(CHECKPOINT, MODEL_KWARGS)


def test_pretrain_script_quick_run_writes_a_loadable_checkpoint(tmp_path):
    output = tmp_path / "proxy.safetensors"
    command = [sys.executable, "-m", "benchmarks.proxy.pretrain", "--quick", "--no-progress",
               "--output", str(output)]
    finished = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    sidecar = json.loads(output.with_suffix(".json").read_text())
    assert sidecar["sha256"] == _sha256(output) and sidecar["sha256"] in finished.stdout
    assert sidecar["command"].startswith("python -m benchmarks.proxy.pretrain --quick")
    assert sidecar["quick"] is True and 0 < sidecar["cpu_seconds"]
    _assert_loads_through_runner(output, sidecar["model_kwargs"])


def test_committed_checkpoint_matches_its_sidecar_and_loads():
    sidecar = json.loads(SIDECAR.read_text())
    assert CHECKPOINT.stat().st_size <= 16 * 10**6
    assert _sha256(CHECKPOINT) == sidecar["sha256"]
    assert sidecar["quick"] is False and sidecar["model_kwargs"] == MODEL_KWARGS
    assert sidecar["command"].startswith("python -m benchmarks.proxy.pretrain")
    _assert_loads_through_runner(CHECKPOINT, MODEL_KWARGS)
    for name in ("proxy", "proxy-short", "proxy-10"):
        protocol = PRESETS[name]["protocol"]
        assert Path(protocol.weights) == CHECKPOINT and protocol.model_kwargs == MODEL_KWARGS


def test_reduced_proxy_cross_ablation_end_to_end(tmp_path):
    """The proxy preset (pretrained checkpoint, hard downstream classes, reference baselines, GCV ridge) on a
    few hundred samples, with the oracle variant and the diagnostics."""
    output = tmp_path / "proxy"
    argv = ["--preset", "proxy", "--seeds", "1", "--methods", "dualprompt,flyprompt",
            "--variants", "baseline,router,oracle", "--synthetic-classes", "5", "--synthetic-train-per-class", "48",
            "--synthetic-test-per-class", "4", "--eval-period", "120", "--online-iter", "1", "--expansion-dim", "24",
            "--no-progress", "--output", str(output)]
    assert cross_ablation.main(argv) == 0
    rows = json.loads((output / "table.json").read_text())
    assert {(r["method"], r["variant"]) for r in rows} == {
        ("dualprompt", "baseline"), ("dualprompt", "router"), ("dualprompt", "oracle"),
        ("flyprompt", "full"), ("flyprompt", "oracle")}
    run = json.loads((output / "runs" / "cifar100-like" / "dualprompt" / "baseline" / "seed1.json").read_text())
    (baseline,) = [r for r in rows if (r["method"], r["variant"]) == ("dualprompt", "baseline")]
    assert baseline["A_auc_mean"] == pytest.approx(100 * run["metrics"]["A_auc"])  # percent of the run's fraction
    assert run["stream_length"] == 240 and run["protocol"]["weights"] == "benchmarks/proxy/weights/proxy_vit.safetensors"
    assert run["protocol"]["ridge"] == "auto" and run["protocol"]["router_query"] == "clean"
    assert run["protocol"]["method_kwargs"]["dualprompt"] == {"reference_quirks": True}
    diagnostics = run["diagnostics"]
    routing = diagnostics["routing"]
    assert routing["rear"]["modal"]["last"] <= routing["rear"]["any"]["last"]  # the modal expert is one that trained
    router = json.loads((output / "runs" / "cifar100-like" / "dualprompt" / "router" / "seed1.json").read_text())
    assert router["diagnostics"]["routing"] == routing  # one training scored both variants
    assert len(diagnostics["expert_matrix"]["accuracy"]) == len(diagnostics["expert_matrix"]["groups"])
    assert json.loads((output / "protocol.json").read_text())["preset"] == "proxy"


@pytest.mark.parametrize("name", ["proxy", "proxy-short", "proxy-10"])
def test_proxy_presets_follow_the_papers_comparisons(name):
    """Reference baselines, clean router query, and the documented router rule (docs/proxy.md): ridge by
    generalised cross-validation, M a tenth of the stream; the stream's classes are not pretraining classes."""
    preset = PRESETS[name]
    (dataset,) = preset["datasets"]
    protocol = preset["protocol"]
    data = preset["synthetic"] if dataset == "synthetic" else preset["generated"][dataset]
    misa = {"reference_quirks": True, "prompt_weights": str(CHECKPOINT.with_name("proxy_misa_prompts.safetensors"))}
    own = {} if name == "proxy-10" else {"misa": misa}  # the earlier proxy's MISA had no pretrained prompts
    assert protocol.method_kwargs == {**PRESETS["paper"]["protocol"].method_kwargs, **own}
    assert protocol.method_kwargs is not PRESETS["paper"]["protocol"].method_kwargs
    assert protocol.router_query == "clean" and protocol.ridge == "auto"
    assert protocol.expansion_dim == data["num_classes"] * data["train_per_class"] // 10
    assert (protocol.num_sessions, protocol.disjoint_ratio, protocol.blurry_ratio) == (5, 0.5, 0.1)
    assert data["difficulty"] == "hard"
    assert data["class_offset"] == json.loads(SIDECAR.read_text())["data"]["upstream_class_ids"][1] + 1
    task_experts = ["coda-prompt", "s-prompt"] if name == "proxy" else []  # the earlier proxy was run without them
    expert_methods = ["hide-lora", "hide-adapter", "sd-lora"] if name != "proxy-short" else []
    assert preset["methods"] == ["l2p", "dualprompt", "mvp", "misa", "hide", "norga", *task_experts, *expert_methods,
                                 "flyprompt"]


def test_proxy_runs_three_seeds_and_the_default_is_proxy_short():
    assert PRESETS["proxy"]["seeds"] == [1, 2, 3] and len(PRESETS["proxy-short"]["seeds"]) == 1
    assert cross_ablation.build_parser().parse_args([]).preset == "proxy-short"
