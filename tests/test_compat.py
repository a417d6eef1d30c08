"""``python -m benchmarks.compat``'s own logic, without building an environment: the environments table,
the cache key, the interpreter search, the README quick start's extraction and comparison, the library
suite's list, the upstream verdicts' comparison, the report; and the child-side modules of
``benchmarks.upstream`` (what runs under an old interpreter) kept to Python 3.8's language."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_errors import one_line_error

from benchmarks.compat import checks, cli, environments, quickstart, report, venvs
from benchmarks.compat.environments import Environment, cache_key, parse_table, select
from benchmarks.compat.outcome import Outcome
from benchmarks.core.errors import UsageError
from benchmarks.upstream import cli as upstream_cli
from benchmarks.upstream.registry import REPOSITORIES

ROOT = Path(__file__).resolve().parents[1]
HEADER = "## The environments\n\n| codebase | checkout | Python | requirements | pinned by |\n|---|---|---|---|---|\n"


def table(*rows: str) -> str:
    return "# page\n\n" + HEADER + "".join(row + "\n" for row in rows) + "\nafter the table\n"


def test_the_committed_table_names_each_upstream_checkout_once_with_its_pins():
    rows = environments.load_environments()
    assert sorted(row.checkout for row in rows) == sorted(name for name, repo in REPOSITORIES.items() if repo.pinned)
    hide = next(row for row in rows if row.checkout == "HiDe-Prompt")
    assert (hide.python, hide.pin("torch"), hide.pin("timm"), hide.pin("numpy")) == ("3.8", "1.13.1", "0.6.7", "1.21.6")
    assert all(row.pin("torch") and row.pin("timm") for row in rows)


def test_a_row_is_read_into_its_fields():
    (row,) = parse_table(table("| a/b | `b` | 3.8 | `torch==1.12.1 timm==0.6.7 numpy<2` | its README |"))
    assert row == Environment("a/b", "b", "3.8", ("torch==1.12.1", "timm==0.6.7", "numpy<2"), "its README")
    assert (row.pin("torch"), row.pin("numpy"), row.pin("scipy")) == ("1.12.1", "<2", "")
    assert row.label == "Python 3.8, torch 1.12.1, timm 0.6.7"


@pytest.mark.parametrize("line, expected", [
    ("| a/b | b | 3.8 | torch==1.12.1 |", "expected 5 cells"),
    ("| a/b | b | 3 | torch==1.12.1 | x |", "expected a Python version such as 3.8, found '3'"),
    ("| a/b | b | 3.8 | torch | x |", "expected pip specifiers such as torch==1.12.1, found 'torch'"),
    ("| a/b | b | 3.8 | `` | x |", "expected pip specifiers"),
    ("| ab | b | 3.8 | torch==2.0 | x |", "expected owner/name and a folder name"),
])
def test_a_bad_row_is_refused_in_one_line_naming_it(line, expected):
    with pytest.raises(UsageError, match="row 2") as error:
        parse_table(table("| a/c | c | 3.10 | torch==2.0.1 | x |", line))
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_a_missing_section_a_wrong_header_and_a_checkout_twice_are_refused():
    with pytest.raises(UsageError, match="expected a section '## The environments'"):
        parse_table("# nothing here\n")
    with pytest.raises(UsageError, match="expected the table's header"):
        parse_table(table().replace("pinned by", "source"))
    with pytest.raises(UsageError, match="found 'b' twice"):
        parse_table(table("| a/b | b | 3.8 | torch==1.12.1 | x |", "| c/b | b | 3.10 | torch==2.0.1 | x |"))


def test_oldest_is_the_oldest_python_then_torch_and_names_are_checkouts():
    rows = parse_table(table("| a/n | new | 3.10 | torch==1.12.1 | x |", "| a/o | old | 3.8 | torch==1.13.1 | x |",
                             "| a/u | unpinned | 3.8 | timm==0.6.7 | x |", "| a/m | mid | 3.8 | torch==1.9.0 | x |"))
    assert [row.checkout for row in select(rows, ["oldest"])] == ["mid"]
    assert [row.checkout for row in select(rows, ["old", "new"])] == ["new", "old"]  # the table's order
    assert select(rows, ["all"]) == rows
    assert [row.checkout for row in select(rows, ["oldest", "new"])] == ["new", "mid"]  # a mix: both rows
    assert select(rows, ["old", "all"]) == rows and select(rows, ["oldest", "mid"]) == select(rows, ["oldest"])
    with pytest.raises(UsageError, match="unknown 'nope'; choose all, oldest or checkouts new, old"):
        select(rows, ["nope"])
    assert select(environments.load_environments(), ["oldest"])[0].label == "Python 3.8, torch 1.12.1, timm 0.6.7"


def test_the_cache_key_changes_with_what_the_environment_holds_and_only_with_it(monkeypatch):
    key = cache_key("3.8.18", ["torch==1.12.1", "timm==0.6.7"])
    assert key == cache_key("3.8.18", ["timm==0.6.7", "torch==1.12.1"])  # order is no content
    assert key != cache_key("3.8.19", ["torch==1.12.1", "timm==0.6.7"])
    assert key != cache_key("3.8.18", ["torch==1.12.0", "timm==0.6.7"])
    monkeypatch.setattr(environments, "TEST_TOOLS", ("pytest",))
    assert key != cache_key("3.8.18", ["torch==1.12.1", "timm==0.6.7"])
    monkeypatch.undo()
    monkeypatch.setattr(environments, "BUILD_FORMAT", environments.BUILD_FORMAT + 1)
    assert key != cache_key("3.8.18", ["torch==1.12.1", "timm==0.6.7"])


def fake_python(folder: Path, version: str) -> Path:
    """An executable that answers the version question as an interpreter of ``version`` would."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"python{version.rsplit('.', 1)[0]}"
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def test_the_interpreter_is_pyenvs_newest_patch_then_the_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    for patch in ("3.8.9", "3.8.18", "3.8.2"):
        fake_python(tmp_path / "pyenv" / "versions" / patch / "bin", patch)
    assert venvs.find_interpreter("3.8") == str(tmp_path / "pyenv/versions/3.8.18/bin/python3.8")
    on_path = fake_python(tmp_path / "bin", "3.9.1")
    assert venvs.find_interpreter("3.9") == str(on_path)
    fake_python(tmp_path / "pyenv" / "versions" / "3.7.1" / "bin", "3.6.0")  # answers another version
    with pytest.raises(UsageError, match=r"^no Python 3.7 interpreter found \(looked under .*pyenv install 3.7$"):
        venvs.find_interpreter("3.7")


