"""The studies' figures: written beside their tables, and what they plot is read from the table rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from benchmarks.studies.paper_numbers import ROUTING  # noqa: E402
from benchmarks.studies.study_figures import plot_study, study_series  # noqa: E402
from benchmarks.studies.study_tables import study_rows, write_study  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _result(seed, dataset, a_auc):
    """A run record as the sweep writes it, reduced to what the study tables read."""
    routers = {name: {"A_auc": value, "A_last": value / 2, "routing": {"modal": {"last": 0.5, "anytime_mean": 0.4}}}
               for name, value in a_auc.items()}
    return {"spec": {"dataset": dataset, "method": "flyprompt", "variant": "full", "seed": seed},
            "protocol": {"model": "vit_tiny_patch16_224", "weights": None, "ridge": "auto"},
            "diagnostics": {"routers": routers}}


def test_the_series_are_the_rows_means_deviations_and_the_papers_numbers(tmp_path):
    seeds = {1: {"ridge": 0.81, "prototype": 0.75}, 2: {"ridge": 0.85, "prototype": 0.70},
             3: {"ridge": 0.80, "prototype": 0.72}}
    results = [_result(seed, "cifar100", values) for seed, values in seeds.items()]
    results.append(_result(1, "synthetic", {"ridge": 0.60, "prototype": 0.55}))
    rows = study_rows(results, "routers")
    cifar, synthetic = study_series(rows, "routers")
    assert cifar["panel"] == ("cifar100", "flyprompt", "full") and cifar["names"] == ["ridge", "prototype"]
    for i, name in enumerate(cifar["names"]):
        values = [100 * seeds[seed][name] for seed in seeds]
        assert cifar["measured"][i] == pytest.approx(np.mean(values))
        assert cifar["errors"][i] == pytest.approx(np.std(values, ddof=1))
        assert cifar["paper"][i] == ROUTING[name]["cifar100"][0]
    assert cifar["seeds"] == [3, 3]
    assert synthetic["errors"] == [None, None]  # one seed
    # generated data: the paper's CIFAR-100 numbers, named
    assert synthetic["paper"] == cifar["paper"] and synthetic["paper_dataset"] == "cifar100"
    assert synthetic["paper_backbone"] == cifar["paper_backbone"] == "sup21k"  # the routing table's only backbone
    write_study(tmp_path, results, "routers")
    assert (tmp_path / "study_routers.png").read_bytes().startswith(PNG)
    assert json.loads((tmp_path / "study_routers.json").read_text()) == rows


def test_a_study_with_its_own_rows_gets_its_figure_and_nothing_measured_gets_none(tmp_path):
    """The hook another study uses: rows naming their entries by the singular of its name, any panel keys."""
    rows = [{"dataset": "cifar100", "component": name, "seeds": 2, "A_auc": value, "A_auc_std": 0.01,
             "paper_A_auc": paper} for name, value, paper in (("ranpac", 0.7, 79.1), ("probe", 0.6, None))]
    (series,) = study_series(rows, "components")
    assert series["panel"] == ("cifar100",) and series["measured"] == pytest.approx([70.0, 60.0])
    assert series["errors"] == pytest.approx([1.0, 1.0]) and series["paper"] == [79.1, None]
    assert plot_study(tmp_path, rows, "components") == tmp_path / "study_components.png"
    assert (tmp_path / "study_components.png").read_bytes().startswith(PNG)
    assert plot_study(tmp_path, [{**rows[0], "A_auc": None}], "empty", key="component") is None
    assert not (tmp_path / "study_empty.png").exists()


def test_a_study_sweep_writes_its_figure_beside_its_table(tmp_path):
    from tiny_sweep import TINY

    from benchmarks.ablation import cli

    assert cli.main([*TINY, "--study", "aggregations", "--variants", "ensemble", "--eval-period", "4",
                     "--output", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "study_aggregations.json").read_text())
    (series,) = study_series(rows, "aggregations")
    assert series["names"] == [row["aggregation"] for row in rows] and len(rows) > 1
    assert (tmp_path / "study_aggregations.png").read_bytes().startswith(PNG)
