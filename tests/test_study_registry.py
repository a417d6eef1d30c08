"""Every paper table and figure docs/benchmark.md names has a command: each row of its table "The paper's tables
and figures" runs the cross-ablation, a registered ``--study`` or an importable ``python -m`` module; and every
registered study is named there and described in its Studies section."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from benchmarks.studies.command import STUDIES

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmark.md"


def paper_rows() -> list:
    """``(paper, labels, command)`` of each row of the table under "The paper's tables and figures"."""
    section = DOC.read_text().split("### The paper's tables and figures", 1)[1]
    table = re.search(r"\n(\|.*?\|)\n(?!\|)", section + "\n\n", re.S).group(1)
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return [(paper, labels, command.strip("`")) for paper, labels, command in rows]


def command_error(command: str) -> str:
    """What is wrong with a row's command, or ``""``."""
    study = re.search(r"--study (\S+)", command)
    module = re.match(r"python -m (\S+)", command)
    if study:
        return "" if study.group(1) in STUDIES else f"--study {study.group(1)} is not a registered study"
    if module:
        return "" if importlib.util.find_spec(module.group(1)) else f"{module.group(1)} is not a module"
    if command.startswith("python benchmarks/cross_ablation.py"):
        return ""
    return f"no command: {command!r}"


def test_every_paper_table_and_figure_the_docs_name_has_a_command():
    rows = paper_rows()
    assert len(rows) >= len(STUDIES)
    errors = [f"{paper} ({labels}): {command_error(command)}" for paper, labels, command in rows if command_error(command)]
    assert not errors, "\n".join(errors)


def test_every_registered_study_is_in_the_docs_table_and_described():
    commands = " ".join(command for _, _, command in paper_rows())
    studies_section = DOC.read_text().split("## Studies", 1)[1]
    for name in STUDIES:
        assert f"--study {name}" in commands, f"--study {name} has no row in docs/benchmark.md's paper table"
        assert f"`--study {name}`" in studies_section, f"--study {name} is not described in docs/benchmark.md"


def test_the_check_fails_on_a_row_without_a_command_or_with_an_unknown_study():
    assert command_error("-") and command_error("")
    assert "not a registered study" in command_error("python benchmarks/cross_ablation.py --study nonsense")
    assert "not a module" in command_error("python -m benchmarks.studies.nonsense")
