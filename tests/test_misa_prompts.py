"""MISA's pretrained prompts on the CPU proxy: the adaptation that makes them (benchmarks/methods/misa_adaptation.py,
pretrain_misa_prompts.py), the committed file and its sidecar, and MISA loading them (``prompt_weights``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_errors import one_line_error
from tiny_sweep import TINY

from benchmarks.ablation import cli
from benchmarks.backbone import backbone_of
from benchmarks.core.protocol import Protocol
from benchmarks.methods.base import method_class
from benchmarks.methods.misa_adaptation import ForgettingAwareStep, SessionAdaptation
from benchmarks.proxy.pretrain import MODEL_KWARGS, MODEL_NAME

timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = REPO / "benchmarks" / "proxy" / "weights"
PROMPTS = WEIGHTS / "proxy_misa_prompts.safetensors"
SIDECAR = PROMPTS.with_suffix(".json")
BACKBONE = WEIGHTS / "proxy_vit.safetensors"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _proxy_protocol(prompt_weights) -> Protocol:
    return Protocol(model=MODEL_NAME, model_kwargs=dict(MODEL_KWARGS), pretrained=True, weights=str(BACKBONE),
                    image_size=32, method_kwargs={"misa": {"reference_quirks": True, "prompt_weights": str(prompt_weights)}})


def _tiny_vit(embed_dim: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, patch_size=8,
                             embed_dim=embed_dim, depth=5, num_heads=2)


# ------------------------------------------------------------------------------- the committed prompts
def test_committed_prompts_match_their_sidecar():
    sidecar = json.loads(SIDECAR.read_text())
    assert _sha256(PROMPTS) == sidecar["sha256"] and PROMPTS.stat().st_size == sidecar["bytes"]
    assert sidecar["quick"] is False and sidecar["command"].startswith("python -m benchmarks.proxy.pretrain_misa_prompts")
    # Trained on the committed proxy backbone, whose own sidecar names the same file hash.
    assert sidecar["backbone"]["sha256"] == _sha256(BACKBONE) == json.loads(BACKBONE.with_suffix(".json").read_text())["sha256"]
    tensors = safetensors_torch.load_file(str(PROMPTS))
    assert {name: list(t.shape) for name, t in tensors.items()} == sidecar["tensors"]
    upstream = json.loads(BACKBONE.with_suffix(".json").read_text())["data"]["upstream_class_ids"]
    assert sidecar["data"]["held_out_class_ids"][1] == upstream[1]  # pretraining classes only, never the stream's


def test_the_proxy_misa_loads_the_committed_prompts():
    protocol = _proxy_protocol(PROMPTS)
    misa = method_class("misa").from_protocol(backbone_of(protocol), 10, protocol, seed=1)
    stored = safetensors_torch.load_file(str(PROMPTS))
    assert torch.equal(misa.g_prompts.data, stored["g_prompt"]) and torch.equal(misa.e_prompts.data, stored["e_prompt"])
    notes = method_class("misa").protocol_notes(protocol)
    assert "pretrained prompts loaded from proxy_misa_prompts.safetensors" in notes
    assert method_class("misa").protocol_warning(protocol) == ""
    recorded = protocol.to_dict()["method_kwargs"]["misa"]["prompt_weights"]
    assert recorded == "benchmarks/proxy/weights/proxy_misa_prompts.safetensors"  # no folder of the machine


def test_without_prompts_the_notes_and_the_warning_say_so():
    protocol = dataclasses.replace(_proxy_protocol(PROMPTS), method_kwargs={"misa": {"reference_quirks": True}})
    assert "no --misa-prompts" in method_class("misa").protocol_notes(protocol)
    assert "no --misa-prompts" in method_class("misa").protocol_warning(protocol)


# -------------------------------------------------------------------------------- prompt_weights errors
def _layout():
    return dict(num_experts=2, pool_size=4, g_prompt_length=2, e_prompt_length=3)


def _write(path: Path, **tensors) -> Path:
    safetensors_torch.save_file(tensors, str(path))
    return path


def test_prompt_weights_load_exactly_and_refuse_what_does_not_fit(tmp_path):
    misa = method_class("misa")
    g, e = torch.randn(1, 4, 32), torch.randn(4, 9, 32)
    loaded = misa(_tiny_vit(), 5, prompt_weights=_write(tmp_path / "p.safetensors", g_prompt=g, e_prompt=e), **_layout())
    assert torch.equal(loaded.g_prompts.data, g) and torch.equal(loaded.e_prompts.data, e)
    wrong = _write(tmp_path / "wide.safetensors", g_prompt=torch.randn(1, 4, 48), e_prompt=torch.randn(4, 9, 48))
    with pytest.raises(ValueError, match=r"MISA g_prompt: loaded shape \(1, 4, 48\) does not match"):
        misa(_tiny_vit(), 5, prompt_weights=wrong, **_layout())
    with pytest.raises(FileNotFoundError, match="prompt_weights: .*missing.safetensors' does not exist") as missing:
        misa(_tiny_vit(), 5, prompt_weights=tmp_path / "missing.safetensors", **_layout())
    with pytest.raises(ValueError, match=r"holds \['g_prompt'\]; expected exactly e_prompt and g_prompt"):
        misa(_tiny_vit(), 5, prompt_weights=_write(tmp_path / "g.safetensors", g_prompt=g), **_layout())
    with pytest.raises(ValueError, match="not both"):
        misa(_tiny_vit(), 5, prompt_weights=tmp_path / "p.safetensors", g_prompt=g, e_prompt=e, **_layout())
    (tmp_path / "junk.safetensors").write_text("not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors file") as junk:
        misa(_tiny_vit(), 5, prompt_weights=tmp_path / "junk.safetensors", **_layout())
    assert "\n" not in str(missing.value) and "\n" not in str(junk.value)  # one line each


@pytest.mark.parametrize("weights, needle", [
    ("missing.safetensors", "does not exist"),
    (str(PROMPTS), "MISA g_prompt: loaded shape (1, 20, 128) does not match the expected (1, 20, 48)"),
], ids=["missing", "another width"])
def test_a_sweep_with_unfit_prompt_weights_stops_in_one_line(weights, needle, capsys, no_work, tmp_path):
    weights = weights if weights == str(PROMPTS) else str(tmp_path / weights)
    argv = [*TINY, "--methods", "misa", "--method-kwargs", json.dumps({"misa": {"prompt_weights": weights}}),
            "--output", str(tmp_path / "out")]
    error = one_line_error(capsys, cli.main, argv)
    assert "--methods misa" in error and needle in error, error


def test_prompt_weights_and_misa_prompts_together_are_refused(tmp_path):
    protocol = dataclasses.replace(_proxy_protocol(PROMPTS), misa_prompts=str(tmp_path))
    with pytest.raises(ValueError, match="given twice"):
        method_class("misa").protocol_kwargs(protocol, seed=1, backbone=_tiny_vit(), num_classes=5)


# ----------------------------------------------------------------------------------- the adaptation
def test_forgetting_aware_step_steps_from_the_unmoved_weights_with_the_moved_gradient():
    torch.manual_seed(0)
    weight, target, direction = torch.nn.Parameter(torch.randn(6)), torch.randn(6), torch.randn(6)
    start = weight.detach().clone()
    update = ForgettingAwareStep([weight], torch.optim.SGD([weight], lr=0.5), rho=0.3)
    update.step(lambda: direction @ weight, lambda: 0.5 * (weight - target).square().sum())
    moved = start + 0.3 * direction / direction.norm()  # up the perturbing loss's gradient, radius rho
    torch.testing.assert_close(weight.detach(), start - 0.5 * (moved - target))


def test_session_adaptation_matches_the_whole_pool_and_folds_its_projector():
    model = SessionAdaptation(_tiny_vit(), 7, pool_size=4, g_prompt_length=2, e_prompt_length=3).train()
    assert model.allowed_slots(1, train=True).all()  # the training match ranges over every slot
    prompts = model.adapted_prompts()
    torch.testing.assert_close(prompts["e_prompt"], model.e_prompts + model.e_projector(model.e_prompts))
    x = torch.randn(3, 3, 32, 32)
    before = model(x).logits.detach()
    with torch.no_grad():  # not a constant shift, which the blocks' LayerNorm would remove
        model.e_projector[-1].bias.add_(torch.randn(model.e_projector[-1].bias.shape))
    assert not torch.allclose(model(x).logits, before)  # the blocks see the projected E-prompts


def test_quick_pretraining_is_deterministic_and_its_prompts_load(tmp_path):
    digests = []
    for name in ("a", "b"):
        output = tmp_path / name / "prompts.safetensors"
        command = [sys.executable, "-m", "benchmarks.proxy.pretrain_misa_prompts", "--quick", "--no-progress",
                   "--output", str(output)]
        finished = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert finished.returncode == 0, finished.stderr
        sidecar = json.loads(output.with_suffix(".json").read_text())
        assert sidecar["sha256"] == _sha256(output) and sidecar["sha256"] in finished.stdout and sidecar["quick"]
        digests.append(sidecar["sha256"])
    protocol = _proxy_protocol(output)
    misa = method_class("misa").from_protocol(backbone_of(protocol), 10, protocol, seed=1)
    assert torch.equal(misa.g_prompts.data, safetensors_torch.load_file(str(output))["g_prompt"])
    assert digests[0] == digests[1]


def test_the_update_against_the_fam_command_on_the_stand_in_checkout(capsys, tmp_path):
    from benchmarks.fidelity import misa_fam

    stand_in = REPO / "tests" / "fixtures" / "fake_misa"
    assert misa_fam.main(["--misa", str(stand_in), "--updates", "5"]) == 0
    assert "largest parameter difference 0.0e+00" in capsys.readouterr().out
    fam = misa_fam.load_fam(stand_in)
    wider = lambda params, base, rho, **kwargs: fam(params, base, rho=2 * rho, **kwargs)  # noqa: E731
    assert misa_fam.largest_difference(wider, updates=3) > 0  # the comparison sees a different radius
    assert misa_fam.main(["--misa", str(tmp_path)]) == 2
