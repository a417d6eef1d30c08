"""benchmarks.fidelity's coda-prompt and s-prompt rows on the stand-in checkout: each trains as the stand-in's
official trainer does, S-Prompt's one difference is its k-means, and a change planted in the official code is seen."""

from __future__ import annotations

import dataclasses
import shutil
import sys

import pytest

pytest.importorskip("timm")
pytest.importorskip("sklearn.cluster")  # the official S-Prompt trainer's (and the stand-in's) k-means

from fidelity_stand_in import FAKE_FLYGCL as FAKE  # noqa: E402
from fidelity_stand_in import SMALL  # noqa: E402

from benchmarks.core import reference_checkout as ref  # noqa: E402
from benchmarks.fidelity.cli import main  # noqa: E402
from benchmarks.fidelity.comparison import compare_method  # noqa: E402
from benchmarks.fidelity.pairs import PAIRS  # noqa: E402

METHODS = ["coda-prompt", "s-prompt"]


@pytest.fixture(scope="module")
def checkout():
    return ref.load_checkout(str(FAKE), METHODS)


def _agrees(row) -> None:
    assert row.weights_moved > 1e-3
    assert row.weights_relative < 1e-5, row
    assert row.predictions_trained == row.predictions_identical == 1.0
    assert row.a_auc_ours == pytest.approx(row.a_auc_official, abs=1e-9)
    assert row.a_last_ours == pytest.approx(row.a_last_official, abs=1e-9)


def test_coda_prompt_trains_draws_and_decides_as_the_official_trainer(checkout):
    # reference_quirks: the official optimizer keeps the components the first session's end replaced
    _agrees(compare_method(checkout, PAIRS["coda-prompt"], SMALL))


def test_coda_prompt_without_reference_quirks_keeps_training_its_components(checkout):
    row = compare_method(checkout, dataclasses.replace(PAIRS["coda-prompt"], ours_kwargs={}),
                         SMALL)
    assert row.weights_relative > 1e-3  # ours trains task 1's components, the official optimizer does not


def test_sprompt_with_our_kmeans_on_both_sides_agrees_in_everything(checkout):
    row = compare_method(checkout, PAIRS["s-prompt-our-kmeans"], SMALL)
    _agrees(row)
    assert row.selection_identical == 1.0
    assert set(row.other) == {"prototypes task 0", "prototypes task 1"} and max(row.other.values()) < 1e-6


def test_sprompts_one_difference_is_the_kmeans(checkout):
    # The training is the same (the routing is inference only); scikit-learn's prototypes are not ours, and on
    # the official prototypes our routing and predictions are the official ones.
    row = compare_method(checkout, PAIRS["s-prompt"], SMALL)
    assert row.weights_relative < 1e-5 and max(row.other.values()) > 1e-2
    assert row.predictions_identical == row.selection_identical == 1.0


@pytest.mark.parametrize("method, path, original, planted", [
    ("coda-prompt", "models/codaprompt.py", "prompts[i] + backbone.pos_embed[:, :1]", "prompts[i]"),
    ("s-prompt", "methods/sprompt.py", "distances.argmin(1)", "distances.argmax(1)"),
])
def test_a_change_planted_in_the_official_code_is_seen(tmp_path, method, path, original, planted):
    shutil.copytree(FAKE, tmp_path / "flygcl")
    source = tmp_path / "flygcl" / path
    text = source.read_text()
    assert text.count(original) == 1
    source.write_text(text.replace(original, planted))
    row = compare_method(ref.load_checkout(str(tmp_path / "flygcl"), [method]), PAIRS[f"{method}-our-kmeans"]
                         if method == "s-prompt" else PAIRS[method], SMALL)
    if method == "coda-prompt":
        assert row.weights_relative > 1e-3
    else:
        assert row.selection_identical < 1.0 and row.predictions_identical < 1.0


def test_a_missing_official_dependency_fails_with_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sklearn.cluster", None)  # as if scikit-learn were not installed
    assert main(["--flygcl", str(FAKE), "--methods", "s-prompt"]) == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "pip install scikit-learn" in message


@pytest.mark.parametrize("method", METHODS)
def test_the_official_loop_trains_as_the_runner(checkout, method):
    from benchmarks.fidelity.loop_comparison import LOOP_SETUPS, compare_loop

    row = compare_loop(checkout, PAIRS[method], SMALL, LOOP_SETUPS[method])  # CODA-P: key_dim as a model option
    assert row.stream == "equal" and row.points_equal and row.weights_relative < 1e-5
    if method == "coda-prompt":
        assert row.accuracy_difference == 0.0
        assert row.our_metrics["A_auc"] == pytest.approx(row.official_metrics["A_auc"], abs=1e-12)
