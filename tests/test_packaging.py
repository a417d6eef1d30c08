"""Packaging contract: what is installed, what the core imports, and the README/CI contract."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, cwd: Path) -> str:
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_core_imports_nothing_beyond_torch_and_numpy(tmp_path):
    out = run_python(
        "import sys, torch\n"
        "before = set(sys.modules)\n"
        "import fly_modules, fly_modules.adapters, fly_modules.distributed\n"
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))\n",
        tmp_path,
    )
    new_top_level = set(eval(out))
    assert new_top_level <= {"fly_modules", "numpy"}, new_top_level


def test_no_top_level_adapters_or_benchmarks_package_is_installed(tmp_path):
    out = run_python(
        "import importlib.util as u, fly_modules.adapters\n"
        "print(u.find_spec('adapters'), u.find_spec('benchmarks'), fly_modules.adapters.__name__)\n",
        tmp_path,
    )
    assert out.split() == ["None", "None", "fly_modules.adapters"]


def test_wheel_contents(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("fly_modules-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"fly_modules"}
    assert "fly_modules/adapters/__init__.py" in names
    licences = [n for n in names if n.endswith(("dist-info/LICENSE", "dist-info/licenses/LICENSE"))]
    assert licences, f"the wheel ships no LICENSE: {names}"
    assert zipfile.ZipFile(wheel).read(licences[0]).decode() == (ROOT / "LICENSE").read_text()
    metadata = next(n for n in names if n.endswith("METADATA"))
    requires = [line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines() if line.startswith("Requires-Dist")]
    core = [line for line in requires if "extra ==" not in line]
    assert sorted(re.split(r"[<>=; ]", line.split(": ")[1])[0] for line in core) == ["numpy", "torch"]


def readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(heading, 1)[1]
    return re.search(r"```(?:bash|python)\n(.*?)```", section, re.S).group(1)


def test_ci_runs_exactly_the_readme_test_command():
    command = readme_block("### Run the tests").strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci


def test_readme_quick_start_runs(tmp_path):
    code = readme_block("## Quick start")
    out = run_python(code, tmp_path)
    routing, accuracy = map(float, re.findall(r"accuracy (\d\.\d+)", out))
    assert routing >= 0.9 and accuracy >= 0.8, out


def test_the_licence_and_the_citation_name_what_the_readme_names():
    """LICENSE is the MIT licence setup.cfg declares; CITATION.cff cites the paper the README cites."""
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    assert re.search(r"^license = MIT$", (ROOT / "setup.cfg").read_text(), re.M)
    citation = (ROOT / "CITATION.cff").read_text()
    readme = (ROOT / "README.md").read_text()
    assert citation.startswith("cff-version: 1.2.0\n")
    paper = re.search(r'^  title: "(.*)"$', citation.split("preferred-citation:", 1)[1], re.M).group(1)
    assert paper.replace(" ", "") in readme.replace("\n> ", "").replace(" ", ""), paper
    arxiv = re.search(r"arXiv:(\d{4}\.\d{5})", citation).group(1)
    assert f"arxiv.org/abs/{arxiv}" in readme


def module_level_nodes(tree: ast.AST):
    """Every node of a module outside its functions (what runs on import)."""
    for node in ast.iter_child_nodes(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
            yield from module_level_nodes(node)


def test_the_checkout_is_made_importable_in_one_place():
    """``benchmarks/`` runs with ``python -m`` from the checkout; only the main job's entry, which also runs
    as a file, puts the checkout on ``sys.path`` when imported (the upstream harnesses add checkouts of
    other repositories inside functions)."""
    bootstraps = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        for node in module_level_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.path.insert", "sys.path.append"):
                bootstraps.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert [b.split(":")[0] for b in bootstraps] == ["benchmarks/cross_ablation.py"], bootstraps
