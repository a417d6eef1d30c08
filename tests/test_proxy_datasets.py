"""The proxy's datasets in the paper's three shapes: classes per session, images by the stated rule, class ranges
the backbone never saw, and the command line that selects them."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.ablation import cli as cross_ablation
from benchmarks.ablation.sweep import resolve
from benchmarks.ablation.sweep_data import load_data
from benchmarks.core.dataset_sizes import DATASET_SIZES
from benchmarks.core.presets import PRESETS
from benchmarks.core.proxy_datasets import (
    PROXY_DATASETS,
    PROXY_SCALE,
    PROXY_TEST_SCALE,
    is_generated,
    paper_dataset_of,
)

SIDECAR = Path(__file__).resolve().parents[1] / "benchmarks" / "proxy" / "weights" / "proxy_vit.json"


def test_each_proxy_dataset_has_its_paper_datasets_classes_per_session():
    sessions = PRESETS["proxy"]["protocol"].num_sessions
    per_session = {name: dataset.settings()["num_classes"] // sessions for name, dataset in PROXY_DATASETS.items()}
    assert per_session == {"cifar100-like": 20, "imagenet-r-like": 40, "cub-like": 40}
    assert {paper_dataset_of(name) for name in PROXY_DATASETS} == set(DATASET_SIZES)


def test_images_per_class_are_the_real_sets_scaled_by_one_rule():
    for dataset in PROXY_DATASETS.values():
        settings, real = dataset.settings(), DATASET_SIZES[dataset.stands_for]
        for key, total, factor in (("train_per_class", real.train, PROXY_SCALE),
                                   ("test_per_class", real.test, PROXY_TEST_SCALE)):
            assert abs(settings[key] - total / real.classes * factor) <= 0.5  # rounded
            assert settings[key] >= 1
    cifar = PROXY_DATASETS["cifar100-like"].settings()
    assert cifar["num_classes"] * cifar["train_per_class"] == 10_000  # the proxy's stream, as documented
    short = PRESETS["proxy-short"]["generated"]["cifar100-like"]
    assert short["num_classes"] == 100 and short["train_per_class"] < cifar["train_per_class"]


def test_proxy_class_ranges_are_disjoint_and_unseen_in_pretraining():
    pretrained = json.loads(SIDECAR.read_text())["data"]["upstream_class_ids"]
    ranges = [range(s["class_offset"], s["class_offset"] + s["num_classes"])
              for s in (d.settings() for d in PROXY_DATASETS.values())]
    for i, first in enumerate(ranges):
        assert first.start > pretrained[1]
        assert all(not set(first) & set(other) for other in ranges[i + 1:])


def _args(*argv):
    return cross_ablation.build_parser().parse_args(list(argv))


def test_datasets_flag_selects_a_proxy_shape_and_the_synthetic_flags_override_it():
    sweep = resolve(_args("--preset", "proxy", "--datasets", "imagenet-r-like,cub-like", "--output", "unused"))
    assert sweep.datasets == ["imagenet-r-like", "cub-like"]
    assert sweep.data["imagenet-r-like"] == PROXY_DATASETS["imagenet-r-like"].settings()
    small = resolve(_args("--preset", "cpu", "--datasets", "cub-like", "--synthetic-classes", "4",
                          "--synthetic-train-per-class", "3", "--synthetic-test-per-class", "2", "--output", "unused"))
    assert small.data["cub-like"] == dict(PROXY_DATASETS["cub-like"].settings(), num_classes=4, train_per_class=3,
                                          test_per_class=2)
    train, test = load_data("cub-like", small, "unused", False)
    assert (len(train), len(test)) == (12, 8)
    assert set(train.targets.tolist()) == set(range(4)) and is_generated("cub-like") and not is_generated("cifar100")


def test_an_unknown_dataset_names_the_proxy_shapes(capsys):
    assert cross_ablation.main(["--datasets", "cifar10-like", "--output", "unused"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "cifar100-like" in error[0] and "cub-like" in error[0]
