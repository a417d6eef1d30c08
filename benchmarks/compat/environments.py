"""The pinned environments: the table of ``docs/compatibility.md`` read into rows, and each row's cache key.

The table is the one place the environments are written: one row per codebase, its Python (major.minor)
and its requirements (pip specifiers, the codebase's own pins). Two rows with the same Python and
requirements share one built environment (same key).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from benchmarks.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
TABLE_PAGE = ROOT / "docs" / "compatibility.md"
TABLE_HEADING = "## The environments"
COLUMNS = ("codebase", "checkout", "Python", "requirements", "pinned by")
#: what every environment gets beside its pins, to run the library's tests (installed with the pins, in one
#: resolver call, so that they bend to the pins and never the other way round); tensorboard for the adapters'
#: log_to test, six because torch 1.12's torch.utils.tensorboard imports it
TEST_TOOLS = ("pytest", "hypothesis", "scipy", "tensorboard", "six")
#: a new value rebuilds every cached environment (the way they are built changed)
BUILD_FORMAT = 1

_PYTHON = re.compile(r"\d+\.\d+")
_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?(==|>=|<=|~=|<|>|!=)[0-9][0-9A-Za-z.*+!]*"
                          r"(,(==|>=|<=|~=|<|>|!=)[0-9][0-9A-Za-z.*+!]*)*")


@dataclass(frozen=True)
class Environment:
    """One codebase's pinned environment (a row of the table)."""

    codebase: str  # owner/name as GitHub spells it
    checkout: str  # its folder under --checkouts (the upstream command's name for it)
    python: str  # major.minor
    requirements: Tuple[str, ...]  # pip specifiers, in the table's order
    pinned_by: str  # where the codebase states them

    def pin(self, package: str) -> str:
        """The version the row pins ``package`` to (``==``), or its specifier, or "" when unpinned."""
        for requirement in self.requirements:
            name, spec = re.match(r"([A-Za-z0-9._-]+)(?:\[[^]]*\])?(.*)", requirement).groups()
            if name.lower() == package.lower():
                return spec[2:] if spec.startswith("==") and "," not in spec else spec
        return ""

    @property
    def label(self) -> str:
        """``Python 3.8, torch 1.12.1, timm 0.6.7``: how tables name the environment."""
        return f"Python {self.python}, torch {self.pin('torch') or 'any'}, timm {self.pin('timm') or 'any'}"

    def age(self) -> Tuple[Tuple[int, ...], ...]:
        """Sorts the oldest first: by Python, then torch (an unpinned torch counts as the newest)."""
        torch = re.findall(r"\d+", self.pin("torch")) or ["999"]
        return tuple(map(int, self.python.split("."))), tuple(map(int, torch))


def cache_key(python_version: str, requirements: Sequence[str]) -> str:
    """What a built environment depends on: the interpreter's full version, the pins, the test tools and the
    way it is built. Equal keys, equal environments; any change, a new one."""
    content = json.dumps(dict(python=python_version, requirements=sorted(requirements), tools=list(TEST_TOOLS),
                              format=BUILD_FORMAT), sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def _cells(line: str) -> List[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _row(cells: Sequence[str], number: int) -> Environment:
    where = f"{TABLE_PAGE.name}, environments row {number}"
    if len(cells) != len(COLUMNS):
        raise UsageError(f"{where}: expected {len(COLUMNS)} cells ({', '.join(COLUMNS)}), found {len(cells)}")
    codebase, checkout, python, requirements, pinned_by = (cell.strip("`") for cell in cells)
    if not _PYTHON.fullmatch(python):
        raise UsageError(f"{where}: expected a Python version such as 3.8, found {python!r}")
    specifiers = tuple(requirements.replace("`", "").split())
    bad = [s for s in specifiers if not _REQUIREMENT.fullmatch(s)]
    if not specifiers or bad:
        raise UsageError(f"{where}: expected pip specifiers such as torch==1.12.1, found {bad[0] if bad else '—'!r}")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", codebase) or not re.fullmatch(r"[\w.-]+", checkout):
        raise UsageError(f"{where}: expected owner/name and a folder name, found {codebase!r} and {checkout!r}")
    return Environment(codebase, checkout, python, specifiers, pinned_by)


def parse_table(text: str) -> List[Environment]:
    """The rows of the table under ``## The environments`` (one-line UsageError naming the row otherwise)."""
    if TABLE_HEADING not in text:
        raise UsageError(f"{TABLE_PAGE.name}: expected a section {TABLE_HEADING!r} holding the environments table")
    lines = text.split(TABLE_HEADING, 1)[1].splitlines()
    table = _table_lines(lines)
    if len(table) < 3 or tuple(_cells(table[0])) != COLUMNS:
        raise UsageError(f"{TABLE_PAGE.name}: expected the table's header | {' | '.join(COLUMNS)} | under "
                         f"{TABLE_HEADING!r}")
    rows = [_row(_cells(line), number) for number, line in enumerate(table[2:], 1)]
    checkouts = [row.checkout for row in rows]
    twice = sorted({name for name in checkouts if checkouts.count(name) > 1})
    if twice:
        raise UsageError(f"{TABLE_PAGE.name}: expected one row per checkout, found {twice[0]!r} twice")
    return rows


def _table_lines(lines: Sequence[str]) -> List[str]:
    """The first run of ``|`` lines (the section's table)."""
    started, table = False, []
    for line in lines:
        if line.startswith("|"):
            started = True
            table.append(line)
        elif started:
            break
    return table


def load_environments(page: Path = TABLE_PAGE) -> List[Environment]:
    return parse_table(page.read_text())


#: the words ``--envs`` takes beside checkout names: each names a set of rows
SELECTIONS = ("all", "oldest")


def select(environments: Sequence[Environment], names: Sequence[str]) -> List[Environment]:
    """The rows that any of ``names`` names, in the table's order: ``all``, ``oldest`` (the oldest Python and
    torch) and checkout folder names, mixed at will (``oldest FlyGCL``: the oldest row and FlyGCL's)."""
    known: Dict[str, Environment] = {row.checkout: row for row in environments}
    unknown = [name for name in names if name not in known and name not in SELECTIONS]
    if unknown:
        raise UsageError(f"--envs: unknown {unknown[0]!r}; choose all, oldest or checkouts {', '.join(known)} "
                         "(several may be given)")
    chosen = set()
    for name in names:
        if name == "all":
            chosen.update(known)
        elif name == "oldest":
            chosen.add(min(environments, key=Environment.age).checkout)
        else:
            chosen.add(name)
    return [row for row in environments if row.checkout in chosen]
