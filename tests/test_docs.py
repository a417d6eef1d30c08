"""The README and docs/ against the tree: the layout names every module, every link resolves, and nothing
points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fly_modules", "adapters", "benchmarks")


def layout_names() -> set:
    block = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    block = re.search(r"```\n(.*?)```", block, re.S).group(1)
    names, folder = set(), ""
    for line in block.splitlines():
        if line and not line.startswith(" "):
            folder = line.split()[0]
            names.add(folder)
            continue
        words = line.split("   ")[0].split()  # names come before the three-space gap of the description
        names.update(f"{folder}{word}" for word in words if word.endswith((".py", "/")))
    return names


def test_the_readme_layout_names_every_module_and_nothing_else():
    named = layout_names()
    for name in sorted(named):
        assert (ROOT / name).exists(), f"the README layout names {name}, which does not exist"
    for package in PACKAGES:
        for path in (ROOT / package).glob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if path.name != "__init__.py" or package != "benchmarks":
                assert relative in named or path.name == "__init__.py", f"{relative} is missing from the README layout"
        for folder in (ROOT / package).iterdir():
            if folder.is_dir() and not folder.name.startswith(("_", ".")):
                assert f"{package}/{folder.name}/" in named, f"{package}/{folder.name}/ is missing from the layout"


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
        for needle in ("../shared", "/work/", "reference-protocol"):
            assert needle not in text, f"{path.relative_to(ROOT)} mentions {needle!r}"


def test_committed_results_name_no_folder_of_the_machine_that_wrote_them():
    for path in sorted((ROOT / "docs" / "results").rglob("*")):
        if path.suffix not in (".json", ".md", ".csv", ".txt"):
            continue
        text = path.read_text()
        for needle in ("/work/", "/tmp/", "/root/", "/home/", "/opt/"):
            assert needle not in text, f"{path.relative_to(ROOT)} mentions {needle!r}"
