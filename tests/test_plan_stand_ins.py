"""--plan before anything is downloaded: the paper's datasets by their sizes, the probe on images of their shape."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("timm")

from benchmarks.ablation.plan import count_work, make_plan  # noqa: E402
from benchmarks.core.dataset_sizes import DATASET_SIZES, stand_in  # noqa: E402
from benchmarks.core.protocol import Protocol, RunSpec  # noqa: E402
from benchmarks.data.records import DatasetNotFoundError  # noqa: E402

PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2),
    pretrained=False, image_size=32, batch_size=64, online_iter=1, eval_period=1000, num_experts=5,
    expansion_dim=64, ridge=1e2, amp=False,
)


def _missing(name):
    raise DatasetNotFoundError(f"{name} was not found: looked for 'nowhere'; download it")


@pytest.mark.parametrize("name", sorted(DATASET_SIZES))
def test_stand_ins_have_the_datasets_sizes_and_image_shapes(name):
    size = DATASET_SIZES[name]
    train, test = stand_in(name, 48)
    assert (len(train), len(test), len(train.classes)) == (size.train, size.test, size.classes)
    counts = torch.bincount(train.targets, minlength=size.classes)
    assert int(counts.max() - counts.min()) <= 1
    raw, labels = train.get_raw_batch(torch.tensor([0, 7, len(train) - 1]))
    side = size.stored_side or 48
    assert raw.shape == (3, 3, side, side) and raw.dtype == torch.uint8
    assert labels.tolist() == train.targets[[0, 7, len(train) - 1]].tolist()
    assert train.get_batch([1, 2])[0].shape == (2, 3, 48, 48)


def test_cifar100_stand_in_counts_the_work_of_a_shuffled_split():
    """CIFAR-100 has 500 / 100 images of every class in a shuffled order: the stand-in's stream has the same
    evaluations, batches within one per session; the images scored depend on the order within a few percent."""
    train, test = stand_in("cifar100", 32)
    real_targets = torch.arange(100).repeat(500)[torch.randperm(50_000, generator=torch.Generator().manual_seed(3))]
    real = type("Real", (), {"targets": real_targets})()
    specs = [RunSpec("l2p", "baseline", "cifar100", 1)]
    (counted,) = count_work(specs, PROTOCOL, lambda name: (train, test))
    (expected,) = count_work(specs, PROTOCOL, lambda name: (real, test))
    assert abs(counted.batches - expected.batches) <= PROTOCOL.num_sessions  # a partial batch per session at most
    assert counted.evaluations == expected.evaluations
    assert counted.eval_images == pytest.approx(expected.eval_images, rel=0.05)


def test_plan_is_made_without_the_dataset_and_says_so():
    lines = []
    specs = [RunSpec("l2p", v, "cifar100", 1) for v in ("baseline", "router")]
    document = make_plan(specs, PROTOCOL, _missing, device=torch.device("cpu"), probe_batches=1, eval_samples=8,
                         log=lines.append)
    assert document["stand_in_datasets"] == ["cifar100"] and document["random_weights"] is False
    (training,) = document["trainings"]
    assert abs(training["batches"] - 50_000 / 64) <= PROTOCOL.num_sessions and training["estimate"]["ours"] > 0
    assert any("cifar100 was not found" in line for line in lines)


def test_plan_of_an_unknown_missing_dataset_still_fails():
    specs = [RunSpec("l2p", "baseline", "synthetic", 1)]
    with pytest.raises(DatasetNotFoundError):
        make_plan(specs, PROTOCOL, _missing, device=torch.device("cpu"), probe_batches=1, eval_samples=8)


def test_a_plan_is_resolved_without_the_datasets_on_disk(tmp_path):
    from benchmarks.ablation.arguments import build_parser
    from benchmarks.ablation.sweep import resolve

    flags = ["--preset", "paper", "--pretrained", "false", "--data-root", str(tmp_path), "--datasets", "cifar100"]
    with pytest.raises(DatasetNotFoundError, match="CIFAR-100 was not found"):
        resolve(build_parser().parse_args(flags))
    assert resolve(build_parser().parse_args([*flags, "--plan"])).datasets == ["cifar100"]


def test_paper_plan_with_an_empty_cache_answers_on_random_weights_and_touches_no_network(tmp_path, monkeypatch, capsys):
    """``--preset paper --plan`` without ``--pretrained false``: the pretrained weights are in no cache, the
    dataset on no disk, and no connection may be opened; the plan still answers and says what it stood in."""
    import socket

    from huggingface_hub import constants

    from benchmarks.ablation import cli

    cache = tmp_path / "cache"
    for name in ("HF_HOME", "HF_HUB_CACHE", "TORCH_HOME"):
        monkeypatch.setenv(name, str(cache / name))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache / "HF_HUB_CACHE"))

    def no_network(*args, **kwargs):
        raise AssertionError(f"--plan opened a connection: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    small = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)  # ViT-B's probe is slow on a CPU
    argv = ["--preset", "paper", "--plan", "--datasets", "cifar100", "--methods", "flyprompt", "--seeds", "1",
            "--model", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(small), "--image-size", "32",
            "--expansion-dim", "64", "--data-root", str(tmp_path / "data"), "--output", str(tmp_path / "out")]
    assert cli.main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    document = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert document["random_weights"] is True and document["stand_in_datasets"] == ["cifar100"]
    assert document["protocol"]["pretrained"] is True  # the record is the run's, which a --shard compares with
    assert "vit_tiny_patch16_224 not on this machine: the probe timed its architecture on random weights" in printed
    assert document["total_seconds"]["ours"] > 0
