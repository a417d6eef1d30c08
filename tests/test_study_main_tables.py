"""The paper's Tables 1 and 2 (``--study overall``, ``--study offline``) built from a tiny generated set of run
files: seed means beside the paper's numbers of the dataset and backbone compared, rows without a run named."""

import argparse
import json

import pytest
from run_records import run_record

from benchmarks.ablation.arguments import protocol_value
from benchmarks.backbone import BACKBONES
from benchmarks.core.results import load_results
from benchmarks.studies.command import study_defaults
from benchmarks.studies.main_tables import format_main_table, main_table_rows, study_methods, write_main_table
from benchmarks.studies.paper_tables import OFFLINE, OVERALL, TABLE_1_NOT_OURS

PROXY = {"model": "vit_tiny_patch16_224", "weights": "proxy_vit.safetensors", "ridge": "auto"}
REGISTERED = ["dualprompt", "flyprompt", "hide", "linear-probe", "mvp", "sd-lora"]


def _write_runs(folder, runs, protocol=PROXY):
    """Result files as a sweep writes them: runs/<dataset>/<method>/<variant>/seed<k>.json."""
    for dataset, method, variant, seed, a_auc, a_last in runs:
        path = folder / "runs" / dataset / method / variant / f"seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        spec = {"dataset": dataset, "method": method, "variant": variant, "seed": seed}
        metrics = {"A_auc": a_auc, "A_last": a_last, "A_avg": a_auc, "F_last": 0.1}
        path.write_text(json.dumps(run_record(spec, metrics, protocol, notes="")))
    return load_results(folder)


RUNS = [
    ("cifar100-like", "dualprompt", "baseline", 1, 0.60, 0.50), ("cifar100-like", "dualprompt", "baseline", 2, 0.70, 0.54),
    ("cifar100-like", "dualprompt", "router", 1, 0.99, 0.99),  # a variant: not the method alone
    ("cifar100-like", "flyprompt", "full", 1, 0.80, 0.82), ("cifar100-like", "flyprompt", "full", 2, 0.84, 0.86),
    ("cifar100-like", "linear-probe", "baseline", 1, 0.40, 0.30),
    ("imagenet-r-like", "flyprompt", "full", 1, 0.50, 0.40),
]


def test_table_1_from_run_files(tmp_path):
    rows = main_table_rows(_write_runs(tmp_path, RUNS), "overall", REGISTERED)
    found = {(r["row"], r["dataset"]): r for r in rows}
    assert {r["backbone"] for r in rows} == {"sup21k"}
    assert [r["dataset"] for r in rows if r["row"] == "l2p"] == ["cifar100-like", "imagenet-r-like", "cub200"]
    dual = found["dualprompt", "cifar100-like"]
    assert dual["seeds"] == 2 and dual["A_auc"] == pytest.approx(0.65) and dual["A_auc_std"] == pytest.approx(0.0707, abs=1e-4)
    assert (dual["paper_dataset"], dual["paper_A_auc"], dual["paper_A_last"]) == ("cifar100", 76.04, 76.62)
    fly = found["flyprompt", "imagenet-r-like"]
    assert (fly["seeds"], fly["A_auc_std"], fly["paper_A_auc"]) == (1, None, OVERALL["sup21k"]["flyprompt"]["imagenet-r"][0])
    assert found["linear-probe", "cifar100-like"]["not_run"] == TABLE_1_NOT_OURS["linear-probe"]
    assert found["seq-ft", "cifar100-like"]["not_run"].startswith("no reference method seq-ft")
    assert found["dualprompt", "cub200"]["not_run"] == "no run on this dataset"
    assert found["mvp", "cifar100-like"]["not_run"].startswith("no run of it")  # here, but not in the sweep
    markdown = format_main_table(rows, "overall")
    assert "| DualPrompt | 65.00 ± 7.07 | 76.04 | 52.00 ± 2.83 | 76.62 |" in markdown
    assert "| Linear Probe | not run | 49.69 | not run | 23.07 |" in markdown
    assert "cifar100-like (paper: cifar100) A_auc" in markdown and "- Seq FT: not run: no reference method" in markdown
    assert "- cub200: no run of the results is on it." in markdown and "### Table 1 (overall results), Sup-21K" in markdown


def test_table_1_of_another_backbone_has_that_backbones_rows(tmp_path):
    protocol = {"model": BACKBONES["dino1k"].model, "weights": None, "ridge": BACKBONES["dino1k"].ridge}
    rows = main_table_rows(_write_runs(tmp_path, RUNS[:2], protocol), "overall", REGISTERED)
    assert {r["backbone"] for r in rows} == {"dino1k"} and "seq-ft" not in {r["row"] for r in rows}
    dual = next(r for r in rows if (r["row"], r["dataset"]) == ("dualprompt", "cifar100-like"))
    assert (dual["paper_A_auc"], dual["paper_A_last"]) == OVERALL["dino1k"]["dualprompt"]["cifar100"]


def test_table_2_from_run_files(tmp_path):
    runs = [("cub-like", "sd-lora", "baseline", 1, 0.5, 0.4), ("cub-like", "hide", "baseline", 1, 0.6, 0.6)]
    rows = main_table_rows(_write_runs(tmp_path, runs), "offline", REGISTERED)
    assert [r["row"] for r in rows if r["dataset"] == "cub-like"] == list(OFFLINE)
    sd = next(r for r in rows if (r["row"], r["dataset"]) == ("sd-lora", "cub-like"))
    assert (sd["paper_A_auc"], sd["paper_A_last"]) == OFFLINE["sd-lora"]["cub200"] and sd["not_run"] is None
    text = write_main_table(tmp_path, load_results(tmp_path), "offline")
    assert (tmp_path / "study_offline.md").read_text() == text + "\n"
    written = json.loads((tmp_path / "study_offline.json").read_text())
    assert [(r["row"], r["dataset"], r["A_auc"]) for r in written] == [(r["row"], r["dataset"], r["A_auc"]) for r in rows]
    assert (tmp_path / "study_offline.png").is_file() or "matplotlib" not in text
    assert ("| SD-LoRA | not run | 79.26 | not run | 78.91 | not run | 55.51 | not run | 51.97 | 50.00 | 64.12 | "
            "40.00 | 60.57 |") in text  # the paper's order of datasets, the one run last


def test_table_2_has_no_paper_numbers_for_another_backbone(tmp_path):
    protocol = {"model": BACKBONES["sup21k-1k"].model, "weights": None, "ridge": BACKBONES["sup21k-1k"].ridge}
    rows = main_table_rows(_write_runs(tmp_path, [("cifar100", "hide", "baseline", 1, 0.5, 0.5)], protocol),
                           "offline", REGISTERED)
    assert all(r["paper_A_auc"] is None for r in rows)


@pytest.mark.parametrize("study", ["overall", "offline"])
def test_the_studies_train_the_tables_registered_methods_alone(study):
    args = argparse.Namespace(study=study, methods=None, variants=None)
    study_defaults(args, protocol_value)
    assert args.variants == ["baseline"] and args.methods and "linear-probe" not in args.methods
    assert study_methods(study, REGISTERED) == [m for m in args.methods if m in REGISTERED]
