"""The studies with points and ``--sweep NAME=v1,...``: every value checked by its setting's rule before any
work, one folder of run files and one table row per value, the paper's numbers beside; and the EMA-decay
study's subsets of heads scored on one training."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

pytest.importorskip("timm")

from cli_errors import one_line_error  # noqa: E402
from tiny_sweep import TINY  # noqa: E402

from benchmarks import cross_ablation  # noqa: E402
from benchmarks.ablation.runner import run_training  # noqa: E402
from benchmarks.core.protocol import Protocol  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.studies import registry  # noqa: E402
from benchmarks.studies.paper_numbers import SWEEPS  # noqa: E402
from benchmarks.studies.registry import REGISTRY  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("flag,expected", [
    ("M=16,-3", "M=-3: expansion_dim"),
    ("lambda=0,1e4", "lambda=0: ridge"),
    ("decays=0.9/1.5", "decays=0.9/1.5"),
    ("mask=none,sometimes", "mask=sometimes: train_mask: expected one of method, none, random, seen, batch"),
    ("r_D=0.5,2", "r_D=2: expected a number in [0, 1]"),
    ("experts=0", "experts=0: "),
    ("M=16,16", "M: 16 is given twice in '16,16'"),
    ("lambda=1e4,10000", "lambda: 1e4 and 10000 are one value"),  # compared as parsed, not as typed
    ("decays=0.9/0.99,0.90/0.990", "decays: 0.9/0.99 and 0.90/0.990 are one value"),
    ("M=", "expected comma-separated values"),
    ("M", "expected NAME=v1,v2,..."),
    ("width=3", "'width' is no protocol setting; expected one of M, lambda"),
    ("model_kwargs={}", "takes a JSON object"),
])
def test_a_bad_sweep_is_one_line_before_any_work(capsys, no_work, flag, expected):
    err = one_line_error(capsys, cross_ablation.main, [*TINY, "--sweep", flag])
    assert err.startswith("error: argument --sweep: ") and expected in err, err


def test_help_lists_every_registered_study(capsys):
    with pytest.raises(SystemExit) as exit:
        cross_ablation.main(["--help"])
    assert exit.value.code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert all(f"{name}: " in printed for name in REGISTRY), printed
    assert "--sweep NAME=v1,v2,..." in printed and "--expert-schedule" in printed and "--train-mask" in printed


def test_a_swept_setting_given_twice_or_a_study_of_points_is_refused(capsys, no_work):
    err = one_line_error(capsys, cross_ablation.main, [*TINY, "--expansion-dim", "8", "--sweep", "M=16,32"])
    assert "--expansion-dim is what the sweep_expansion_dim study varies" in err
    err = one_line_error(capsys, cross_ablation.main, [*TINY, "--study", "masks", "--sweep", "M=16,32"])
    assert "--study masks sets its own points" in err
    err = one_line_error(capsys, cross_ablation.main, [*TINY, "--methods", "l2p", "--sweep", "schedule=budget,session"])
    assert "point budget: --expert-schedule budget: l2p starts its experts at session starts" in err


def test_a_sweep_writes_each_value_into_its_own_runs_and_one_table_row(tmp_path, capsys):
    output = tmp_path / "m"
    argv = [*TINY, "--variants", "router", "--sweep", "M=16,32", "--output", str(output)]
    assert cross_ablation.main(argv) == 0
    for value in (16, 32):
        (path,) = (output / "sweep" / f"expansion_dim={value}" / "runs").glob("**/*.json")
        assert json.loads(path.read_text())["protocol"]["expansion_dim"] == value
    rows = json.loads((output / "sweep_expansion_dim.json").read_text())
    assert [(row["point"], row["setting"], row["method"], row["seeds"]) for row in rows] == [
        ("16", {"expansion_dim": "16"}, "l2p", 1), ("32", {"expansion_dim": "32"}, "l2p", 1)]
    assert "| 16 | synthetic | l2p | router | 1 |" in (output / "sweep_expansion_dim.md").read_text()
    assert cross_ablation.main(argv) == 0  # rerun: every value's runs are reused
    assert "1 already finished" in capsys.readouterr().out


def test_every_point_of_a_study_with_a_paper_table_has_the_papers_row():
    for name in ("ratios", "masks", "tasks_experts"):
        labels = {point.label for point in REGISTRY[name].points}
        assert labels == set(SWEEPS[name]["sup21k"]), name
    assert set(SWEEPS["decays"]["sup21k"]) == set(dict(REGISTRY["decays"].scored)["heads"])
    assert SWEEPS["tasks_experts"]["sup21k"]["10 tasks, 5 experts (self-triggered)"]["misa"]["cifar100"] == [76.25, 80.62]
    assert SWEEPS["masks"]["sup21k"]["random"]["l2p"]["imagenet-r"] == [33.10, 24.73]


@pytest.mark.parametrize("name,methods,first", [
    ("masks", "mvp", 2), ("ratios", "flyprompt", 2), ("tasks_experts", "misa", 2), ("rear_lambda", "dualprompt", 2),
    ("rear_m", "flyprompt", 2),
])
def test_each_study_of_points_runs_on_a_tiny_setting(tmp_path, monkeypatch, name, methods, first):
    """The study's first points (all of them are the same code path), on the tiny sweep."""
    monkeypatch.setitem(registry.REGISTRY, name, replace(REGISTRY[name], points=REGISTRY[name].points[:first]))
    argv = [*TINY, "--methods", methods, "--variants", "baseline", "--synthetic-train-per-class", "8",
            "--output", str(tmp_path)]
    argv = [a for i, a in enumerate(argv) if a not in ("--num-sessions", "--num-experts")
            and argv[i - 1] not in ("--num-sessions", "--num-experts")] if name == "tasks_experts" else argv
    if name.startswith("rear"):
        argv += ["--expansion-dim", "16"] if name == "rear_lambda" else []
        argv[argv.index("--variants") + 1] = "router"
    assert cross_ablation.main([*argv, "--study", name]) == 0
    rows = json.loads((tmp_path / f"study_{name}.json").read_text())
    assert [row["point"] for row in rows] == [point.label for point in REGISTRY[name].points[:first]]
    for row, point in zip(rows, REGISTRY[name].points):
        recorded = row["protocol"]
        for field, text in point.changes:
            assert str(recorded[field]) == text or float(recorded[field]) == float(text), (field, recorded[field])
        if name in SWEEPS:
            assert row["paper_A_auc"] == SWEEPS[name]["sup21k"][point.label][methods][row["paper_dataset"]][0]


