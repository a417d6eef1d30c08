"""``--study components``: one sweep of RanPAC†, the linear probe and FlyPrompt writes the paper's components
table, each row from its run (or its ensemble member), the rows no method expresses marked not run."""

from __future__ import annotations

import importlib.util
import json

import pytest
from tiny_sweep import TINY_MODEL

pytest.importorskip("timm")

from benchmarks.ablation import cli  # noqa: E402
from benchmarks.backbone import BACKBONES  # noqa: E402
from benchmarks.studies.components_table import COMPONENT_ROWS, NOT_RUN, component_rows, format_components  # noqa: E402
from benchmarks.studies.paper_numbers import COMPONENTS, COMPONENTS_BY_BACKBONE  # noqa: E402

FLAGS = ["--preset", "cpu", "--study", "components", "--synthetic-classes", "4", "--synthetic-train-per-class", "6",
         "--synthetic-test-per-class", "2", "--num-sessions", "2", "--num-experts", "2", "--batch-size", "4",
         "--expansion-dim", "32", "--eval-period", "8", "--model-kwargs", json.dumps(TINY_MODEL), "--no-progress"]


def test_the_components_study_writes_every_row_of_the_papers_table(tmp_path, capsys):
    assert cli.main([*FLAGS, "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ranpac: variants ensemble skipped: its head trains in the first session only" in out
    runs = {path.relative_to(tmp_path / "runs" / "synthetic").as_posix() for path in tmp_path.glob("runs/*/*/*/*.json")}
    assert runs == {"ranpac/baseline/seed1.json", "linear-probe/baseline/seed1.json",
                    "linear-probe/ensemble/seed1.json", "flyprompt/full/seed1.json"}
    result = {name: json.loads((tmp_path / "runs" / "synthetic" / name).read_text()) for name in runs}
    rows = {row["row"]: row for row in json.loads((tmp_path / "study_components.json").read_text())}
    assert list(rows) == [row.key for row in COMPONENT_ROWS]
    expected = {
        "ranpac": result["ranpac/baseline/seed1.json"]["metrics"],
        "linear_probe": result["linear-probe/baseline/seed1.json"]["metrics"],
        "linear_probe_ema": result["linear-probe/ensemble/seed1.json"]["metrics"],
        "prompts_rear": result["flyprompt/full/seed1.json"]["diagnostics"]["members"]["online"],
        "flyprompt": result["flyprompt/full/seed1.json"]["metrics"],
    }
    for key, row in rows.items():
        assert (row["paper_A_auc"], row["paper_A_last"]) == COMPONENTS[key]["cifar100"], key  # the proxy: Sup-21K's
        assert (row["paper_dataset"], row["paper_backbone"]) == ("cifar100", "sup21k"), key
        if key in expected:
            assert row["seeds"] == 1 and (row["A_auc"], row["A_last"]) == (expected[key]["A_auc"],
                                                                            expected[key]["A_last"]), key
        else:
            assert row["seeds"] == 0 and row["A_auc"] is None and row["source"] == "not run", key
    table = (tmp_path / "study_components.md").read_text()
    assert f"not run: {NOT_RUN}." in table and "| synthetic | FlyPrompt | yes | yes | yes | flyprompt/full |" in table
    assert "components study (study_components.md)" in out
    if importlib.util.find_spec("matplotlib"):  # the figure: one bar per row that ran
        assert (tmp_path / "study_components.png").read_bytes().startswith(b"\x89PNG")


def _record(dataset, method, variant, protocol):
    return {"spec": {"dataset": dataset, "method": method, "variant": variant}, "protocol": protocol,
            "metrics": {"A_auc": 0.5, "A_last": 0.4}}


def test_a_sup21k_1k_run_is_compared_with_the_papers_sup21k_1k_rows():
    preset = BACKBONES["sup21k-1k"]
    protocol = {"model": preset.model, "weights": None, "ridge": preset.ridge}
    proxy = {"model": "vit_tiny_patch16_224", "weights": None, "ridge": "auto"}
    rows = component_rows([_record("imagenet-r", "ranpac", "baseline", protocol),
                           _record("imagenet-r", "ranpac", "baseline", proxy)])
    ours = {row["row"]: row for row in rows if row["paper_backbone"] == "sup21k-1k"}
    theirs = {row["row"]: row for row in rows if row["paper_backbone"] == "sup21k"}
    assert list(ours) == list(theirs) == [row.key for row in COMPONENT_ROWS]
    for key, row in ours.items():
        assert (row["paper_A_auc"], row["paper_A_last"]) == COMPONENTS_BY_BACKBONE["sup21k-1k"][key]["imagenet-r"]
        assert (theirs[key]["paper_A_auc"], theirs[key]["paper_A_last"]) == COMPONENTS[key]["imagenet-r"]
    assert ours["ranpac"]["seeds"] == theirs["ranpac"]["seeds"] == 1  # each run in the rows of its backbone
    assert "| imagenet-r, sup21k-1k | 52.91 | 54.79 |" in format_components(rows)
