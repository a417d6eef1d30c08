"""The cross-ablation CLI: an end-to-end reduced run, resume, atomic writes, and the table arithmetic."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import torch

from benchmarks.ablation import cli as cross_ablation
from benchmarks.ablation import execution, report
from benchmarks.ablation.arguments import PROTOCOL_FLAGS
from benchmarks.core import results
from benchmarks.core.method_names import METHOD_NAMES
from benchmarks.core.presets import PRESETS
from benchmarks.core.protocol import PAPER_METHODS
from benchmarks.core.variants import ORACLE_VARIANTS

REDUCED = [
    "--synthetic-classes", "6", "--synthetic-train-per-class", "12", "--synthetic-test-per-class", "4",
    "--batch-size", "12", "--online-iter", "1", "--eval-period", "30", "--expansion-dim", "64",
    "--no-progress",
]


def test_cpu_default_end_to_end_and_resume(tmp_path, monkeypatch, capsys):
    output = tmp_path / "out"
    assert cross_ablation.main([*REDUCED, "--output", str(output)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "no --misa-prompts" not in captured.err  # the proxy's MISA loads its pretrained prompts, and says so
    misa = json.loads((output / "runs" / "cifar100-like" / "misa" / "baseline" / "seed1.json").read_text())
    assert "pretrained prompts loaded from proxy_misa_prompts.safetensors" in misa["notes"]
    rows = json.loads((output / "table.json").read_text())
    # six methods x (four ablation + two oracle variants), plus FlyPrompt (router and ensemble built in)
    # as 'full' and its two oracle variants
    variants = (*report.ABLATION_VARIANTS, *ORACLE_VARIANTS)
    assert len(rows) == 39
    assert {(r["method"], r["variant"]) for r in rows} == {
        (m, v) for m in PAPER_METHODS for v in variants
    } | {("flyprompt", v) for v in ("full", *ORACLE_VARIANTS)}
    check_rows_against_run_files(output, rows)
    check_table_files(output, rows, printed)
    calls = check_resume_recomputes_only_missing_runs(output, rows, monkeypatch)
    check_other_settings_are_refused_or_reused(output, calls, capsys)


def check_rows_against_run_files(output, rows):
    """Each row of the table is its run file's numbers, in percent."""
    for row in rows:  # the table in percent, from the run files (fractions)
        run = json.loads((output / "runs" / "cifar100-like" / row["method"] / row["variant"] / "seed1.json").read_text())
        routing = run["diagnostics"]["routing"]
        assert (row["A_auc_mean"], row["A_last_mean"]) == pytest.approx(
            (100 * run["metrics"]["A_auc"], 100 * run["metrics"]["A_last"]))
        assert (row["routing_own_modal_last"], row["routing_chance_modal_last"]) == pytest.approx(
            (100 * routing["own"]["modal"]["last"], 100 * routing["chance"]["modal"]["last"]))
        if row["variant"] == "baseline" or row["method"] == "flyprompt":  # FlyPrompt has no baseline row
            assert row["A_auc_delta"] is None
        else:
            assert math.isfinite(row["A_auc_delta"])
        assert (row["member_ensemble_A_auc"] is None) == (row["variant"] in ("baseline", "router", "oracle"))
    assert [r["method"] for r in rows][::6][:6] == list(PAPER_METHODS) and rows[-1]["method"] == "flyprompt"


def check_table_files(output, rows, printed):
    """The figures, the CSV and the markdown table (printed too) hold what table.json holds."""
    assert (output / "deltas.png").stat().st_size > 0
    assert all(path.stat().st_mode & 0o777 == 0o644 for path in (output / "runs").glob("**/*.json"))
    assert (output / "curves.png").stat().st_size > 0
    with open(output / "table.csv") as stream:
        csv_rows = list(csv.DictReader(stream))
    assert [(r["method"], r["variant"], float(r["A_auc_mean"])) for r in csv_rows] == [
        (r["method"], r["variant"], r["A_auc_mean"]) for r in rows
    ]
    markdown = (output / "table.md").read_text()
    assert markdown.strip() in printed
    for row in rows:
        name = METHOD_NAMES[row["method"]]
        assert f"| {name} | {row['variant']} | 1 | {row['A_auc_mean']:.2f} ± n/a |" in markdown
    assert markdown.startswith("smoke-level numbers")
    for method in PAPER_METHODS:  # the verdict under the table
        assert re.search(rf"^{METHOD_NAMES[method]} \(cifar100-like\): (oracle gap|no gap)", markdown, re.MULTILINE)


