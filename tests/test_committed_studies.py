"""The committed study results (docs/results/proxy-10-studies): each table is what the study code computes from the
committed run files, and the numbers docs/proxy.md quotes are those of the tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.studies.components_table import component_rows
from benchmarks.studies.study_tables import study_rows

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "proxy-10-studies"


def _runs():
    return [json.loads(path.read_text()) for path in sorted(RESULTS.glob("runs/*/*/*/seed*.json"))]


def _same(computed, committed):
    """The same rows, whatever their order (the sweep's order of the runs)."""
    assert len(computed) == len(committed)
    order = lambda row: json.dumps([row[k] for k in sorted(row) if isinstance(row[k], str)])  # noqa: E731
    for mine, theirs in zip(sorted(computed, key=order), sorted(committed, key=order)):
        assert mine.keys() == theirs.keys()
        for key, value in mine.items():
            assert value == pytest.approx(theirs[key], rel=1e-12) if isinstance(value, float) else value == theirs[key]


@pytest.mark.parametrize("study", ["routers", "aggregations"])
def test_the_committed_study_tables_are_computed_from_the_committed_runs(study):
    committed = json.loads((RESULTS / f"study_{study}.json").read_text())
    methods = {row["method"] for row in committed}
    _same(study_rows([r for r in _runs() if r["spec"]["method"] in methods], study), committed)


def test_the_committed_components_table_is_computed_from_the_committed_runs():
    _same(component_rows(_runs()), json.loads((RESULTS / "study_components.json").read_text()))


def test_the_numbers_docs_quote_are_the_tables():
    text = (RESULTS.parents[1] / "proxy.md").read_text().split("## The paper's studies on the earlier proxy")[1]
    routers = {row["router"]: row for row in json.loads((RESULTS / "study_routers.json").read_text())
               if row["method"] == "flyprompt"}
    quoted = ", ".join(f"{label} {100 * routers[name]['A_auc']:.2f}" for label, name in (
        ("ridge", "ridge"), ("K-Means", "kmeans"), ("naive Bayes", "naive_bayes"), ("prototypes", "prototype"),
        ("MLP", "mlp")))
    assert quoted in " ".join(text.split())
    components = {row["row"]: row for row in json.loads((RESULTS / "study_components.json").read_text())}
    assert f"RanPAC† {100 * components['ranpac']['A_auc']:.2f}" in text
    assert f"FlyPrompt {100 * components['flyprompt']['A_auc']:.2f}" in text


def test_the_router_sentences_of_the_docs_are_the_tables():
    """The MLP's gap, the ridge's place with L2P and MVP, and the statistics routers' lead on HiDe-Prompt and
    NoRGa, as docs/proxy.md states them, computed from the committed routers table."""
    text = " ".join((RESULTS.parents[1] / "proxy.md").read_text().split("## The paper's studies on the earlier proxy")[1]
                    .split())
    scores = {(r["method"], r["variant"], r["router"]): 100 * r["A_auc"]
              for r in json.loads((RESULTS / "study_routers.json").read_text())}
    fly = sorted((v for (m, _, router), v in scores.items() if m == "flyprompt" and router != "mlp"))
    assert f"last, {fly[0] - scores[('flyprompt', 'full', 'mlp')]:.2f} points below the next router" in text
    not_first = {(m, v) for (m, v, r) in scores if r == "ridge"
                 and max(scores[(m, v, other)] for (mm, vv, other) in scores if (mm, vv) == (m, v)) > scores[(m, v, r)]}
    assert {key for key in not_first if key[0] in ("l2p", "mvp")} == {("l2p", "router"), ("l2p", "both"), ("mvp", "router")}
    assert "ridge not first for L2P, nor in MVP's `router` variant" in text
    leads = [scores[(m, v, r)] - scores[(m, v, "ridge")] for m in ("hide", "norga") for v in ("router", "both")
             for r in ("naive_bayes", "prototype")]
    assert f"score {min(leads):.2f} to {max(leads):.2f} points above it" in text
