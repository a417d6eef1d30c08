"""Functions fit on a screen: none in ``fly_modules/``, ``adapters/``, ``benchmarks/ablation/``,
``benchmarks/upstream/``, ``benchmarks/studies/`` or ``benchmarks/fidelity/`` is longer than 60 lines (from its ``def`` line to its last line, nested functions
and methods included), apart from the declarative tables named in :data:`TABLES`.

Read from the source with ``ast`` (nothing is imported).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60
FOLDERS = ("fly_modules", "adapters", "benchmarks/ablation", "benchmarks/upstream", "benchmarks/studies", "benchmarks/fidelity")
#: (file, qualified function name) -> why it may be longer: declarative tables (flag tables, data tables) only.
TABLES: Dict[Tuple[str, str], str] = {}


def function_lengths(tree: ast.AST, prefix: str = "") -> Iterator[Tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function and method of ``tree``, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node.lineno, node.end_lineno - node.lineno + 1
            yield from function_lengths(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from function_lengths(node, f"{prefix}{node.name}.")
        else:
            yield from function_lengths(node, prefix)


def long_functions(folder: str) -> Dict[Tuple[str, str], str]:
    """(file, function) -> ``file:line function (N lines)`` for each function of ``folder`` over the limit."""
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for name, line, lines in function_lengths(ast.parse(path.read_text(), relative)):
            if lines > MAX_LINES:
                found[relative, name] = f"{relative}:{line} {name} ({lines} lines)"
    return found


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_function_is_longer_than_a_screen(folder):
    found = long_functions(folder)
    too_long = [where for key, where in found.items() if key not in TABLES]
    assert not too_long, f"longer than {MAX_LINES} lines (split them, or name a declarative table in TABLES): " + (
        "; ".join(too_long))
    stale = [key for key in TABLES if key[0].startswith(folder + "/") and key not in found]
    assert not stale, f"TABLES names functions that are no longer than {MAX_LINES} lines or no longer exist: {stale}"


def test_lengths_are_read_from_def_to_last_line_nested_functions_included():
    """The rule would pass vacuously if the reader missed functions."""
    body = "".join(f"            x{i} = {i}\n" for i in range(MAX_LINES - 2))
    source = f"class A:\n    def method(self):\n        def inner():\n{body}            return 0\n        return inner\n"
    lengths = {name: lines for name, _, lines in function_lengths(ast.parse(source))}
    assert lengths == {"A.method": MAX_LINES + 2, "A.method.inner": MAX_LINES}
    assert sum(1 for folder in FOLDERS for path in (ROOT / folder).rglob("*.py")
               for _ in function_lengths(ast.parse(path.read_text()))) > 500
