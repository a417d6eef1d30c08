"""benchmarks/requirements.py: an older Python or torch gets one line naming what the benchmarks need."""

import ast
import configparser
import re
import subprocess
import sys
from pathlib import Path

from benchmarks import requirements

ROOT = Path(__file__).resolve().parents[1]


def test_an_older_python_or_torch_gets_one_line(monkeypatch):
    installed = {"Python": "3.8.18", "torch": "1.12.1+cu102"}
    monkeypatch.setattr(requirements, "_installed", installed.get)
    message = requirements.unmet()
    assert "\n" not in message and "Python >= 3.10 and torch >= 2.0" in message
    assert "found Python 3.8.18, torch 1.12.1+cu102" in message
    installed.update(Python="3.10.13", torch="2.0.1")
    assert requirements.unmet() is None
    installed["torch"] = None
    assert "torch not installed" in requirements.unmet()


def test_the_check_runs_before_any_other_benchmark_module():
    tree = ast.parse((ROOT / "benchmarks" / "__init__.py").read_text())
    statements = [node for node in tree.body if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Constant)]
    assert isinstance(statements[0], ast.ImportFrom) and statements[0].module == "benchmarks.requirements"
    assert ast.unparse(statements[1]) == "refuse_if_unmet()"


def test_the_bench_extra_states_the_same_requirements():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = [line for line in config["options.extras_require"]["bench"].splitlines() if line.strip()]
    needed = dict(requirements.REQUIREMENTS)
    assert all(line.endswith(f'python_version >= "{needed["Python"][0]}.{needed["Python"][1]}"') for line in lines)
    torch = [line for line in lines if line.startswith("torch>=")]
    assert torch and re.match(r"torch>=(\d+)\.(\d+)", torch[0]).groups() == tuple(map(str, needed["torch"]))


def test_a_command_refuses_in_one_line_without_a_traceback():
    """The check as the entry points run it, the table raised above this environment: status 1, one line."""
    code = ("import benchmarks.requirements as r; r.REQUIREMENTS = (('Python', (99, 0)),); "
            "r.refuse_if_unmet()")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Python >= 99.0" in done.stderr
    assert "Traceback" not in done.stderr
