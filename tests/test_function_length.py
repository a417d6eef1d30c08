"""Functions fit on a screen: at most 60 lines, decorators and docstring included, in the folders and
modules listed here (read from the source with ``ast``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60
#: folders whose every module is held to the limit, and single modules
HELD = ["fly_modules", "benchmarks/ablation/cli.py", "benchmarks/ablation/arguments.py", "benchmarks/ablation/sweep.py",
        "benchmarks/ablation/sweep_data.py", "benchmarks/ablation/execution.py", "benchmarks/ablation/cost.py"]


def held_files():
    for entry in HELD:
        path = ROOT / entry
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def long_functions(source: str, limit: int = LIMIT):
    """``(name, first line, length)`` of every function in ``source`` longer than ``limit`` lines."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if node.end_lineno - first + 1 > limit:
                yield node.name, first, node.end_lineno - first + 1


def test_the_rule_sees_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    assert [name for name, _, _ in long_functions(f"@decorator\ndef long():\n{body}\n")] == ["long"]
    assert not list(long_functions("def short():\n    return 1\n"))


@pytest.mark.parametrize("path", list(held_files()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_functions_fit_on_a_screen(path):
    found = [f"{name} (line {line}, {length} lines)" for name, line, length in long_functions(path.read_text())]
    assert not found, f"{path.relative_to(ROOT)}: " + "; ".join(found)
