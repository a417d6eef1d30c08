"""The library, its tests and the benchmarks' requirement check parse with Python 3.8's grammar and use no
3.9+ construct that fails only at run time (a subscripted builtin or an ``X | Y`` evaluated, 3.9+ methods).

ruff's target-version stays that of the benchmarks; this test holds the library to the oldest Python it
supports (setup.cfg's python_requires). Only what is cheap to see in the syntax tree is checked.
"""

import ast
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OLDEST = (3, 8)
BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}  # subscriptable from 3.9
NEWER_ATTRIBUTES = {"removeprefix", "removesuffix", "bit_count", "pairwise", "is_relative_to"}
NEWER_KEYWORDS = {"zip": "strict", "dataclass": "slots"}  # 3.10


def _library_files():
    suite = runpy.run_path(str(ROOT / "tests" / "library_suite.py"))["LIBRARY_TESTS"]
    tests = [ROOT / path for path in suite if path.endswith(".py")]
    helpers = [ROOT / "tests" / name for name in ("conftest.py", "library_suite.py", "upstream_cases.py",
                                                   "upstream_standins.py", "flygcl_standins.py")]
    sources = sorted((ROOT / "fly_modules").rglob("*.py")) + sorted((ROOT / "adapters").rglob("*.py"))
    return sources + tests + helpers + [ROOT / "benchmarks" / "__init__.py", ROOT / "benchmarks" / "requirements.py"]


def _annotations(tree):
    """Ids of the nodes inside annotations: not evaluated under ``from __future__ import annotations``."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation is not None:
            roots.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
    return {id(inner) for root in roots for inner in ast.walk(root)}


def _postponed(tree):
    return any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               and any(alias.name == "annotations" for alias in node.names) for node in tree.body)


def runtime_newer_constructs(source):
    """``line: construct`` for each 3.9+ construct evaluated at run time in ``source``."""
    tree = ast.parse(source, feature_version=OLDEST)
    skipped = _annotations(tree) if _postponed(tree) else set()
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in BUILTIN_GENERICS:
            found.append(f"{node.lineno}: {node.value.id}[...] (3.9)")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and _is_type_union(node):
            found.append(f"{node.lineno}: X | Y of types (3.10)")
        elif isinstance(node, ast.Attribute) and node.attr in NEWER_ATTRIBUTES:
            found.append(f"{node.lineno}: .{node.attr} (3.9+)")
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name in NEWER_KEYWORDS and any(keyword.arg == NEWER_KEYWORDS[name] for keyword in node.keywords):
                found.append(f"{node.lineno}: {name}({NEWER_KEYWORDS[name]}=) (3.10)")
    return found


def _is_type_union(node):
    """``None | X`` or ``X | None``, or a union of builtin type names: never bitwise arithmetic."""
    sides = (node.left, node.right)
    named = {"int", "float", "str", "bool", "bytes", "list", "dict", "tuple", "set", "type", "Tensor", "object"}
    return any(isinstance(side, ast.Constant) and side.value is None for side in sides) or all(
        isinstance(side, ast.Name) and side.id in named or isinstance(side, ast.BinOp) for side in sides)


@pytest.mark.parametrize("path", _library_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_parses_and_runs_on_python_3_8(path):
    assert runtime_newer_constructs(path.read_text()) == []


@pytest.mark.parametrize("source", [
    "x: list[int] = []", "isinstance(1, int | str)", "Alias = Optional[int] | None", "'a'.removeprefix('a')",
    "zip([], [], strict=True)", "def f(x: dict[str, int]): pass", "match x:\n    case 1: pass",
])
def test_each_newer_construct_is_seen(source):
    try:
        assert runtime_newer_constructs(source)
    except SyntaxError:  # the grammar itself is 3.10's
        pass


def test_annotations_postponed_are_not_evaluated():
    assert runtime_newer_constructs("from __future__ import annotations\ndef f(x: int | None) -> list[int]: pass") == []
    assert runtime_newer_constructs("flags = 1 | 2\nmask = a | b") == []
