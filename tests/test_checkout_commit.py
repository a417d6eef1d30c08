"""One reading of an upstream checkout's commit for every command (``benchmarks.core.checkout_commit``): git
where the checkout is a git checkout, else the ``.upstream_commit`` file of an exported tree, else "unknown";
never the commit of a repository the folder happens to sit in."""

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.core.checkout_commit import COMMIT_FILE, checkout_commit

ROOT = Path(__file__).resolve().parents[1]
HASH = "79a6b51b7d21748dbdc3f981f474f1e3b0f33e0d"


def git(folder: Path, *args: str) -> str:
    identity = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **identity}).stdout.strip()


@pytest.fixture
def repository(tmp_path):
    """A git repository with one commit, holding an exported tree (no .git, a commit file) in a subfolder."""
    git(tmp_path, "init", "-q")
    (tmp_path / "file").write_text("x")
    git(tmp_path, "add", "file")
    git(tmp_path, "commit", "-q", "-m", "one")
    exported = tmp_path / "exported"
    exported.mkdir()
    (exported / COMMIT_FILE).write_text(HASH + "\n")
    return tmp_path


def test_a_git_checkout_an_exported_tree_and_neither(repository, tmp_path_factory):
    assert checkout_commit(repository) == git(repository, "rev-parse", "HEAD")
    assert checkout_commit(repository / "exported") == HASH  # the tree's own commit, not the enclosing repository's
    assert checkout_commit(str(repository / "exported")) == HASH
    bare = tmp_path_factory.mktemp("bare")
    assert checkout_commit(bare) == "unknown"
    (bare / COMMIT_FILE).write_text("\n")
    assert checkout_commit(bare) == "unknown"


def test_vs_reference_reports_an_exported_trees_commit(repository, capsys):
    from benchmarks.speed import vs_reference

    args = vs_reference.parse_args(["--reference-repo", str(repository / "exported"), "--quick"])
    vs_reference.print_settings(args, SimpleNamespace(path=repository / "exported"), "CPU", "timm")
    assert f"(commit {HASH})" in capsys.readouterr().out


def test_the_upstream_command_reads_the_same_way(repository):
    from benchmarks.upstream import registry

    assert registry.checkout_commit is checkout_commit


def test_no_command_asks_git_for_a_checkouts_commit_another_way():
    """``rev-parse`` only in the one reader and where the GPU suite records this project's own commit."""
    allowed = {"benchmarks/core/checkout_commit.py", "benchmarks/gpu/suite.py"}
    found = {path.relative_to(ROOT).as_posix() for path in (ROOT / "benchmarks").rglob("*.py")
             if "rev-parse" in path.read_text()}
    assert found <= allowed, found - allowed


def test_the_fidelity_tables_read_the_same_way():
    from benchmarks.fidelity import comparison

    assert comparison.checkout_commit is checkout_commit
