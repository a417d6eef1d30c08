"""The routing and aggregation studies' tables: seed means beside the paper's numbers of the dataset compared."""

import pytest

from benchmarks.backbone import BACKBONES
from benchmarks.studies.paper_numbers import (
    AGGREGATIONS,
    AGGREGATIONS_BY_BACKBONE,
    COMPONENTS,
    COMPONENTS_BY_BACKBONE,
    ROUTING,
    paper_backbone,
)
from benchmarks.studies.study_tables import RIDGE_TIMING_NOTE, format_study, study_rows

#: the protocol of the CPU proxy's runs, as recorded: a tiny ViT, none of the paper's backbones
PROXY = {"model": "vit_tiny_patch16_224", "weights": "benchmarks/proxy/weights/proxy_vit.safetensors", "ridge": "auto"}


def _result(dataset, seed_auc, study, entry, protocol=PROXY):
    return {"spec": {"dataset": dataset, "method": "flyprompt", "variant": "full"}, "protocol": protocol,
            "diagnostics": {study: {"mean": {"A_auc": seed_auc, "A_last": 0.5, **entry}}}}


def test_a_dataset_the_paper_has_not_is_compared_with_its_cifar100_numbers():
    results = [_result(dataset, auc, "aggregations", {}) for dataset, auc in
               (("synthetic", 0.6), ("synthetic", 0.8), ("imagenet-r", 0.4))]
    rows = {row["dataset"]: row for row in study_rows(results, "aggregations")}
    assert rows["synthetic"]["A_auc"] == pytest.approx(0.7) and rows["synthetic"]["seeds"] == 2
    assert (rows["synthetic"]["paper_dataset"], rows["synthetic"]["paper_backbone"]) == ("cifar100", "sup21k")
    assert (rows["synthetic"]["paper_A_auc"], rows["synthetic"]["paper_A_last"]) == AGGREGATIONS["mean"]["cifar100"]
    assert (rows["imagenet-r"]["paper_dataset"], rows["imagenet-r"]["paper_A_auc"]) == (
        "imagenet-r", AGGREGATIONS["mean"]["imagenet-r"][0])
    assert "| synthetic | flyprompt | full | mean | 2 | 70.00 | 50.00 | cifar100, sup21k | 81.34 | 85.11 |" in (
        format_study(list(rows.values()), "aggregations"))


def _preset_protocol(name):
    """The protocol ``--backbone NAME`` records (``with_backbone``: the preset's model and ridge)."""
    return {"model": BACKBONES[name].model, "weights": None, "ridge": BACKBONES[name].ridge}


@pytest.mark.parametrize("backbone", ["sup21k-1k", "dino1k", "mocov3-1k"])
def test_a_run_of_a_papers_backbone_is_compared_with_that_backbones_numbers(backbone):
    results = [_result(dataset, 0.5, "aggregations", {}, _preset_protocol(backbone))
               for dataset in ("imagenet-r", "synthetic")]
    rows = {row["dataset"]: row for row in study_rows(results, "aggregations")}
    numbers = AGGREGATIONS_BY_BACKBONE[backbone]["mean"]
    assert numbers != AGGREGATIONS["mean"]
    assert (rows["imagenet-r"]["paper_backbone"], rows["imagenet-r"]["paper_A_auc"], rows["imagenet-r"]["paper_A_last"]) \
        == (backbone, *numbers["imagenet-r"])
    assert (rows["synthetic"]["paper_A_auc"], rows["synthetic"]["paper_A_last"]) == numbers["cifar100"]
    assert f"| cifar100, {backbone} | {numbers['cifar100'][0]:.2f} |" in format_study(list(rows.values()),
                                                                                      "aggregations")