def test_only_environments_this_command_built_and_no_row_asks_for_are_removed(tmp_path):
    for name, key in (("kept", "k1"), ("stale", "k0")):
        (tmp_path / name).mkdir()
        (tmp_path / name / venvs.MARKER).write_text(json.dumps(dict(key=key)))
        (tmp_path / f"{name}.log").write_text("")
    (tmp_path / "someone-elses").mkdir()
    assert venvs.remove_stale(tmp_path, ["k1"]) == ["stale"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "kept.log", "someone-elses"]


def test_a_damaged_record_of_a_built_environment_is_rebuilt_not_a_traceback(tmp_path, monkeypatch):
    """An interrupted build leaves a half-written marker: that environment counts as not built."""
    row = environments.Environment("o/r", "r", "3.11", ("torch==2.0",), "test")
    monkeypatch.setattr(venvs, "find_interpreter", lambda python: sys.executable)
    key = venvs.environment_key(row)
    folder = tmp_path / venvs._folder_name(row, key)
    folder.mkdir()
    (folder / venvs.MARKER).write_text('{"key": "' + key)
    ran = []
    monkeypatch.setattr(venvs, "_run_logged", lambda command, *a, **k: ran.append(command) or subprocess.CompletedProcess(
        command, 1, "", "stopped here"))
    with pytest.raises(RuntimeError):
        venvs.ensure_environment(row, tmp_path)
    assert ran and ran[0][1:3] == ["-m", "venv"]  # rebuilt from the start
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / venvs.MARKER).write_text("[1, 2")
    assert venvs.remove_stale(tmp_path, [key]) == ["other"]


