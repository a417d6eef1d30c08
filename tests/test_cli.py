"""The cross-ablation command line: every usage or environment error is one line on stderr with exit
status 2, raised before any data or model work; nothing is downloaded without --download."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import pytest
import torch
from cli_errors import one_line_error

from benchmarks.ablation import cli as cross_ablation
from benchmarks.core.presets import PRESETS


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--seeds", "abc"], "--seeds: expected an integer, got 'abc'"),
        (["--seeds", "1,1"], "distinct"),
        (["--methods", "bogus"], "unknown method 'bogus'; choose from coda-prompt, dualprompt"),
        (["--datasets", "bogus"], "unknown dataset 'bogus'"),
        (["--variants", "bogus"], "unknown variant 'bogus'"),
        (["--model-kwargs", "{bad"], "--model-kwargs: expected a JSON object"),
        (["--method-kwargs", '{"bogus": {}}'], "unknown method in --method-kwargs 'bogus'"),
        (["--method-kwargs", '{"l2p": 3}'], "must be a JSON object of keyword arguments"),
        (["--aggregate", "bogus"], "--aggregate: aggregate must be one of ("),
        (["--router-query", "augmented"], "--router-query: invalid choice"),
        (["--ridge", "-1"], "--ridge: ridge must be a finite number > 0 or 'auto', got -1"),
        (["--decays", "0.9,1.5"], "--decays"),
        (["--batch-size", "0"], "--batch-size: expected an integer >= 1"),
        (["--lr", "fast"], "--lr: expected a number"),
        (["--pretrained", "maybe"], "expected true/false"),
        (["--weights", "/nonexistent/vit.safetensors"], "no such file"),
        (["--misa-prompts", "/nonexistent"], "lacks g_prompt.pt, e_prompt.pt"),
        (["--model", "not_a_timm_model"], "is not a timm model name"),
        (["--device", "bogus"], "is not a torch device"),
        (["--threads", "0"], "--threads: expected an integer >= 1"),
        (["--preset", "bogus"], "--preset: invalid choice"),
        (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    ],
)
def test_usage_errors_are_one_line_with_exit_2(argv, needle, capsys, no_work, tmp_path):
    error = one_line_error(capsys, cross_ablation.main, [*argv, "--output", str(tmp_path / "out")])
    assert needle in error
    assert not (tmp_path / "out").exists()  # nothing written


def test_cuda_device_on_a_machine_without_cuda(capsys, no_work, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA is not available" in one_line_error(capsys, cross_ablation.main, ["--device", "cuda", "--output", str(tmp_path / "o")])


@pytest.mark.parametrize(
    "dataset, needle, suggests_download",
    [
        ("cifar100", "CIFAR-100 was not found", True),
        ("imagenet-r", "ImageNet-R was not found", True),
        ("cub200", "Automatic download is not available for CUB-200", False),
    ],
)
def test_missing_data_is_reported_before_any_work(dataset, needle, suggests_download, capsys, no_work, tmp_path):
    argv = ["--preset", "cpu", "--datasets", dataset, "--data-root", str(tmp_path / "data"),
            "--output", str(tmp_path / "out")]
    error = one_line_error(capsys, cross_ablation.main, argv)
    assert needle in error and str(tmp_path / "data") in error
    assert ("download=True" in error) == suggests_download


def test_failed_download_is_one_line(capsys, tmp_path, monkeypatch):
    torchvision = pytest.importorskip("torchvision")

    def offline(*args, **kwargs):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", offline)
    argv = ["--preset", "cpu", "--datasets", "cifar100", "--download", "--data-root", str(tmp_path / "data"),
            "--methods", "l2p", "--output", str(tmp_path / "out"), "--no-progress"]
    error = one_line_error(capsys, cross_ablation.main, argv, quiet=False)  # the download is data work: the sweep had started
    assert "downloading CIFAR-100" in error and "name resolution" in error


def test_uncached_weights_fail_fast_without_touching_the_network(capsys, no_work, tmp_path, monkeypatch):
    import huggingface_hub

    def network(*args, **kwargs):
        raise AssertionError("the hub was contacted without --download")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", network)
    monkeypatch.setattr(huggingface_hub.file_download, "hf_hub_download", network)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # nothing cached
    output = tmp_path / "out"
    output.mkdir()
    (output / "protocol.json").write_text('{"preset": "proxy-short"}')
    error = one_line_error(capsys, cross_ablation.main, ["--preset", "paper", "--datasets", "synthetic", "--output", str(output)])
    assert "not in the local cache" in error and "--download" in error and "--weights" in error
    assert json.loads((output / "protocol.json").read_text()) == {"preset": "proxy-short"}  # untouched


def test_each_preset_has_its_own_default_output_folder():
    parser = cross_ablation.build_parser()
    for preset in PRESETS:
        args = parser.parse_args(["--preset", preset])
        assert str(args.output or Path("results") / preset) == f"results/{preset}"
    args = parser.parse_args(["--preset", "cpu"])
    assert cross_ablation.resolve(args).output == Path("results/cpu")
