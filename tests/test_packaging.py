"""Packaging contract: what is installed, what the core imports, and the README/CI contract."""

from __future__ import annotations

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