def check_resume_recomputes_only_missing_runs(output, rows, monkeypatch):
    """A rerun recomputes only the deleted runs; returns the list that records every training from here on."""
    # A killed sweep loses only its missing runs: delete two results, rerun, only those are recomputed.
    (output / "runs" / "cifar100-like" / "mvp" / "router" / "seed1.json").unlink()
    (output / "runs" / "cifar100-like" / "hide" / "both" / "seed1.json").unlink()
    calls = []
    original = execution.run_training

    def recording(method, dataset, seed, variants, *args, **kwargs):
        calls.extend(f"{dataset}/{method}/{variant}/seed{seed}" for variant in variants)
        return original(method, dataset, seed, variants, *args, **kwargs)

    monkeypatch.setattr(execution, "run_training", recording)
    assert cross_ablation.main([*REDUCED, "--output", str(output)]) == 0
    assert sorted(calls) == ["cifar100-like/hide/both/seed1", "cifar100-like/mvp/router/seed1"]
    def metrics_only(table):
        return [{k: v for k, v in r.items() if k not in ("seconds_per_batch", "peak_memory_mb")} for r in table]

    assert metrics_only(json.loads((output / "table.json").read_text())) == metrics_only(rows)  # deterministic
    return calls


def check_other_settings_are_refused_or_reused(output, calls, capsys):
    """Finished runs of another setting are refused (exit 2); another method's options do not count."""
    # Finished runs of another protocol or dataset are never mixed into the table.
    calls.clear()
    for changed in (["--lr", "0.5"], ["--synthetic-test-per-class", "5"]):
        capsys.readouterr()
        assert cross_ablation.main([*REDUCED, *changed, "--output", str(output)]) == 2
        error = capsys.readouterr().err
        assert re.fullmatch(r"error: .*another setting .*--no-resume.*\n", error), error
    assert calls == []
    # Another method's keyword arguments do not decide a run's numbers: its finished runs are reused; its own do.
    kept = {"mvp": {"reference_quirks": True}, "hide": {"router_features": "g_mlp"}}  # the preset's for these two
    others = ["--methods", "mvp,hide", "--method-kwargs", json.dumps({**kept, "l2p": {"pool_size": 7}})]
    assert cross_ablation.main([*REDUCED, *others, "--output", str(output)]) == 0 and calls == []
    own = ["--methods", "mvp,hide", "--method-kwargs", json.dumps({**kept, "mvp": {}})]
    assert cross_ablation.main([*REDUCED, *own, "--output", str(output)]) == 2 and calls == []
    assert "method_kwargs: {'mvp': {'reference_quirks': True}} -> {'mvp': {}}" in capsys.readouterr().err


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "runs" / "x.json"
    with pytest.raises(TypeError):
        results.write_json_atomic(target, {"bad": object()})
    assert not target.exists() and list(target.parent.iterdir()) == []


def fake_result(method, variant, seed, a_auc, a_last):
    metrics = {"A_auc": a_auc, "A_last": a_last, "A_avg": 0.5, "F_last": 0.1}
    return {"spec": {"method": method, "variant": variant, "dataset": "d", "seed": seed}, "metrics": metrics,
            "seconds_per_batch": 0.01, "peak_memory_mb": 100.0 + seed}


def test_table_means_stds_and_deltas_on_fixed_results():
    results = [
        fake_result("dualprompt", "baseline", 1, 0.70, 0.60),
        fake_result("dualprompt", "baseline", 2, 0.80, 0.64),
        fake_result("dualprompt", "router", 1, 0.75, 0.70),
        fake_result("dualprompt", "router", 2, 0.85, 0.72),
    ]
    rows = report.summarize_results(results)
    assert [(r["method"], r["variant"]) for r in rows] == [("dualprompt", "baseline"), ("dualprompt", "router")]
    base, router = rows
    assert base["A_auc_mean"] == pytest.approx(75.0) and base["A_auc_std"] == pytest.approx(math.sqrt(50.0))
    assert router["A_last_mean"] == pytest.approx(71.0) and router["A_last_std"] == pytest.approx(math.sqrt(2.0))
    assert router["A_auc_delta"] == pytest.approx(5.0) and router["A_last_delta"] == pytest.approx(9.0)
    assert router["peak_memory_mb"] == 102.0
    markdown = report.format_markdown(rows)
    assert "| d | DualPrompt | router | 2 | 80.00 ± 7.07 | +5.00 | 80.63 | +4.59 | 71.00 ± 1.41 | +9.00 |" in markdown


def test_help_documents_every_protocol_setting(capsys):
    with pytest.raises(SystemExit):
        cross_ablation.main(["--help"])
    text = capsys.readouterr().out
    for name in PROTOCOL_FLAGS:
        assert f"--{name.replace('_', '-')}" in text
    assert "(default: None)" not in text and "proxy-short" in text


