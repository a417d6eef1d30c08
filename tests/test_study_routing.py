"""``--study routing`` (the paper's Fig. 2b, 2c): each method's routing accuracy by the paper's rule and A_last
with the oracle, read from the runs' files; the standalone command reads a sweep's folder without training."""

from __future__ import annotations

import json

import pytest
from tiny_sweep import TINY_MODEL

from benchmarks.studies.routing_oracle import format_routing, main, routing_rows


def _record(method, variant, seed, last, own=None, rear=None):
    routing = {who: {"any": {"last": value, "anytime_mean": value}, "modal": {"last": 0.0, "anytime_mean": 0.0}}
               for who, value in (("own", own), ("rear", rear), ("chance", 0.5)) if value is not None}
    return {"spec": {"dataset": "cifar100", "method": method, "variant": variant, "seed": seed},
            "metrics": {"A_last": last}, "diagnostics": {"routing": routing}}


def test_rows_read_the_papers_routing_rule_and_the_oracles_a_last():
    results = [_record("mvp", "baseline", 1, 0.6, own=0.2, rear=0.8), _record("mvp", "baseline", 2, 0.7, own=0.4, rear=0.6),
               _record("mvp", "oracle", 1, 0.9), _record("mvp", "oracle", 2, 0.8),
               _record("flyprompt", "full", 1, 0.85, own=0.9, rear=0.9), _record("flyprompt", "oracle_both", 1, 0.95),
               _record("flyprompt", "oracle", 1, 0.10)]  # the online head under the oracle: not FlyPrompt's figure
    rows = {row["method"]: row for row in routing_rows(results)}
    assert rows["mvp"]["routing_own"] == pytest.approx(0.3) and rows["mvp"]["routing_rear"] == pytest.approx(0.7)
    assert rows["mvp"]["A_last"] == pytest.approx(0.65) and rows["mvp"]["A_last_oracle"] == pytest.approx(0.85)
    assert rows["flyprompt"]["A_last_oracle"] == pytest.approx(0.95)
    assert "| cifar100 | MVP | 2 | 30.00 | 70.00 | 50.00 | 65.00 | 85.00 | 20.00 |" in format_routing(list(rows.values()))


def test_the_routing_study_and_its_standalone_command_agree(tmp_path, capsys):
    pytest.importorskip("timm")
    from benchmarks.ablation import cli

    flags = ["--preset", "cpu", "--study", "routing", "--methods", "mvp,flyprompt", "--synthetic-classes", "4",
             "--synthetic-train-per-class", "6", "--synthetic-test-per-class", "2", "--num-sessions", "2",
             "--num-experts", "2", "--batch-size", "4", "--expansion-dim", "32", "--eval-period", "8",
             "--model-kwargs", json.dumps(TINY_MODEL), "--no-progress"]
    assert cli.main([*flags, "--output", str(tmp_path)]) == 0
    variants = {p.relative_to(tmp_path / "runs/synthetic").parent.as_posix() for p in tmp_path.glob("runs/*/*/*/*.json")}
    assert variants == {"mvp/baseline", "mvp/oracle", "mvp/oracle_both", "flyprompt/full",
                        "flyprompt/oracle", "flyprompt/oracle_both"}
    written = json.loads((tmp_path / "study_routing.json").read_text())
    assert [row["method"] for row in written] == ["mvp", "flyprompt"]
    assert all(row["routing_own"] is not None and row["A_last_oracle"] is not None for row in written)
    assert main(["--results", str(tmp_path), "--output", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again/study_routing.json").read_text()) == written
    assert (tmp_path / "study_routing.png").is_file()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--results", str(tmp_path / "nothing")])
    assert "nothing: no folder there; expected an existing folder (check --results)" in capsys.readouterr().err
