"""Pinned environments built from the package registry, cached by key, and the project installed in them.

An environment is a plain virtual environment of the wanted interpreter with the row's requirements and
the test tools installed in one pip call. It is reused while its key (interpreter version, pins, tools)
is unchanged: the key is written last, so a build that stopped half way is never reused. The project
itself is installed on every run, from a clean copy of the tree, with a plain ``pip install DIR``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from benchmarks.compat.environments import TEST_TOOLS, Environment, cache_key
from benchmarks.compat.outcome import Outcome, timed
from benchmarks.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
MARKER = "fly-compat.json"  # written last by a complete build
PROJECT = "fly-modules"


def clean_env(bin_dir: Optional[Path] = None) -> Dict[str, str]:
    """This process's environment without what would leak its own Python setup into another interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1")
    if bin_dir is not None:
        env["PATH"] = os.pathsep.join((str(bin_dir), env.get("PATH", "")))
    return env


def python_version(python: object) -> Optional[str]:
    """The interpreter's full version (3.8.18), or None when it does not run."""
    try:
        done = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                              capture_output=True, text=True, timeout=60, env=clean_env(), cwd=Path.home())
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_interpreter(minor: str) -> str:
    """A working ``python<minor>``: pyenv's installs first (newest patch), then the PATH's; one line if none."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    patches = sorted(glob.glob(str(root / "versions" / f"{minor}.*" / "bin" / f"python{minor}")),
                     key=lambda p: [int(n) for n in re.findall(r"\d+", Path(p).parents[1].name)], reverse=True)
    on_path = shutil.which(f"python{minor}")
    for candidate in [*patches, *([on_path] if on_path else [])]:
        version = python_version(candidate)
        if version is not None and version.startswith(minor + "."):
            return candidate
    raise UsageError(f"no Python {minor} interpreter found (looked under {root}/versions/{minor}.* and for "
                     f"python{minor} on PATH): install one, e.g. pyenv install {minor}")


@dataclass(frozen=True)
class Built:
    """A built environment: its folder, interpreter and what it holds."""

    folder: Path
    key: str
    packages: Dict[str, str]  # lower-case name -> version, after the build

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    def disk_mb(self) -> int:
        total = sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file() and not p.is_symlink())
        return round(total / 2**20)


def _run_logged(command: Sequence[str], log: Path, **kwargs) -> subprocess.CompletedProcess:
    """``command`` run from the log's folder (never the tree: ``-m`` would put it on sys.path), its output
    appended to ``log``."""
    done = subprocess.run(list(command), capture_output=True, text=True, cwd=log.parent, **kwargs)
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(map(str, command))}\n{done.stdout}{done.stderr}\n")
    return done


def _failure(done: subprocess.CompletedProcess, what: str) -> str:
    lines = [line for line in (done.stderr or done.stdout or "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return f"{what}: {(errors or lines or [f'exit status {done.returncode}'])[0].strip()}"[:300]


def installed_packages(python: Path) -> Dict[str, str]:
    done = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                          env=clean_env(), timeout=300, check=True, cwd=python.parent)
    return {entry["name"].lower().replace("_", "-"): entry["version"] for entry in json.loads(done.stdout)}


def _folder_name(row: Environment, key: str) -> str:
    return f"py{row.python}-torch{row.pin('torch') or 'any'}-{key[:8]}".replace("<", "").replace(">", "")


def ensure_environment(row: Environment, cache: Path, rebuild: bool = False) -> Built:
    """The row's environment under ``cache``, built now unless a complete build with the same key exists.
    Raises RuntimeError with one line (the pip error) when the registry cannot satisfy the pins."""
    interpreter = find_interpreter(row.python)
    key = environment_key(row)
    folder = cache / _folder_name(row, key)
    marker = folder / MARKER
    recorded = _read_marker(marker)
    if not rebuild and recorded.get("key") == key and isinstance(recorded.get("packages"), dict):
        return Built(folder, key, recorded["packages"])
    if folder.exists():
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = folder.parent / f"{folder.name}.log"
    log.write_text("")
    done = _run_logged([interpreter, "-m", "venv", str(folder)], log, env=clean_env())
    if done.returncode != 0:
        raise RuntimeError(_failure(done, "python -m venv"))
    python = folder / "bin" / "python"
    done = _run_logged([str(python), "-m", "pip", "install", *row.requirements, *TEST_TOOLS], log,
                       env=clean_env(python.parent))
    if done.returncode != 0:
        raise RuntimeError(_failure(done, f"pip install {' '.join(row.requirements)}"))
    packages = installed_packages(python)
    marker.write_text(json.dumps(dict(key=key, python=row.python, requirements=list(row.requirements),
                                      packages=packages), indent=2) + "\n")
    return Built(folder, key, packages)


def _read_marker(marker: Path) -> Dict[str, Any]:
    """A built environment's record; empty when absent or damaged (an interrupted write): then rebuilt."""
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def environment_key(row: Environment) -> str:
    """The row's cache key, with the full version of the interpreter it would be built with."""
    interpreter = find_interpreter(row.python)
    return cache_key(python_version(interpreter) or row.python, row.requirements)


