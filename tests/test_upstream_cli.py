"""``python -m benchmarks.upstream``: usage errors are one line with exit status 2, and a checkouts folder
without the repositories gives the whole table with every row skipped (no upstream code is needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_errors import one_line_error

from benchmarks.upstream import cli
from benchmarks.upstream.registry import HARNESSES, REPOSITORIES, ROWS
from benchmarks.upstream.table import HEADER

ROOT = Path(__file__).resolve().parents[1]


def test_missing_checkouts_folder_is_one_line(capsys, tmp_path):
    missing = tmp_path / "nowhere"
    assert f"{missing}: no folder there" in one_line_error(capsys, cli.main, ["--checkouts", str(missing)])


def test_unknown_only_name_lists_the_names(capsys, tmp_path):
    error = one_line_error(capsys, cli.main, ["--checkouts", str(tmp_path), "--only", "flygcl_dualprompt", "bogus"])
    assert "unknown name 'bogus'" in error
    assert all(name in error for name in (*HARNESSES, *REPOSITORIES))


def test_without_checkouts_every_row_is_skipped(tmp_path):
    output = tmp_path / "results.json"
    process = subprocess.run([sys.executable, "-m", "benchmarks.upstream", "--checkouts", str(tmp_path),
                              "--json", str(output)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    lines = process.stdout.splitlines()
    assert lines[0] == HEADER
    rows = lines[2:2 + len(ROWS)]
    assert len(rows) == len(ROWS) and all(row.startswith("| ") for row in rows)
    for row in rows:
        assert "skipped (no checkout at " + str(tmp_path) in row, row
    assert process.stderr.count("\n") == len(HARNESSES)  # one progress line per harness
    results = json.loads(output.read_text())
    assert {r["name"] for r in results["harnesses"]} == set(HARNESSES)
    assert all(r["outcome"] == "skipped" for r in results["harnesses"])


def test_only_selects_by_checkout_folder(tmp_path, capsys):
    assert cli.main(["--checkouts", str(tmp_path), "--only", "MISA"]) == 0
    out = capsys.readouterr().out
    assert "kangzhiq/MISA (`DualPrompt`)" in out and "kangzhiq/MISA (`MVP`)" in out and "FlyGCL" not in out
