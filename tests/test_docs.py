"""The README and docs/ against the tree: the layouts name every module and top-level file, every link resolves, and nothing
points outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fly_modules", "adapters", "benchmarks")
#: the folder checkouts are developed in on the machines that wrote this project (spelt so this file does
#: not name it itself)
WORKSPACE = "/" + "work" + "/"


def layout_names() -> set:
    """Every path the module layout (docs/layout.md) names; an indented folder line opens a nested block."""
    block = (ROOT / "docs" / "layout.md").read_text().split("## Layout", 1)[1]
    block = re.search(r"```\n(.*?)```", block, re.S).group(1)
    names, stack = set(), []  # stack of (indent, folder) of the open folder lines
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        words = [w for w in line.strip().split("   ")[0].split() if w.endswith((".py", "/"))] if line.strip() else []
        if not words:
            continue  # a description continued on its own line
        while stack and stack[-1][0] >= indent:
            stack.pop()
        prefix = stack[-1][1] if stack else ""
        names.update(prefix + word for word in words)
        if len(words) == 1 and words[0].endswith("/"):
            stack.append((indent, prefix + words[0]))
    return names


def _expanded(named: set) -> list:
    """Folders whose contents the layout lists (it names something inside them)."""
    return sorted({name for name in named if name.endswith("/") and any(
        other != name and other.startswith(name) for other in named)})


def test_the_module_layout_names_every_module_and_nothing_else():
    named = layout_names()
    for name in sorted(named):
        assert (ROOT / name).exists(), f"docs/layout.md names {name}, which does not exist"
    for package in PACKAGES:
        assert f"{package}/" in _expanded(named), f"docs/layout.md lists nothing inside {package}/"
    for folder in _expanded(named):
        for path in (ROOT / folder).iterdir():
            relative = path.relative_to(ROOT).as_posix()
            if path.is_dir() and not path.name.startswith(("_", ".")):
                assert f"{relative}/" in named, f"{relative}/ is missing from docs/layout.md"
            elif path.suffix == ".py" and path.name not in ("__init__.py", "__main__.py"):
                assert relative in named, f"{relative} is missing from docs/layout.md"


def layout_top_level_files() -> set:
    """The files the README's layout block names at its top level (lines without indent)."""
    block = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    block = re.search(r"```\n(.*?)```", block, re.S).group(1)
    return {word for line in block.splitlines() if line and not line[0].isspace()
            for word in line.split("   ")[0].split() if not word.endswith("/")}


def test_the_readme_layout_names_every_top_level_file():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    files = {name for name in tracked.stdout.splitlines() if "/" not in name and not name.startswith(".")}
    assert files, "git ls-files listed no top-level file"
    assert files == layout_top_level_files(), "the README layout's top-level files differ from the tree's"


def documents():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def test_every_relative_link_resolves():
    for document in documents():
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", document.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            assert (document.parent / target).exists(), f"{document.relative_to(ROOT)} links to missing {target}"


def test_nothing_points_outside_the_repository():
    sources = [*documents(), *ROOT.glob("fly_modules/**/*.py"), *ROOT.glob("adapters/**/*.py"),
               *ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("tests/*.py")]
    for path in sources:
        if path.name == "test_docs.py":
            continue
        text = path.read_text()
        for needle in ("../shared", WORKSPACE, "reference-protocol"):
            assert needle not in text, f"{path.relative_to(ROOT)} mentions {needle!r}"


def test_committed_results_name_no_folder_of_the_machine_that_wrote_them():
    for path in sorted((ROOT / "docs" / "results").rglob("*")):
        if path.suffix not in (".json", ".md", ".csv", ".txt"):
            continue
        text = path.read_text()
        for needle in (WORKSPACE, "/tmp/", "/root/", "/home/", "/opt/"):
            assert needle not in text, f"{path.relative_to(ROOT)} mentions {needle!r}"