def test_the_quick_start_is_read_from_the_readme():
    quick = quickstart.extract((ROOT / "README.md").read_text())
    assert quick.code.startswith("import torch\n") and "hook.remove()" in quick.code
    assert quick.expected.startswith("routing accuracy ") and quick.last_digit_may_differ


def test_a_readme_without_the_block_or_the_promise_is_refused():
    with pytest.raises(ValueError, match="expected a section"):
        quickstart.extract("# title\n")
    with pytest.raises(ValueError, match="expected a ```python block"):
        quickstart.extract("## Quick start\n\nno code\n\n## Next\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="expected 'prints"):
        quickstart.extract("## Quick start\n\n```python\nprint(1)\n```\n\nand nothing said\n")


@pytest.mark.parametrize("printed, tolerant, same", [
    ("setup noise\nrouting accuracy 1.00, accuracy 0.96\n", False, True),
    ("routing accuracy 1.00, accuracy 0.95", True, True),
    ("routing accuracy 0.99, accuracy 0.97", True, True),
    ("routing accuracy 1.00, accuracy 0.95", False, False),
    ("routing accuracy 1.00, accuracy 0.94", True, False),
    ("routing accuracy 1.00, accuracy 0.960", True, False),  # another format is another line
    ("routing accuracy 1.00, acc 0.96", True, False),
    ("", True, False),
])
def test_the_printed_line_is_compared_with_the_promise(printed, tolerant, same):
    quick = quickstart.QuickStart("", "routing accuracy 1.00, accuracy 0.96", tolerant)
    assert (quickstart.difference(printed, quick) is None) == same


def test_the_library_suite_is_read_from_its_file(tmp_path):
    (tmp_path / "tests").mkdir()
    with pytest.raises(ValueError, match="expected tests/library_suite.py"):
        checks.library_tests(tmp_path)
    suite = tmp_path / "tests" / "library_suite.py"
    suite.write_text('"""doc"""\nLIBRARY_TESTS = ["tests/test_router.py", "fly_modules"]\n')
    assert checks.library_tests(tmp_path) == ["tests/test_router.py", "fly_modules"]
    suite.write_text("LIBRARY_TESTS = tuple(sorted(['b', 'a']))\n")
    assert checks.library_tests(tmp_path) == ["a", "b"]
    suite.write_text("LIBRARY_TESTS = 'tests'\n")
    with pytest.raises(ValueError, match="a list of paths, found 'tests'"):
        checks.library_tests(tmp_path)
    installed = tmp_path / "site" / "fly_modules"
    assert checks.pytest_arguments(["tests/test_a.py", "fly_modules"], installed) == [
        "tests/test_a.py", str(installed), f"--ignore={installed / 'adapters'}"]


def test_the_upstream_verdicts_are_compared_harness_by_harness():
    committed = json.loads(checks.UPSTREAM_RESULTS.read_text())["harnesses"]
    assert checks.verdict_differences(committed, committed) == []
    first = committed[0]
    changed = dict(first, checks=[dict(c, status="ERROR", detail="TypeError: x") if c["check"] == "a" else c
                                  for c in first["checks"]])
    assert checks.verdict_differences([changed], committed) == [
        f"{first['name']}: a ERROR (committed a PASS): TypeError: x"]
    crashed = dict(first, outcome="crashed", detail="crashed: ImportError: y", checks=[])
    assert checks.verdict_differences([crashed], committed) == [f"{first['name']}: crashed: ImportError: y "
                                                               "(committed: ran)"]
    shorter = dict(first, checks=first["checks"][:-1])
    assert checks.verdict_differences([shorter], committed)[0].startswith(f"{first['name']}: ")


def test_the_install_check_sees_a_moved_or_removed_package():
    before = {"torch": "1.12.1", "numpy": "1.21.6", "fly-modules": "0.1.0"}
    assert venvs.changed_pins(before, dict(before, scipy="1.7.3", **{"fly-modules": "0.2.0"})) == []
    assert venvs.changed_pins(before, {"torch": "2.0.0", "fly-modules": "0.1.0"}) == [
        "numpy 1.21.6 -> removed", "torch 1.12.1 -> 2.0.0"]


def test_the_dry_run_says_what_would_move():
    output = "Processing ./fly-modules\nWould install fly-modules-0.1.0 nvidia-cublas-cu12-12.1.3.1 torch-2.14.1\n"
    would = venvs.would_install(output)
    assert would == {"fly-modules": "0.1.0", "nvidia-cublas-cu12": "12.1.3.1", "torch": "2.14.1"}
    assert venvs.changed_pins({"torch": "1.13.0", "numpy": "1.23.4"}, dict({"numpy": "1.23.4"}, **would)) == [
        "torch 1.13.0 -> 2.14.1"]


def test_the_report_has_a_row_per_codebase_and_a_cell_per_check():
    old = Environment("a/b", "b", "3.8", ("torch==1.12.1", "timm==0.6.7"), "x")
    new = Environment("a/c", "c", "3.10", ("torch==2.0.1", "timm==0.6.12"), "y")
    rows = [report.Row(old, dict(python="3.8.18", torch="1.12.1+cu102", timm="0.6.7"), "env-a", 2048,
                       dict(install=Outcome("pass", "accepted"), library=Outcome("fail", "1 failed | 2 passed"))),
            report.Row(new, {}, "", 0, dict(install=Outcome("fail", "pip install .: no"),
                                             library=Outcome("not run", "")))]
    text = report.markdown(rows, "python -m benchmarks.compat", "2026-01-01", "host")
    lines = [line for line in text.splitlines() if line.startswith("| a/")]
    assert lines[0] == ("| a/b | Python 3.8.18, torch 1.12.1+cu102, timm 0.6.7 | pass: accepted | "
                        "fail: 1 failed \\| 2 passed | not asked | not asked |")
    assert lines[1] == "| a/c | Python 3.10, torch 2.0.1, timm 0.6.12 | fail: pip install .: no | not run | not asked | not asked |"
    assert "`python -m benchmarks.compat` on 2026-01-01" in text and "2.0 GiB (1 distinct)" in text
    data = json.loads(report.to_json(rows, "cmd", "2026-01-01", "host"))
    assert data["rows"][0]["checks"]["library"] == dict(status="fail", detail="1 failed | 2 passed", seconds=0.0)
    assert report.failed(rows) == ["b: library", "c: install"]


def test_the_report_names_no_folder_of_this_machine():
    places = {"/home/u/.cache/fly-modules/envs": "CACHE", "/home/u": "~", "/tmp": "TMP", "": "never"}
    text = "ImportError (/home/u/.cache/fly-modules/envs/py3.8/lib/x.py), /tmp/fly_x/a.py, /home/u/b"
    assert report.scrub(text, places) == "ImportError (CACHE/py3.8/lib/x.py), TMP/fly_x/a.py, ~/b"


def test_usage_errors_are_one_line_before_anything_is_built(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(venvs, "ensure_environment", lambda *a, **k: pytest.fail("built an environment"))
    assert "unknown 'nope'" in one_line_error(capsys, cli.main, ["--envs", "nope", "--checks", "library"])
    assert "--checks" in one_line_error(capsys, cli.main, ["--checks", "library,bogus"])
    assert "--checkouts: expected the folder" in one_line_error(capsys, cli.main, ["--envs", "oldest"])
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "no Python 3.8 interpreter found" in one_line_error(capsys, cli.main, ["--envs", "oldest", "--checks",
                                                                                   "library"])


@pytest.fixture
def nothing_built(monkeypatch):
    """Every interpreter found (this one) and no environment built: a command line that gets as far fails."""
    monkeypatch.setattr(venvs, "find_interpreter", lambda minor: sys.executable)
    monkeypatch.setattr(venvs, "ensure_environment", lambda *a, **k: pytest.fail("built an environment"))


def test_oldest_mixed_with_a_checkout_name_runs_both_rows(nothing_built):
    args = cli.build_parser().parse_args(["--envs", "oldest", "FlyGCL", "--checks", "library"])
    assert [row.checkout for row in cli.resolve(args)] == ["l2p-pytorch", "FlyGCL"]


def test_a_cache_that_is_a_file_is_one_line_before_any_work(capsys, tmp_path, nothing_built):
    cache = tmp_path / "a-file"
    cache.write_text("the user's")
    for value in (cache, cache / "under"):
        error = one_line_error(capsys, cli.main, ["--envs", "oldest", "--checks", "install", "--cache", str(value)])
        assert "--cache" in error and str(cache) in error, error
    assert cache.read_text() == "the user's" and os.listdir(tmp_path) == ["a-file"]


def test_a_checkouts_folder_without_the_rows_checkouts_is_refused_before_any_build(capsys, tmp_path, nothing_built):
    empty = tmp_path / "checkouts"
    empty.mkdir()
    argv = ["--envs", "FlyGCL", "--checks", "upstream", "--checkouts", str(empty), "--cache", str(tmp_path / "c")]
    error = one_line_error(capsys, cli.main, argv)
    assert f"--checkouts {empty}: no checkout FlyGCL in it" in error, error
    (empty / "FlyGCL").mkdir()  # an empty folder is no checkout either
    assert "no checkout FlyGCL" in one_line_error(capsys, cli.main, argv)
    assert "no checkout l2p-pytorch, FlyGCL" in one_line_error(capsys, cli.main, ["--envs", "oldest", *argv[1:]])
    assert sorted(os.listdir(tmp_path)) == ["checkouts"]  # no cache folder made


def test_the_reported_command_names_no_path_of_this_machine(tmp_path):
    args = cli.build_parser().parse_args(["--envs", "oldest", "--checks", "quickstart", "--checkouts",
                                          str(tmp_path)])
    assert args.checks == ("install", "quickstart")
    assert cli.command_line(args) == "python -m benchmarks.compat --envs oldest --checks install,quickstart --checkouts DIR"


def test_upstream_python_must_run_the_harnesses(capsys, tmp_path):
    error = one_line_error(capsys, upstream_cli.main, ["--checkouts", str(tmp_path), "--python", str(tmp_path / "no")])
    assert f"--python: {tmp_path / 'no'}: no file there" in error  # refused when parsed
    other = fake_python(tmp_path / "bin", "3.8.18")  # answers, but not as the probe asks
    assert "--python: expected a Python interpreter" in one_line_error(
        capsys, upstream_cli.main, ["--checkouts", str(tmp_path), "--python", str(other)])
    bare = tmp_path / "bare"
    bare.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'timm'\" >&2\nexit 1\n")
    bare.chmod(0o755)
    error = one_line_error(capsys, upstream_cli.main, ["--checkouts", str(tmp_path), "--python", str(bare)])
    assert "cannot import torch, timm and fly_modules (ModuleNotFoundError: No module named 'timm')" in error


def test_the_child_sees_the_benchmarks_and_not_the_checkouts_sources(tmp_path):
    folder = upstream_cli.benchmarks_only(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["benchmarks"]
    assert (folder / "benchmarks" / "upstream" / "child.py").is_file()
    assert "PYTHONPATH" not in upstream_cli.child_env(1)


# --- what runs under the old interpreter: the child, its harnesses and everything they import --------------

def child_side_modules() -> list:
    """``benchmarks.upstream.child``, every harness, and the benchmarks modules they import, transitively."""
    names = ["benchmarks.upstream.child"] + [f"benchmarks.upstream.harnesses.{p.stem}" for p in
                                             (ROOT / "benchmarks/upstream/harnesses").glob("*.py")]
    seen = {}
    while names:
        name = names.pop()
        path = ROOT / (name.replace(".", "/") + ".py")
        if name in seen or not path.is_file():
            path = ROOT / name.replace(".", "/") / "__init__.py"
            if name in seen or not path.is_file():
                continue
        seen[name] = path
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchmarks"):
                names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return sorted(seen.values())


_NEWER_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}


def runtime_syntax_newer_than_38(path: Path) -> list:
    """Expressions Python 3.8 refuses when evaluated: ``X | Y`` types and ``list[int]`` generics, in
    annotations of a module without ``from __future__ import annotations``, and ``list[int]`` or
    ``X | None`` anywhere else."""
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
                    any(a.name == "annotations" for a in n.names) for n in tree.body)
    in_annotation = set()
    for node in ast.walk(tree):
        for child in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if child is not None:
                in_annotation.update(id(n) for n in ast.walk(child))
    found = []
    for node in ast.walk(tree):
        annotated = id(node) in in_annotation
        if annotated and postponed:
            continue
        generic = isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
            node.value.id in _NEWER_GENERICS
        union = isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and (annotated or any(
            isinstance(side, ast.Constant) and side.value is None for side in (node.left, node.right)))
        if generic or union:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_the_child_side_modules_keep_to_python_38():
    modules = child_side_modules()
    relative = {p.relative_to(ROOT).as_posix() for p in modules}
    assert {"benchmarks/upstream/child.py", "benchmarks/upstream/checks.py", "benchmarks/flags.py"} <= relative
    assert "benchmarks/upstream/cli.py" not in relative  # the parent side may use what the benchmarks need
    found = [problem for path in modules for problem in runtime_syntax_newer_than_38(path)]
    assert not found, "\n".join(found)


