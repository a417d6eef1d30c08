"""The matrix as docs/results/compat/ keeps it: one row per codebase, one column per check (Markdown),
and every row's environment, installed versions and outcomes (JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence

from benchmarks.compat.environments import Environment
from benchmarks.compat.outcome import Outcome

#: the table's columns: a check's name and its header
CHECKS = (("install", "`pip install .`"), ("library", "library tests"), ("quickstart", "README quick start"),
          ("upstream", "upstream checks"))
#: the installed versions a row shows, beside the pins it asked for
SHOWN_PACKAGES = ("torch", "torchvision", "timm", "numpy")


@dataclass
class Row:
    """One codebase's environment and what each check gave in it."""

    environment: Environment
    installed: Dict[str, str] = field(default_factory=dict)  # package -> version, "python" included
    folder: str = ""  # the built environment's folder name (rows with equal pins share one)
    disk_mb: int = 0
    outcomes: Dict[str, Outcome] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        env = self.environment
        return dict(codebase=env.codebase, checkout=env.checkout, python=env.python,
                    requirements=list(env.requirements), pinned_by=env.pinned_by, installed=self.installed,
                    folder=self.folder, disk_mb=self.disk_mb, checks={name: o.to_dict() for name, o in self.outcomes.items()})


def installed_line(installed: Dict[str, str]) -> str:
    """``Python 3.8.18, torch 1.12.1, ...`` of what the environment really holds."""
    shown = [f"Python {installed['python']}"] if "python" in installed else []
    return ", ".join(shown + [f"{name} {installed[name]}" for name in SHOWN_PACKAGES if name in installed])


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: Sequence[Row], command: str, date: str, host: str) -> str:
    header = "| codebase | environment (installed) | " + " | ".join(title for _, title in CHECKS) + " |"
    lines = ["# Compatibility matrix", "", f"`{command}` on {date} ({host}); see `docs/compatibility.md`.", "",
             header, "|" + "---|" * (2 + len(CHECKS))]
    for row in rows:
        cells = [row.environment.codebase, installed_line(row.installed) or row.environment.label]
        cells += [row.outcomes[name].cell if name in row.outcomes else "not asked" for name, _ in CHECKS]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    disk = {row.folder: row.disk_mb for row in rows if row.folder}
    lines += ["", f"Disk used by the environments: {sum(disk.values()) / 1024:.1f} GiB "
                  f"({len(disk)} distinct).", ""]
    return "\n".join(lines)


def scrub(text: str, places: Dict[str, str]) -> str:
    """``text`` with this machine's folders replaced by their names (``CACHE``, ``DIR``, ``~``), the longest
    first: a committed report names no path of the machine that wrote it."""
    for path in sorted((p for p in places if p), key=len, reverse=True):
        text = text.replace(path.rstrip("/"), places[path])
    return text


def to_json(rows: Sequence[Row], command: str, date: str, host: str) -> str:
    return json.dumps(dict(command=command, date=date, host=host, rows=[row.to_dict() for row in rows]),
                      indent=2) + "\n"


def failed(rows: Sequence[Row]) -> List[str]:
    """``codebase: check`` of every failed cell."""
    return [f"{row.environment.checkout}: {name}" for row in rows for name, outcome in row.outcomes.items()
            if outcome.status == "fail"]
