"""The routing and aggregation studies' tables: seed means beside the paper's numbers of the dataset compared."""

import pytest

from benchmarks.studies.paper_numbers import AGGREGATIONS, ROUTING
from benchmarks.studies.study_tables import RIDGE_TIMING_NOTE, format_study, study_rows


def _result(dataset, seed_auc, study, entry):
    return {"spec": {"dataset": dataset, "method": "flyprompt", "variant": "full"},
            "diagnostics": {study: {"mean": {"A_auc": seed_auc, "A_last": 0.5, **entry}}}}


def test_a_dataset_the_paper_has_not_is_compared_with_its_cifar100_numbers():
    results = [_result(dataset, auc, "aggregations", {}) for dataset, auc in
               (("synthetic", 0.6), ("synthetic", 0.8), ("imagenet-r", 0.4))]
    rows = {row["dataset"]: row for row in study_rows(results, "aggregations")}
    assert rows["synthetic"]["A_auc"] == pytest.approx(0.7) and rows["synthetic"]["seeds"] == 2
    assert rows["synthetic"]["paper_dataset"] == "cifar100"
    assert (rows["synthetic"]["paper_A_auc"], rows["synthetic"]["paper_A_last"]) == AGGREGATIONS["mean"]["cifar100"]
    assert (rows["imagenet-r"]["paper_dataset"], rows["imagenet-r"]["paper_A_auc"]) == (
        "imagenet-r", AGGREGATIONS["mean"]["imagenet-r"][0])
    assert "| synthetic | flyprompt | full | mean | 2 | 70.00 | 50.00 | cifar100 | 81.34 | 85.11 |" in format_study(
        list(rows.values()), "aggregations")


def test_the_routers_table_says_where_the_ridges_time_is():
    routing = {"modal": {"last": 0.9, "anytime_mean": 0.8}}
    results = [{"spec": {"dataset": "synthetic", "method": "flyprompt", "variant": "full"},
                "diagnostics": {"routers": {"ridge": {"A_auc": 0.7, "A_last": 0.6, "routing": routing}}}}]
    (row,) = study_rows(results, "routers")
    assert row["ms_per_update"] is None and row["paper_A_auc"] == ROUTING["ridge"]["cifar100"][0]
    assert format_study([row], "routers").endswith(RIDGE_TIMING_NOTE)
    assert RIDGE_TIMING_NOTE not in format_study(study_rows([_result("synthetic", 0.5, "aggregations", {})],
                                                            "aggregations"), "aggregations")
