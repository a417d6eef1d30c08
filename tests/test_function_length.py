"""Code fits on a screen, over the whole tree (``fly_modules/``, ``adapters/``, ``benchmarks/``, ``tests/``): no
function is longer than 60 lines (from its ``def`` line to its last line, nested functions and methods included),
apart from the declarative tables named in :data:`TABLES`, and no module is longer than 600 lines, apart from
those named in :data:`LONG_MODULES` with the reason.

Read from the source with ``ast`` (nothing is imported).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60
MAX_MODULE_LINES = 600
FOLDERS = ("fly_modules", "adapters", "benchmarks", "tests")
#: (file, qualified function name) -> why it may be longer: declarative tables (flag tables, data tables) only.
TABLES: Dict[Tuple[str, str], str] = {}
#: file -> why it may be longer than MAX_MODULE_LINES: one concept that cannot be split, or a split under way.
LONG_MODULES: Dict[str, str] = {
}


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


def modules(folder: str) -> Iterator[Tuple[str, str]]:
    """(path from the repository root, source) of every module under ``folder``."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), path.read_text()


def long_functions(folder: str) -> Dict[Tuple[str, str], str]:
    """(file, function) -> ``file:line function (N lines)`` for each function of ``folder`` over the limit."""
    found = {}
    for relative, source in modules(folder):
        for name, line, lines in function_lengths(ast.parse(source, relative)):
            if lines > MAX_LINES:
                found[relative, name] = f"{relative}:{line} {name} ({lines} lines)"
    return found


def long_modules(folder: str) -> Dict[str, int]:
    """file -> lines, for each module of ``folder`` over the limit."""
    lengths = {relative: len(source.splitlines()) for relative, source in modules(folder)}
    return {relative: lines for relative, lines in lengths.items() if lines > MAX_MODULE_LINES}


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_function_is_longer_than_a_screen(folder):
    found = long_functions(folder)
    too_long = [where for key, where in found.items() if key not in TABLES]
    assert not too_long, f"longer than {MAX_LINES} lines (split them, or name a declarative table in TABLES): " + (
        "; ".join(too_long))
    stale = [key for key in TABLES if key[0].startswith(folder + "/") and key not in found]
    assert not stale, f"TABLES names functions that are no longer than {MAX_LINES} lines or no longer exist: {stale}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_module_is_longer_than_its_limit(folder):
    found = long_modules(folder)
    too_long = [f"{relative} ({lines} lines)" for relative, lines in found.items() if relative not in LONG_MODULES]
    assert not too_long, f"longer than {MAX_MODULE_LINES} lines (split them by concept, or say why in LONG_MODULES): " + (
        "; ".join(too_long))
    stale = [name for name in LONG_MODULES if name.startswith(folder + "/") and name not in found]
    assert not stale, f"LONG_MODULES names modules no longer than {MAX_MODULE_LINES} lines or that no longer exist: {stale}"


def test_lengths_are_read_from_def_to_last_line_nested_functions_included():
    """The rule would pass vacuously if the reader missed functions or modules."""
    body = "".join(f"            x{i} = {i}\n" for i in range(MAX_LINES - 2))
    source = f"class A:\n    def method(self):\n        def inner():\n{body}            return 0\n        return inner\n"
    lengths = {name: lines for name, _, lines in function_lengths(ast.parse(source))}
    assert lengths == {"A.method": MAX_LINES + 2, "A.method.inner": MAX_LINES}
    files = [(relative, source) for folder in FOLDERS for relative, source in modules(folder)]
    assert sum(1 for _, source in files for _ in function_lengths(ast.parse(source))) > 2000
    assert {relative.split("/")[0] for relative, _ in files} == set(FOLDERS)
