"""The cost of a sweep: the evaluation's reuse is exact, the plan counts what a run does, the probe
measures it, and --shard/--merge split a sweep over several processes and rebuild its tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks.ablation import cli as cross_ablation
from benchmarks.ablation import evaluation, execution, plan, shard
from benchmarks.ablation.probe import probe
from benchmarks.ablation.runner import run_training
from benchmarks.core.plan_file import PLAN_FORMAT
from benchmarks.core.presets import PRESETS
from benchmarks.core.protocol import RunSpec
from benchmarks.core.timer import PartTimer
from benchmarks.data import make_synthetic_train_test

REPO = Path(__file__).resolve().parents[1]
REDUCED = [
    "--synthetic-classes", "6", "--synthetic-train-per-class", "12", "--synthetic-test-per-class", "4",
    "--batch-size", "12", "--online-iter", "1", "--eval-period", "30", "--expansion-dim", "64",
    "--no-progress",
]
VARIANTS = ["baseline", "router", "ensemble", "both", "oracle", "oracle_both"]


@pytest.fixture(scope="module")
def data():
    return make_synthetic_train_test(6, train_per_class=12, test_per_class=4, seed=0, image_size=32)


def _protocol(**changes):
    base = PRESETS["proxy-short"]["protocol"]
    return replace(base, batch_size=12, online_iter=1, eval_period=30, expansion_dim=64, **changes)


def _scores(records):
    """Everything a run's records say about accuracy and routing (timings left out)."""
    return {name: {"log": r["log"], "metrics": r["metrics"], "paper": r["metrics_paper"], "diagnostics": r["diagnostics"]}
            for name, r in records.items()}


@pytest.mark.parametrize("method", ["l2p", "mvp", "hide", "flyprompt"])
def test_reused_test_features_and_passes_give_the_same_logs(method, data, monkeypatch):
    # Every reuse is of the same computation on the same batch: equal bit for bit on any machine.
    protocol = _protocol(test_batch_size=5)
    train, test = data
    variants = ["full", "oracle", "oracle_both"] if method == "flyprompt" else VARIANTS
    fast = run_training(method, "synthetic", 1, variants, protocol, train, test, device=torch.device("cpu"))
    # reuse=False: a query pass per batch, every prompted pass made, the test images read and transformed
    # by the dataset record at every evaluation (the evaluation before the reuse).
    original = evaluation.VariantEvaluator.__init__
    monkeypatch.setattr(evaluation.VariantEvaluator, "__init__",
                        lambda self, *a, **k: original(self, *a, **{**k, "reuse": False}))
    reference = run_training(method, "synthetic", 1, variants, protocol, train, test, device=torch.device("cpu"))
    assert _scores(fast) == _scores(reference)


def test_frozen_features_are_computed_once_per_test_image(data, monkeypatch):
    from benchmarks.methods.l2p import L2P

    train, test = data
    rows = []
    original = L2P.frozen_features
    monkeypatch.setattr(L2P, "frozen_features", lambda self, x: rows.append(len(x)) or original(self, x))
    records = run_training("l2p", "synthetic", 1, VARIANTS, _protocol(), train, test, device=torch.device("cpu"))
    log = records["baseline"]["log"]["records"]
    assert len(log) > 2
    # Training: the online iteration's query pass and the clean router pass over every stream sample;
    # evaluation: only the subsets that changed since the previous evaluation (a class was exposed).
    changed = [sum(e["total"]) for i, e in enumerate(log) if i == 0 or len(e["total"]) != len(log[i - 1]["total"])]
    assert len(changed) < len(log)
    assert sum(rows) == 2 * records["baseline"]["stream_length"] + sum(changed)