def test_the_38_check_sees_a_planted_newer_expression(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    module = tmp_path / "m.py"
    module.write_text("from __future__ import annotations\ndef f(x: int | None) -> list[int]: ...\n")
    assert runtime_syntax_newer_than_38(module) == []
    module.write_text("def f(x: int | str): ...\nALIAS = dict[str, int]\nOPTIONAL = int | None\nFLAGS = 1 | 2\n")
    assert runtime_syntax_newer_than_38(module) == ["m.py:1: int | str", "m.py:2: dict[str, int]",
                                                    "m.py:3: int | None"]
    module.write_text("match x:\n    case 1: pass\n")
    with pytest.raises(SyntaxError):
        runtime_syntax_newer_than_38(module)


def test_the_child_side_modules_compile_under_a_real_python_38():
    try:
        python = venvs.find_interpreter("3.8")
    except UsageError:
        pytest.skip("no Python 3.8 interpreter on this machine")
    sources = [str(p) for p in child_side_modules()]
    done = subprocess.run([python, "-c", "import sys\nfor p in sys.argv[1:]: compile(open(p).read(), p, 'exec')",
                           *sources], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""))
    assert done.returncode == 0, done.stderr


def test_an_environment_the_registry_cannot_build_is_a_failed_row_not_a_crash(tmp_path, monkeypatch, capsys):
    def refuse(row, cache, rebuild=False):
        raise RuntimeError("pip install torch==1.12.1: ERROR: No matching distribution found for torch==1.12.1")

    monkeypatch.setattr(venvs, "find_interpreter", lambda minor: sys.executable)
    monkeypatch.setattr(venvs, "ensure_environment", refuse)
    output = tmp_path / "matrix.json"
    status = cli.main(["--envs", "oldest", "--checks", "library,quickstart", "--cache", str(tmp_path / "cache"),
                       "--json", str(output)])
    assert status == 1
    (row,) = json.loads(output.read_text())["rows"]
    assert row["checks"]["install"]["status"] == "fail"
    assert "No matching distribution found for torch==1.12.1" in row["checks"]["install"]["detail"]
    assert row["checks"]["library"] == dict(status="not run", detail="the install failed", seconds=0.0)
    assert "failed: l2p-pytorch: install" in capsys.readouterr().err