def test_the_routers_table_compares_with_the_papers_sup21k_routing_whatever_the_backbone():
    routing = {"modal": {"last": 0.9, "anytime_mean": 0.8}}
    result = {"spec": {"dataset": "imagenet-r", "method": "flyprompt", "variant": "full"},
              "protocol": _preset_protocol("sup21k-1k"),
              "diagnostics": {"routers": {"ridge": {"A_auc": 0.7, "A_last": 0.6, "routing": routing}}}}
    (row,) = study_rows([result], "routers")
    assert (row["paper_backbone"], row["paper_A_auc"]) == ("sup21k", ROUTING["ridge"]["imagenet-r"][0])


def test_the_routers_table_says_where_the_ridges_time_is():
    routing = {"modal": {"last": 0.9, "anytime_mean": 0.8}}
    results = [{"spec": {"dataset": "synthetic", "method": "flyprompt", "variant": "full"}, "protocol": PROXY,
                "diagnostics": {"routers": {"ridge": {"A_auc": 0.7, "A_last": 0.6, "routing": routing}}}}]
    (row,) = study_rows(results, "routers")
    assert row["ms_per_update"] is None and row["paper_A_auc"] == ROUTING["ridge"]["cifar100"][0]
    assert format_study([row], "routers").endswith(RIDGE_TIMING_NOTE)
    assert RIDGE_TIMING_NOTE not in format_study(study_rows([_result("synthetic", 0.5, "aggregations", {})],
                                                            "aggregations"), "aggregations")


def test_presets_sharing_a_model_are_told_apart_by_their_weights_file_or_ridge_and_else_refused():
    ibot = _preset_protocol("ibot1k")
    assert paper_backbone({**ibot, "weights": "weights/ibot1k.safetensors"}) == "ibot1k"
    assert paper_backbone({**ibot, "weights": "/data/checkpoint.pth"}) == "ibot21k"  # iBOT-21K's official file
    assert paper_backbone(_preset_protocol("mocov3-1k")) == "mocov3-1k"  # its ridge is not iBOT's
    with pytest.raises(ValueError, match="is the model of the backbones ibot21k, ibot1k: name the weights file"):
        paper_backbone(ibot)
    assert paper_backbone(PROXY) == paper_backbone({**PROXY, "model": "vit_base_patch16_224.augreg2_in21k_ft_in1k"}) \
        == "sup21k"  # none of the presets


@pytest.mark.parametrize("table, cell, tex", [  # cells of the paper's tables, read from its source by eye
    (AGGREGATIONS_BY_BACKBONE, ("sup21k-1k", "mean", "cub200"), (56.64, 60.39)),
    (AGGREGATIONS_BY_BACKBONE, ("ibot21k", "softmax_max", "imagenet-r"), (57.75, 54.39)),
    (AGGREGATIONS_BY_BACKBONE, ("ibot1k", "min_entropy", "cifar100"), (61.36, 60.73)),
    (AGGREGATIONS_BY_BACKBONE, ("dino1k", "softmax_min_entropy", "cub200"), (36.48, 41.43)),
    (AGGREGATIONS_BY_BACKBONE, ("mocov3-1k", "max_prob", "cifar100"), (58.70, 63.89)),
    (COMPONENTS_BY_BACKBONE, ("sup21k-1k", "ranpac", "imagenet-r"), (52.91, 54.79)),
    (COMPONENTS_BY_BACKBONE, ("sup21k-1k", "prompts_rear", "cifar100"), (71.28, 69.73)),
])
def test_transcribed_cells_are_the_papers(table, cell, tex):
    backbone, row, dataset = cell
    assert table[backbone][row][dataset] == tex


def test_every_backbone_has_the_papers_six_rules_on_its_three_datasets():
    assert set(AGGREGATIONS_BY_BACKBONE) == set(BACKBONES) and set(COMPONENTS_BY_BACKBONE) == {"sup21k", "sup21k-1k"}
    for rules in AGGREGATIONS_BY_BACKBONE.values():
        assert list(rules) == list(AGGREGATIONS)
        assert all(list(numbers) == ["cifar100", "imagenet-r", "cub200"] for numbers in rules.values())
    assert [list(rows) for rows in COMPONENTS_BY_BACKBONE.values()] == [list(COMPONENTS)] * 2