def test_plan_counts_what_a_run_does(data):
    train, test = data
    protocol = _protocol()
    records = run_training("dualprompt", "synthetic", 2, VARIANTS, protocol, train, test, device=torch.device("cpu"))
    record = records["both"]
    specs = [RunSpec("dualprompt", v, "synthetic", 2) for v in VARIANTS]
    (work,) = plan.count_work(specs, protocol, lambda name: (train, test))
    log = record["log"]["records"]
    assert work.batches == record["num_batches"]
    assert work.evaluations == len(log)
    assert work.eval_images == sum(sum(entry["total"]) for entry in log)
    assert work.final_images == sum(log[-1]["total"])
    assert work.query_images == sum(sum(e["total"]) for i, e in enumerate(log)
                                    if i == 0 or len(e["total"]) != len(log[i - 1]["total"]))
    assert work.selections == 3 and work.key == "synthetic/dualprompt/seed2"


def test_probe_measures_training_and_evaluation_by_part(data):
    train, test = data
    unit = probe("hide", "synthetic", VARIANTS, _protocol(), train, test, device=torch.device("cpu"), batches=2,
                 eval_samples=10)
    assert unit["batches"] == 2 and unit["eval_images"] == 10 and unit["splits_query"]
    assert unit["per_batch"] > 0 and unit["prompted_per_image"] > 0 and unit["frozen_per_image"] > 0
    assert {"train/data", "train/steps", "train/router_query", "train/batch_end"} <= set(unit["train_parts"])
    assert sum(unit["train_parts"].values()) <= unit["per_batch"]
    assert {"eval/images", "eval/query", "eval/scoring", "eval/counts"} <= set(unit["eval_parts"])
    assert 1 <= unit["prompted_passes"] <= 3  # own, routed, oracle at most; equal selections share a pass
    cost = plan.estimate(plan.TrainingWork("synthetic", "hide", 1, VARIANTS, 10, 4, 60, 36, 24, 5, 3), unit)
    assert cost["ours"] == pytest.approx(cost["build"] + cost["train"] + cost["evaluation"])
    assert cost["per_variant"] > cost["train"] * len(VARIANTS)


def test_part_timer_refuses_nested_parts():
    timer = PartTimer()
    with timer("a"):
        with pytest.raises(RuntimeError, match="must not nest"):
            with timer("b"):
                pass
    assert timer.summary()["a"]["calls"] == 1


# --------------------------------------------------------------------------------------------- shards
def test_split_is_deterministic_complete_and_balanced():
    keys = [f"d/m{i}/seed{s}" for i in range(7) for s in range(5)]
    costs = {key: float(1 + (hash(key) % 1) + 3 * (int(key[3]) % 3) + int(key[-1])) for key in keys}
    parts = shard.split(keys, costs, 4)
    assert parts == shard.split(list(keys), dict(reversed(list(costs.items()))), 4)
    assert sorted(k for part in parts for k in part) == sorted(keys)
    loads = [sum(costs[k] for k in part) for part in parts]
    assert max(loads) - min(loads) <= max(costs.values())
    assert all(part == [k for k in keys if k in part] for part in parts)  # sweep order inside a part
    assert shard.split(keys, costs, 1) == [keys]


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "1/2/3"])
def test_bad_shards_are_usage_errors(text, capsys):
    assert cross_ablation.main(["--shard", text, "--output", "/nonexistent"]) == 2
    assert "--shard: expected K/N with 1 <= K <= N" in capsys.readouterr().err


