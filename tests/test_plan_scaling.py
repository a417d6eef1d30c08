"""``--plan`` probes one small batch of one online iteration per method, scales it to the protocol's batch and
says so, and prints each step as it starts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("timm")

from tiny_sweep import TINY  # noqa: E402

from benchmarks import cross_ablation  # noqa: E402
from benchmarks.ablation.probe import scale_training  # noqa: E402
from benchmarks.core.protocol import Protocol  # noqa: E402


def test_training_parts_scale_with_the_images_and_the_iterations():
    probed, protocol = Protocol(batch_size=16, online_iter=1), Protocol(batch_size=64, online_iter=3)
    parts = {"train/steps": 1.0, "train/augment": 0.25, "train/data": 0.5, "train/router_query": 0.25}
    per_batch, scaled, what = scale_training(2.5, parts, probed, protocol)
    assert scaled == {"train/steps": 12.0, "train/augment": 3.0, "train/data": 2.0, "train/router_query": 1.0}
    assert per_batch == pytest.approx(18.0 + 0.5 * 4)  # the untimed rest by the images
    assert what == {"batch_size": [16, 64], "online_iter": [1, 3]}
    assert scale_training(2.5, parts, protocol, protocol)[:2] == (2.5, parts)


def test_a_plan_says_what_it_does_and_what_it_scaled(tmp_path, capsys):
    argv = [*TINY, "--methods", "l2p,dualprompt", "--datasets", "synthetic", "--online-iter", "3", "--plan",
            "--output", str(tmp_path)]
    assert cross_ablation.main(argv) == 0
    captured = capsys.readouterr()
    steps = [line.split(" ...")[0] for line in captured.err.splitlines() if line.endswith("...")]
    assert steps[0].startswith("plan: checking") and steps[1].startswith("counting the work of")
    assert any(step.startswith("probing l2p on synthetic") for step in steps)
    assert "  training 1 stream batch(es) of 4 images, 1 iteration(s) each" in steps  # no warm-up batch on a CPU
    assert "scaled: the probe trained batches of 4 images with 1 online iteration(s)" in captured.out
    document = json.loads((tmp_path / "plan.json").read_text())
    assert {probe["scaled"]["online_iter"][1] for probe in document["probes"]} == {3}