def test_the_decay_subsets_are_scored_on_one_training():
    data = make_synthetic_train_test(4, train_per_class=10, test_per_class=3, seed=0, image_size=32)
    protocol = Protocol(
        model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2),
        pretrained=False, image_size=32, batch_size=8, online_iter=1, eval_period=16, test_batch_size=16,
        num_experts=2, num_sessions=2, expansion_dim=32, ridge=1e2, amp=False, decays=(0.9, 0.99, 0.999),
    )
    heads = ["online", "0.9/0.99/0.999", "0.9/0.99", "0.999"]
    plain = run_training("dualprompt", "synthetic", 1, ["ensemble"], protocol, *data, device=CPU)["ensemble"]
    scored = run_training("dualprompt", "synthetic", 1, ["ensemble"], protocol, *data, device=CPU, heads=heads)["ensemble"]
    assert json.dumps(scored["metrics"]) == json.dumps(plain["metrics"])  # scoring subsets changes nothing else
    subsets = scored["diagnostics"]["heads"]
    assert list(subsets) == heads
    members = scored["diagnostics"]["members"]
    assert subsets["online"]["A_auc"] == pytest.approx(members["online"]["A_auc"])  # the online head alone
    assert subsets["0.9/0.99/0.999"]["A_auc"] == pytest.approx(scored["metrics"]["A_auc"])  # all: the run's own
    two = Protocol(**{**protocol.__dict__, "decays": (0.9, 0.99)})
    trained_with_two = run_training("dualprompt", "synthetic", 1, ["ensemble"], two, *data, device=CPU)["ensemble"]
    assert subsets["0.9/0.99"]["A_auc"] == pytest.approx(trained_with_two["metrics"]["A_auc"])  # = its own training
    with pytest.raises(ValueError, match="no EMA copy of decay 0.5"):
        run_training("dualprompt", "synthetic", 1, ["ensemble"], protocol, *data, device=CPU, heads=["0.5"])


def test_the_decays_study_writes_its_table_beside_the_papers(tmp_path):
    argv = [*TINY, "--methods", "dualprompt", "--variants", "ensemble", "--study", "decays", "--output", str(tmp_path)]
    assert cross_ablation.main(argv) == 0
    rows = json.loads((tmp_path / "study_decays.json").read_text())
    assert [row["head"] for row in rows] == list(dict(REGISTRY["decays"].scored)["heads"])
    assert all(row["paper_A_auc"] == SWEEPS["decays"]["sup21k"][row["head"]]["flyprompt"]["cifar100"][0] for row in rows)
    (result,) = (tmp_path / "runs").glob("**/*.json")
    assert json.loads(result.read_text())["protocol"]["decays"] == [0.9, 0.99, 0.999]  # the study's fixed decays