def test_plan_shards_and_merge_in_several_processes(tmp_path, capsys):
    """--plan writes the estimates, two shard processes split the trainings between them by those,
    --merge makes the tables: the same results as one process running the whole sweep."""
    sweep = [*REDUCED, "--methods", "l2p,mvp,hide", "--seeds", "1,2", "--variants", "baseline,both"]
    output = tmp_path / "sharded"
    assert cross_ablation.main([*sweep, "--output", str(output), "--plan"]) == 0
    printed = capsys.readouterr().out
    document = json.loads((output / "plan.json").read_text())
    assert len(document["trainings"]) == 6 and document["results"] == 12 and len(document["probes"]) == 3
    assert "estimated device time" in printed and "| cifar100-like | hide | 2 |" in printed

    assert cross_ablation.main([*sweep, "--output", str(output), "--merge"]) == 2
    assert "12 of 12 results are missing" in capsys.readouterr().err

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    jobs = [subprocess.Popen([sys.executable, "benchmarks/cross_ablation.py", *sweep, "--output", str(output),
                              "--shard", f"{k}/2"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for k in (1, 2)]
    outputs = [job.communicate(timeout=600) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], outputs
    trained = [sorted(line.split(":")[0] for line in out.splitlines() if "A_auc" in line) for out, _ in outputs]
    assert all(trained) and not set(trained[0]) & set(trained[1])
    assert sorted(trained[0] + trained[1]) == sorted(f"cifar100-like/{m}/{v}/seed{s}" for m in ("l2p", "mvp", "hide")
                                                     for v in ("baseline", "both") for s in (1, 2))
    assert all("balanced by the estimates of plan.json" in out for out, _ in outputs)
    assert all("--merge" in out.splitlines()[-1] for out, _ in outputs)
    assert not (output / "table.json").exists()

    assert cross_ablation.main([*sweep, "--output", str(output), "--merge"]) == 0
    rows = json.loads((output / "table.json").read_text())
    assert len(rows) == 6

    whole = tmp_path / "whole"
    assert cross_ablation.main([*sweep, "--output", str(whole), "--methods", "hide"]) == 0
    for seed in (1, 2):
        for name in ("baseline", "both"):
            a = json.loads((output / "runs" / "cifar100-like" / "hide" / name / f"seed{seed}.json").read_text())
            b = json.loads((whole / "runs" / "cifar100-like" / "hide" / name / f"seed{seed}.json").read_text())
            assert a["log"] == b["log"] and a["diagnostics"] == b["diagnostics"]


def test_shard_without_a_plan_balances_counted_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(execution, "run_training", lambda *a, **k: pytest.fail("nothing to train"))
    output = tmp_path / "out"
    sweep = [*REDUCED, "--methods", "l2p", "--seeds", "1", "--output", str(output)]
    # One training and two shards: the second has nothing to do.
    assert cross_ablation.main([*sweep, "--shard", "2/2"]) == 0
    assert "0 of 1 trainings, balanced by counted work (no plan.json" in capsys.readouterr().out
    other = {"format": PLAN_FORMAT, "protocol": {"test_batch_size": 1}, "trainings": [], "probes": [],
             "total_seconds": {"ours": 0.0}}
    (output / "plan.json").write_text(json.dumps(other))
    assert cross_ablation.main([*sweep, "--shard", "1/2"]) == 2
    assert "was made for another protocol" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ GPU check
def test_paper_cost_check_runs_tiny_on_the_cpu(tmp_path):
    """The GPU cost check end to end at toy sizes (two methods: FlyPrompt and one with added components)."""
    from benchmarks.gpu import paper_cost

    output = tmp_path / "cost"
    assert paper_cost.main(["--device", "cpu", "--tiny", "--methods", "hide,flyprompt", "--output", str(output)]) == 0
    document = json.loads((output / "paper_cost.json").read_text())
    assert document["errors"] == {} and document["skipped"] == []
    assert set(document["probes"]) == set(document["sweep"]) == {"hide", "flyprompt"}
    assert all(result["logs_identical"] for result in document["sweep"].values())
    table = document["paper_table"]
    assert table["methods"] == ["hide", "flyprompt"] and not table["complete"]
    assert table["trainings"] == 3 * 2 * 5  # datasets x methods x seeds
    assert table["total_seconds"]["per_variant"] > table["total_seconds"]["train"]
    assert "| imagenet-r | flyprompt | 5 |" in (output / "paper_table_plan.md").read_text()


def test_paper_cost_check_refuses_unknown_methods(capsys):
    from benchmarks.gpu import paper_cost

    with pytest.raises(SystemExit):
        paper_cost.parse_args(["--output", "x", "--methods", "bogus"])
    assert "--methods: expected names from l2p" in capsys.readouterr().err