def remove_stale(cache: Path, keys: Sequence[str]) -> List[str]:
    """Remove the environments of ``cache`` that this command built (they hold its marker) and that no row
    asks for any more (their pins changed); returns their names. Nothing else in ``cache`` is touched."""
    removed = []
    for marker in sorted(cache.glob(f"*/{MARKER}")):
        if _read_marker(marker).get("key") not in keys:
            folder = marker.parent
            shutil.rmtree(folder)
            for log in cache.glob(f"{folder.name}.*log"):
                log.unlink()
            removed.append(folder.name)
    return removed


def tree_files() -> List[str]:
    """The tree's files as a fresh clone would have them (tracked, and untracked but not ignored): no virtual
    environment, build folder or result of a local run. A UsageError when the tree is no git checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        raise UsageError(f"expected a git checkout at {ROOT} (the project is copied from it), git said: "
                         f"{listed.stderr.decode().strip()}")
    return [name for name in listed.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


def clean_copy(destination: Path, files: Sequence[str]) -> Path:
    """``files`` of the tree copied under ``destination/fly-modules``."""
    copy = destination / "fly-modules"
    for name in files:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    return copy


def changed_pins(before: Dict[str, str], after: Dict[str, str]) -> List[str]:
    """Packages the project's install replaced or removed: ``torch 1.12.1 -> 2.0.0``."""
    return [f"{name} {version} -> {after.get(name, 'removed')}" for name, version in sorted(before.items())
            if name != PROJECT and after.get(name) != version]


def would_install(dry_run_output: str) -> Dict[str, str]:
    """name -> version of pip's ``Would install a-1.0 b-2.0`` line (``pip install --dry-run``)."""
    found: Dict[str, str] = {}
    for line in dry_run_output.splitlines():
        if line.startswith("Would install "):
            for word in line.split()[2:]:
                name, _, version = word.rpartition("-")
                found[name.lower().replace("_", "-")] = version
    return found


@timed
def install_project(built: Built, copy: Path) -> Outcome:
    """``pip install COPY`` as a user would (no flag), and a check that none of the environment's packages
    moved: a drop-in install must leave the user's torch, numpy and timm as they are. A dry run first: an
    install that would move one is reported without being done, so the cached environment stays pinned."""
    log = built.folder.parent / f"{built.folder.name}.log"
    env = clean_env(built.python.parent)
    _run_logged([str(built.python), "-m", "pip", "uninstall", "-y", PROJECT], log, env=env)
    before = installed_packages(built.python)
    for dry_run in (True, False):
        done = _run_logged([str(built.python), "-m", "pip", "install", *(["--dry-run"] if dry_run else []),
                            str(copy)], log, env=env)
        if done.returncode != 0:
            return Outcome("fail", _failure(done, "pip install ."))
        after = dict(before, **would_install(done.stdout)) if dry_run else installed_packages(built.python)
        moved = changed_pins(before, after)
        if moved:
            if not dry_run:  # the environment is no longer the pinned one: the next run builds it anew
                (built.folder / MARKER).unlink()
            return Outcome("fail", f"pip install . {'would change' if dry_run else 'changed'} the environment: "
                                   f"{', '.join(moved)}")
    return Outcome("pass", "accepted; nothing else moved")


def host_description() -> str:
    return f"Python {sys.version.split()[0]} on {sys.platform}"
