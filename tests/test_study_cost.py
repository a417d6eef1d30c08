"""The cost study: parameter counts as the official code counts them; a sweep's timings beside the paper's."""

import json

import pytest
import torch
from torch import nn

pytest.importorskip("timm")

from benchmarks.studies.cost import cost_rows, count_parameters, format_cost, method_parameters  # noqa: E402


def test_parameters_and_buffers_are_counted_apart():
    model = nn.Linear(10, 3)
    model.bias.requires_grad_(False)
    model.register_buffer("statistics", torch.zeros(4, 5))
    assert count_parameters(model) == {"total": 33e-6, "trainable": 30e-6, "buffers": 20e-6}


def test_l2p_at_the_papers_configuration_has_the_papers_count():
    counts = method_parameters("l2p")
    assert (round(counts["total"], 2), round(counts["trainable"], 2)) == (86.01, 0.22)
    row = {"method": "l2p", **counts, "BWT": None, "train_s": None, "seeds": 0,
           "paper": {"total": 86.01, "trainable": 0.22, "BWT": 0.10, "train_s": 5.57, "infer_s": 0.95}}
    assert "| l2p | 86.01 | 86.01 | 0.22 | 0.22 |" in format_cost([row])


def test_a_sweeps_training_and_inference_seconds_per_batch_are_read_from_its_folder(tmp_path):
    """Training seconds per batch from the run records, inference seconds per test batch from the probe of
    the plan made into the same folder; the folder without its plan has no inference time."""
    from tiny_sweep import TINY

    from benchmarks.ablation import cli
    from benchmarks.core.plan_file import inference_per_image

    output = tmp_path / "sweep"
    assert cli.main([*TINY, "--seeds", "1,2", "--output", str(output), "--plan"]) == 0
    assert cli.main([*TINY, "--seeds", "1,2", "--output", str(output)]) == 0
    records = [json.loads(p.read_text()) for p in sorted(output.glob("runs/*/l2p/baseline/seed*.json"))]
    (probe,) = json.loads((output / "plan.json").read_text())["probes"]
    (row,) = cost_rows(["l2p"], output)
    assert row["seeds"] == len(records) == 2
    assert row["train_s"] == pytest.approx(sum(r["seconds_per_batch"] for r in records) / 2)
    assert row["infer_s"] == pytest.approx(records[0]["protocol"]["test_batch_size"] * inference_per_image(probe))
    assert row["infer_s"] > 0 and row["infer_on"].startswith("synthetic, ")
    assert f"| {row['infer_s']:.3f} | 0.95 | 2 |" in format_cost([row])
    (output / "plan.json").unlink()
    (without,) = cost_rows(["l2p"], output)
    assert without["infer_s"] is None and "| - | 0.95 | 2 |" in format_cost([without])


def test_the_cost_study_reads_methods_and_output_and_refuses_what_it_would_ignore(tmp_path, capsys):
    from benchmarks.ablation import cli

    assert cli.main(["--study", "cost", "--seeds", "1,2", "--output", str(tmp_path / "a")]) == 2
    assert "--study cost trains nothing" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert cli.main(["--study", "cost", "--methods", "l2p,coda"]) == 2
    assert "no coda" in capsys.readouterr().err
    assert cli.main(["--study", "cost", "--methods", "l2p", "--output", str(tmp_path / "b")]) == 0
    (row,) = json.loads((tmp_path / "b" / "cost.json").read_text())
    assert row["method"] == "l2p" and row["seeds"] == 0
