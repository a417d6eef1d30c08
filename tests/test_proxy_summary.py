"""The proxy's summary in docs/proxy.md: every block is what benchmarks.proxy.summary computes from the committed
run files, and the summary's deltas, counts and ranks are those of the runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from run_records import run_record

from benchmarks.proxy import summary

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "proxy.md"
BLOCKS = [("docs/results/proxy", "cifar100-like"), ("docs/results/proxy", "imagenet-r-like"),
          ("docs/results/proxy", "cub-like"), ("docs/results/proxy-10", "synthetic")]


@pytest.mark.parametrize("results, dataset", BLOCKS)
def test_the_pages_blocks_are_computed_from_the_committed_runs(results, dataset, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert summary.main(["--results", results, "--dataset", dataset, "--check", str(PAGE)]) == 0, capsys.readouterr()


def _write_runs(root: Path, scores: dict, dataset: str = "toy") -> None:
    for (method, variant, seed), a_auc in scores.items():
        path = root / "runs" / dataset / method / variant / f"seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        record = run_record({"method": method, "variant": variant, "dataset": dataset, "seed": seed},
                            {"A_auc": a_auc / 100})
        path.write_text(json.dumps(record))


SCORES = {
    ("dualprompt", "baseline", 1): 50.0, ("dualprompt", "router", 1): 49.0, ("dualprompt", "ensemble", 1): 52.0,
    ("dualprompt", "both", 1): 55.0, ("dualprompt", "oracle", 1): 51.0,
    ("dualprompt", "baseline", 2): 60.0, ("dualprompt", "router", 2): 62.0, ("dualprompt", "ensemble", 2): 61.0,
    ("dualprompt", "both", 2): 60.5, ("dualprompt", "oracle", 2): 63.0,
    ("flyprompt", "full", 1): 54.0, ("flyprompt", "full", 2): 64.0,
}


def test_deltas_are_paired_per_seed_and_rear_given_te2_is_both_minus_ensemble(tmp_path):
    _write_runs(tmp_path, SCORES)
    result = summary.ProxySummary(summary.load_runs(tmp_path, "toy"))
    assert result.deltas("dualprompt", "+REAR") == pytest.approx([-1.0, 2.0])
    assert result.deltas("dualprompt", "REAR given TE2") == pytest.approx([3.0, -0.5])
    assert result.deltas("flyprompt", "+REAR") is None
    sentence = result.positive_on_every_seed("dualprompt", "REAR given TE2")
    assert sentence.startswith("DualPrompt: positive on 1 of 2 seeds (+3.00, -0.50; mean +1.25")
    # FlyPrompt: 59.0 on average, above every DualPrompt row; second to DualPrompt both on seed 1 (54 < 55).
    assert "ranks 1 of 5 rows" in result.flyprompt_rank() and "on each seed: 2, 1." in result.flyprompt_rank()


def test_a_changed_run_makes_the_check_fail(tmp_path, capsys):
    _write_runs(tmp_path, SCORES)
    page = tmp_path / "page.md"
    begin, end = summary.markers(tmp_path.as_posix(), "toy")
    page.write_text(f"text\n{begin}\n{end}\nmore\n")
    assert summary.main(["--results", str(tmp_path), "--dataset", "toy", "--write", str(page)]) == 0
    assert page.read_text().startswith("text\n") and page.read_text().endswith("\nmore\n")
    assert summary.main(["--results", str(tmp_path), "--dataset", "toy", "--check", str(page)]) == 0
    _write_runs(tmp_path, {("dualprompt", "both", 2): 60.6})
    assert summary.main(["--results", str(tmp_path), "--dataset", "toy", "--check", str(page)]) == 1
    assert "rerun with --write" in capsys.readouterr().err


def test_a_page_without_the_markers_or_a_folder_without_runs_is_one_line(tmp_path, capsys):
    _write_runs(tmp_path, SCORES)
    page = tmp_path / "page.md"
    page.write_text("no markers\n")
    assert summary.main(["--results", str(tmp_path), "--dataset", "toy", "--check", str(page)]) == 2
    with pytest.raises(SystemExit) as refused:  # a folder that is not there: refused when parsed
        summary.main(["--results", str(tmp_path / "none"), "--dataset", "toy"])
    assert refused.value.code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and "add that line" in errors[0] and "none: no folder there" in errors[1]


def test_every_number_the_results_list_quotes_is_a_committed_one():
    page = PAGE.read_text()
    _, end = summary.markers("docs/results/proxy", "cifar100-like")
    quoted_part = page.split("## Results")[1].split(end)[1].split("## The paper's studies on the proxy")[0]
    blocks = [page.split(summary.markers(results, dataset)[0])[1].split(summary.markers(results, dataset)[1])[0]
              for results, dataset in BLOCKS]
    committed = " ".join([*blocks, page.split(summary.markers("docs/results/proxy-10", "synthetic")[0])[1],
                          (REPO / "docs" / "results" / "proxy" / "table.md").read_text()])
    numbers = re.findall(r"[+-]?\d+\.\d\d\b", quoted_part)
    assert len(numbers) > 20
    missing = [n for n in numbers if n not in committed]
    assert not missing, f"docs/proxy.md quotes numbers no committed file has: {missing}"


def test_every_number_the_studies_section_quotes_is_in_a_committed_study_table():
    section = PAGE.read_text().split("## The paper's studies on the proxy")[1].split("## The earlier proxy")[0]
    tables = " ".join(path.read_text() for folder in ("studies", "proxy")
                      for pattern in ("**/study_*.md", "**/sweep_*.md")
                      for path in (REPO / "docs" / "results" / folder).glob(pattern))
    numbers = re.findall(r"[+-]?\d+\.\d\d\d?\b", section)
    assert len(numbers) > 20
    missing = [n for n in numbers if n not in tables]
    assert not missing, f"docs/proxy.md's studies section quotes numbers no study table has: {missing}"


def test_the_paper_sign_counts_follow_the_paper_delta_and_every_seed(tmp_path):
    """DualPrompt's +REAR on the paper's sign on both seeds, MVP's against it on one seed: 2 of 2 on the mean,
    1 on every seed; a method with no paper delta (FlyPrompt) is not counted."""
    signs = {m: np.sign(summary._paper_delta(m, "router", "baseline", "cifar100")) for m in ("dualprompt", "mvp")}
    assert all(signs.values()), "the paper prints a +REAR delta for both methods"
    scores = {}
    for method, seed_deltas in (("dualprompt", (2.0, 3.0)), ("mvp", (4.0, -1.0))):
        for seed, delta in enumerate(seed_deltas, 1):
            scores[(method, "baseline", seed)] = 50.0
            scores[(method, "router", seed)] = 50.0 + signs[method] * delta
    scores[("flyprompt", "full", 1)] = scores[("flyprompt", "full", 2)] = 60.0
    _write_runs(tmp_path, scores, dataset="cifar100-like")
    result = summary.ProxySummary(summary.load_runs(tmp_path, "cifar100-like"), "cifar100-like")
    assert result.paper_sign("+REAR") == "+REAR: the paper's sign for 2 of 2 methods on the mean, for 1 on every seed"
