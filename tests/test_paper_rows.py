"""The paper's numbers beside each row of the cross-ablation's table: every metric it has, of the run's
dataset (the proxy's *-like datasets their model's) and backbone, from the table that has the row."""

import pytest

from benchmarks.ablation import report
from benchmarks.backbone import BACKBONES
from benchmarks.studies.paper_rows import paper_row
from benchmarks.studies.paper_tables import AVERAGE_FORGETTING, CROSS_ABLATION, OFFLINE, OVERALL

PROXY = {"model": "vit_tiny_patch16_224", "weights": "proxy_vit.safetensors", "ridge": "auto"}


def _result(method, variant, dataset, seed, value, protocol=PROXY):
    metrics = {"A_auc": value, "A_last": value, "A_avg": value, "F_last": 0.1}
    return {"spec": {"method": method, "variant": variant, "dataset": dataset, "seed": seed}, "metrics": metrics,
            "protocol": protocol, "seconds_per_batch": 0.01, "peak_memory_mb": 100.0}


def test_a_variant_of_the_cross_ablation_has_that_tables_numbers_and_delta():
    results = [_result("dualprompt", variant, "imagenet-r-like", seed, 0.5 + 0.1 * seed)
               for variant in ("baseline", "router") for seed in (1, 2)]
    base, router = report.summarize_results(results)
    assert (router["paper_A_auc"], router["paper_A_last"]) == CROSS_ABLATION["router"]["dualprompt"]["imagenet-r"]
    assert router["paper_A_auc_delta"] == pytest.approx(53.16 - 46.13)
    assert router["paper_A_avg"] is None and router["paper_dataset"] == "imagenet-r"
    assert (base["paper_A_avg"], base["paper_F_last"]) == AVERAGE_FORGETTING["sup21k"]["dualprompt"]["imagenet-r"]
    markdown = report.format_markdown([base, router])
    assert "| 53.16 | +7.03 |" in markdown and "| 49.90 |" in markdown and "| 18.24 |" in markdown
    assert "imagenet-r, sup21k: cross-ablation; A_avg/F_last table" in markdown


@pytest.mark.parametrize("method, variant, dataset, source, expected", [
    ("l2p", "baseline", "cub-like", "Table 1", OVERALL["sup21k"]["l2p"]["cub200"]),
    ("hide-lora", "baseline", "cifar100-like", "Table 2", OFFLINE["hide-lora"]["cifar100"]),
    ("flyprompt", "full", "synthetic", "Table 1", OVERALL["sup21k"]["flyprompt"]["cifar100"]),
    ("linear-probe", "baseline", "cifar100", "components", (71.33, 73.22)),
    ("linear-probe", "ensemble", "imagenet-r", "components", (42.50, 38.35)),
    ("ranpac", "baseline", "cub200", None, (None, None)),  # the components table has no CUB-200
    ("l2p", "router", "cifar100", None, (None, None)),  # the paper gives L2P no REAR
])
def test_each_row_reads_the_table_that_has_it(method, variant, dataset, source, expected):
    row = paper_row(method, variant, dataset, "sup21k")
    assert (row.A_auc, row.A_last) == expected
    assert (row.source or "").split(";")[0] == (source or "")


def test_another_backbone_has_its_table_1_row_and_no_cross_ablation():
    protocol = {"model": BACKBONES["sup21k-1k"].model, "weights": None, "ridge": BACKBONES["sup21k-1k"].ridge}
    results = [_result("misa", variant, "cifar100", 1, 0.6, protocol) for variant in ("baseline", "both")]
    base, both = report.summarize_results(results)
    assert (base["paper_A_auc"], base["paper_A_last"]) == OVERALL["sup21k-1k"]["misa"]["cifar100"]
    assert both["paper_A_auc"] is None and both["paper_A_auc_delta"] is None
    assert base["paper_backbone"] == "sup21k-1k"


def test_the_linear_probe_is_never_set_beside_table_1s_row():
    row = paper_row("linear-probe", "baseline", "cifar100", "sup21k")
    assert row.A_auc != OVERALL["sup21k"]["linear-probe"]["cifar100"][0] and row.A_avg is None
