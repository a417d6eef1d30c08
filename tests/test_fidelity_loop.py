"""benchmarks.fidelity.loop on the stand-in checkout: the official trainer's own loop (its sampler, its
evaluation rule, its summary) against the cross-ablation's runner, and a difference in either seen."""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import pytest

pytest.importorskip("timm")

from fidelity_stand_in import FAKE_FLYGCL as FAKE  # noqa: E402
from fidelity_stand_in import SMALL  # noqa: E402

from benchmarks.ablation import training  # noqa: E402
from benchmarks.core import reference_checkout as ref  # noqa: E402
from benchmarks.core.metrics import AnytimeEvalTrigger  # noqa: E402
from benchmarks.fidelity import official_loop  # noqa: E402
from benchmarks.fidelity.loop import main  # noqa: E402
from benchmarks.fidelity.loop_comparison import LOOP_SETUPS, compare_loop  # noqa: E402
from benchmarks.fidelity.pairs import PAIRS  # noqa: E402


@pytest.fixture(scope="module")
def checkout():
    return ref.load_checkout(str(FAKE), ["l2p", "dualprompt", "mvp", "flyprompt", "hide"])


@pytest.mark.parametrize("method", ["dualprompt", "flyprompt", "hide-no-orth"])
def test_the_official_loop_and_the_runner_agree(checkout, method):
    row = compare_loop(checkout, PAIRS[method], SMALL, LOOP_SETUPS[method])
    assert row.stream == "equal"  # the stand-in's sampler, from the seed, is our stream batch for batch
    assert row.points_equal and row.accuracy_difference == 0.0, (row.official_points, row.our_points)
    assert sum(point.kind == "session_end" for point in row.our_points) == SMALL.num_sessions
    assert any(point.kind == "anytime" for point in row.our_points)
    assert row.weights_relative < 1e-5
    for name in ("A_auc", "A_last", "A_avg"):
        assert row.our_metrics[name] == pytest.approx(row.official_metrics[name], abs=1e-12)
    # F_last and BWT: the official per-class accuracies are float32; ours, divided in float32, are equal.
    assert row.our_float32["F_last"] == row.official_metrics["F_last"]
    assert row.our_float32["BWT"] == row.official_metrics["BWT_last"]
    assert row.our_metrics["F_last"] == pytest.approx(row.official_metrics["F_last"], abs=1e-6)


def test_the_classifier_alignment_drawn_from_another_state_is_seen(checkout):
    # HiDe-Prompt's session-end alignment draws random features: without the reseeding of both sides
    # (LoopSetup.session_end_seed, from the pair) the two loops part from the first session end on.
    unseeded = dataclasses.replace(PAIRS["hide-no-orth"], session_end_seed=None)
    row = compare_loop(checkout, unseeded, SMALL, LOOP_SETUPS["hide-no-orth"])
    assert row.stream == "equal" and row.weights_relative > 1e-3


def test_another_evaluation_period_on_the_official_side_is_seen(checkout, monkeypatch):
    def arguments(setting, *args, **kwargs):
        argv = original(setting, *args, **kwargs)
        argv[argv.index("--eval_period") + 1] = str(setting.eval_period + SMALL.batch_size)
        return argv

    original = official_loop.official_arguments
    monkeypatch.setattr(official_loop, "official_arguments", arguments)
    row = compare_loop(checkout, PAIRS["dualprompt"], SMALL)
    assert row.stream == "equal" and not row.points_equal and math.isnan(row.accuracy_difference)


def test_another_trigger_rule_in_the_runner_is_seen(checkout, monkeypatch):
    # Si-Blurry's rule evaluates once the mark is passed; the official one a batch before it is crossed.
    monkeypatch.setattr(training, "AnytimeEvalTrigger", functools.partial(AnytimeEvalTrigger, rule="sib"))
    row = compare_loop(checkout, PAIRS["dualprompt"], SMALL)
    assert row.stream == "equal" and not row.points_equal


def test_an_official_stream_of_another_seed_is_seen_and_ours_fed_to_it(checkout, monkeypatch):
    def arguments(setting, *args, **kwargs):
        argv = original(setting, *args, **kwargs)
        argv[argv.index("--seeds") + 1] = str(setting.seed + 1)
        return argv

    original = official_loop.official_arguments
    monkeypatch.setattr(official_loop, "official_arguments", arguments)
    row = compare_loop(checkout, PAIRS["dualprompt"], SMALL)
    assert row.stream == "fed ours: the official sampler's order differs"
    assert row.points_equal and row.accuracy_difference == 0.0


def test_the_command_writes_its_table_and_records(checkout, tmp_path, monkeypatch):
    monkeypatch.setattr("benchmarks.fidelity.loop.Setting", lambda: SMALL)
    out_json, out_md = tmp_path / "loop.json", tmp_path / "loop.md"
    assert main(["--flygcl", str(FAKE), "--methods", "l2p", "mvp", "--json", str(out_json),
                 "--markdown", str(out_md)]) == 0
    rows = json.loads(out_json.read_text())["rows"]
    assert [row["method"] for row in rows] == ["l2p", "mvp"]
    assert all(row["points_equal"] and row["stream"] == "equal" for row in rows)
    assert out_md.read_text().count("\n") == 4  # header, rule, two rows


def test_a_checkout_without_the_loops_files_is_a_one_line_error(tmp_path, capsys):
    # the stand-in's models and trainers, but no configuration/ (copied as links: nothing written there)
    for name in ("models", "methods", "utils"):
        (tmp_path / name).symlink_to(FAKE / name)
    assert main(["--flygcl", str(tmp_path), "--methods", "l2p"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "missing configuration/config.py, datasets/OnlineIterDataset.py" in error


def test_the_fidelity_command_runs_the_loop_too_with_loop(checkout, tmp_path, monkeypatch, capsys):
    from benchmarks.fidelity.cli import main as fidelity

    monkeypatch.setattr("benchmarks.fidelity.loop.Setting", lambda: SMALL)
    monkeypatch.setattr("benchmarks.fidelity.cli.Setting", lambda **options: dataclasses.replace(SMALL, **options))
    record, table = tmp_path / "rows.json", tmp_path / "table.md"
    assert fidelity(["--flygcl", str(FAKE), "--methods", "l2p", "--loop", "--json", str(record),
                     "--markdown", str(table)]) == 0
    loop = json.loads(record.read_text())["loop"]["rows"]
    assert [row["method"] for row in loop] == ["l2p"] and loop[0]["points_equal"]
    assert "The official online loop against the runner" in table.read_text()
    capsys.readouterr()
    assert fidelity(["--misa", str(FAKE), "--loop"]) == 2
    assert "--loop runs FlyGCL's loop: name its checkout with --flygcl" in capsys.readouterr().err
