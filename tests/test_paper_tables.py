"""The paper's tables as data (benchmarks/studies/paper_tables.py) and the rules that pick a run's row of them."""

import pytest

from benchmarks.studies.paper_numbers import AGGREGATION_PAPER_ROWS, AGGREGATIONS, paper_dataset
from benchmarks.studies.paper_tables import (
    AVERAGE_FORGETTING,
    CROSS_ABLATION,
    OFFLINE,
    OVERALL,
    PAPER_DATASETS,
    compared_dataset,
)
from benchmarks.studies.study_tables import format_study, study_rows
from fly_modules import AGGREGATION_RULES


@pytest.mark.parametrize("dataset, paper", [
    ("cifar100-like", "cifar100"), ("imagenet-r-like", "imagenet-r"), ("cub-like", "cub200"), ("synthetic", "cifar100"),
    ("cub200", "cub200"), ("something-else", "cifar100")])
def test_each_dataset_is_compared_with_its_papers_dataset(dataset, paper):
    assert compared_dataset(dataset) == paper
    assert paper_dataset(dataset, {"cifar100": 1, "imagenet-r": 2, "cub200": 3}) == paper


def test_every_dataset_the_mapping_names_is_one_the_tables_have():
    for rows in (*OVERALL.values(), OFFLINE, *CROSS_ABLATION.values(), *AVERAGE_FORGETTING.values()):
        for numbers in rows.values():
            assert set(numbers) == set(PAPER_DATASETS.values())


@pytest.mark.parametrize("table, keys, expected", [  # one cell of each table, read in the paper
    (OVERALL, ("ibot1k", "coda-prompt", "imagenet-r"), (49.56, 42.64)),
    (OVERALL, ("sup21k", "seq-ft-sl", "cub200"), (56.16, 56.50)),
    (OFFLINE, ("sd-lora", "imagenet-r"), (55.51, 51.97)),
    (CROSS_ABLATION, ("ensemble", "s-prompt", "cub200"), (67.97, 67.68)),
    (CROSS_ABLATION, ("router", "misa", "imagenet-r"), (57.30, 54.02)),
    (AVERAGE_FORGETTING, ("mocov3-1k", "mvp", "cifar100"), (52.82, 55.42)),
])
def test_cells_of_the_transcribed_tables(table, keys, expected):
    for key in keys:
        table = table[key]
    assert table == expected


def test_the_tables_agree_where_they_repeat_a_row():
    for method, numbers in OFFLINE.items():
        if method in CROSS_ABLATION["baseline"]:
            assert CROSS_ABLATION["baseline"][method] == numbers
    assert OVERALL["sup21k"]["flyprompt"] == OFFLINE["flyprompt"] == CROSS_ABLATION["both"]["flyprompt"]


def test_every_rule_has_its_paper_row_or_none_and_the_official_min_entropy_has_the_papers():
    assert set(AGGREGATION_PAPER_ROWS) == set(AGGREGATION_RULES)
    rows = [value for value in AGGREGATION_PAPER_ROWS.values() if value is not None]
    assert sorted(rows) == sorted(AGGREGATIONS) and AGGREGATION_PAPER_ROWS["min_entropy"] is None
    results = [{"spec": {"dataset": "synthetic", "method": "flyprompt", "variant": "full"},
                "protocol": {"model": "vit_tiny_patch16_224", "weights": None, "ridge": "auto"},
                "diagnostics": {"aggregations": {rule: {"A_auc": 0.5, "A_last": 0.5} for rule in AGGREGATION_RULES}}}]
    found = {row["aggregation"]: row for row in study_rows(results, "aggregations")}
    assert (found["logit_min_entropy"]["paper_A_auc"], found["logit_min_entropy"]["paper_A_last"]) == (81.92, 84.23)
    assert found["min_entropy"]["paper_A_auc"] is None
    assert "| min_entropy | 1 | 50.00 | 50.00 | cifar100, sup21k | - | - |" in format_study(list(found.values()),
                                                                                         "aggregations")