@pytest.mark.distributed
def test_torchrun_with_two_gloo_processes_matches_one_process(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # A fixed ridge: the generalised cross-validation choice is discrete, so rounding could change it.
    args = [*REDUCED, "--methods", "mvp,hide,l2p,flyprompt", "--variants", "both", "--ridge", "1e4"]
    single, parallel = tmp_path / "one", tmp_path / "two"
    assert cross_ablation.main([*args, "--output", str(single)]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(port), "benchmarks/cross_ablation.py", *args, "--output", str(parallel),
    ]
    done = subprocess.run(command, cwd=Path(__file__).resolve().parents[1], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted((single / "runs").glob("**/*.json"))
    assert len(files) == 4
    for path in files:
        one = json.loads(path.read_text())
        two = json.loads((parallel / path.relative_to(single)).read_text())
        assert two["world_size"] == 2
        # Same evaluations of the same test samples. Two processes sum the statistics in another order, which
        # may flip a near-tie prediction on some CPU: a few samples of slack, far below what a wrong shard,
        # a lost batch or unsynchronised statistics would change.
        records_one, records_two = one["log"]["records"], two["log"]["records"]
        assert [r["total"] for r in records_two] == [r["total"] for r in records_one]
        flipped = sum(abs(a - b) for r1, r2 in zip(records_one, records_two)
                      for a, b in zip(r1["correct"], r2["correct"]))
        assert flipped <= 0.02 * sum(sum(r["total"]) for r in records_one), path
        assert two["metrics"] == pytest.approx(one["metrics"], abs=0.02, nan_ok=True)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--datasets", "cifar100"], "CIFAR-100 was not found"),
        (["--pretrained", "true", "--weights", "/nonexistent/vit.safetensors"], "--weights: no such file"),
    ],
)
def test_missing_data_or_weights_give_one_clear_error(tmp_path, flags, message):
    import subprocess
    import sys

    command = [sys.executable, "benchmarks/cross_ablation.py", *REDUCED, "--methods", "l2p", "--variants", "baseline",
               "--data-root", str(tmp_path / "data"), "--output", str(tmp_path / "out"), *flags]
    done = subprocess.run(command, cwd=Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def _router_inputs(tmp_path, monkeypatch, *flags):
    """The features every AnalyticRouter.update received during a reduced FlyPrompt + DualPrompt run."""
    from fly_modules import AnalyticRouter

    seen = []
    original = AnalyticRouter.update
    monkeypatch.setattr(AnalyticRouter, "update", lambda self, f, e: seen.append(f.detach().clone()) or original(self, f, e))
    output = tmp_path / "-".join(flags)
    args = [*REDUCED, "--methods", "flyprompt,dualprompt", "--variants", "router", *flags, "--output", str(output)]
    assert cross_ablation.main(args) == 0
    monkeypatch.setattr(AnalyticRouter, "update", original)
    return seen


def test_router_query_clean_is_the_unaugmented_batch(tmp_path, monkeypatch):
    def inputs(mode, augment):
        return _router_inputs(tmp_path, monkeypatch, "--router-query", mode, "--augment", augment)

    # The router features are the frozen, prompt-free backbone's, so whatever the training did, the
    # clean pass of an augmented run must see exactly what an un-augmented run's query pass saw.
    unaugmented = inputs("first_iteration", "false")
    clean, first = inputs("clean", "true"), inputs("first_iteration", "true")
    assert len(clean) == len(first) == len(unaugmented) > 0
    assert all(torch.equal(a, b) for a, b in zip(clean, unaugmented))
    assert not any(torch.equal(a, b) for a, b in zip(first, unaugmented))  # augmented features differ
    assert all(torch.equal(a, b) for a, b in zip(inputs("clean", "false"), unaugmented))  # no second pass needed
    assert cross_ablation.main([*REDUCED, "--router-query", "augmented", "--output", str(tmp_path / "x")]) == 2


def test_paper_preset_keeps_the_reference_baselines():
    """The paper preset's method settings exist and select the reference behaviour (docs/protocol.md §4)."""
    import timm

    from benchmarks.methods.base import create_method

    kwargs = PRESETS["paper"]["protocol"].method_kwargs
    assert PRESETS["paper"]["protocol"].router_query == "clean"
    backbone = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, patch_size=8,
                                 embed_dim=48, depth=4, num_heads=3)
    for name in PAPER_METHODS:
        extra = {}
        if name == "misa":  # MISA takes its (pretrained) prompts; any of the right shape do here
            shapes = create_method("dualprompt", backbone, 10, num_experts=5, g_prompt_length=10)
            extra = {"g_prompt": shapes.g_prompts.detach().clone(), "e_prompt": shapes.e_prompts.detach().clone()}
        method = create_method(name, backbone, 10, num_experts=5, **kwargs.get(name, {}), **extra)
        for option, value in kwargs.get(name, {}).items():
            assert getattr(method, option) == value, (name, option)


def test_verdicts_share_out_only_a_gap_worth_measuring():
    def rows(baseline, router, oracle):
        return [{"dataset": "d", "method": "dualprompt", "variant": v, "A_auc_mean": a}
                for v, a in (("baseline", baseline), ("router", router), ("oracle", oracle))]

    assert report.verdicts(rows(80.0, 82.0, 84.0)) == [
        "DualPrompt (d): oracle gap 4.00 points; REAR recovers 50% of it"]
    assert report.verdicts(rows(80.0, 70.0, 80.13)) == [
        "DualPrompt (d): oracle gap 0.13 points, too small to measure a share of it; REAR -10.00 points"]
    assert report.verdicts(rows(80.0, 79.0, 79.5)) == [
        "DualPrompt (d): no gap (oracle - baseline A_auc -0.50 points): no router can gain here; REAR -1.00 points"]
