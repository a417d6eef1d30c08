"""The result rows of one harness: (check, status, title, detail), printed as they come.

Status words: PASS, FAIL, ERROR (the check itself crashed), N/A, REFUSED (``retrofit`` raised: a refusal
with a reason is an acceptable outcome), INFO.
"""

from __future__ import annotations

import traceback
from typing import Any, Callable, Dict, List


class Report:
    def __init__(self, name: str, meta: Dict[str, Any], *, show_tracebacks: bool = False) -> None:
        self.name, self.meta, self.rows = name, meta, []
        self.show_tracebacks = show_tracebacks
        print(f"== {name}")
        for key, value in meta.items():
            print(f"   {key}: {value}")

    def add(self, key: str, status: str, title: str, detail: str = "") -> None:
        self.rows.append(dict(check=key, status=status, title=title, detail=detail))
        print(f"{status:7} ({key}) {title}" + (f": {detail}" if detail else ""), flush=True)

    def guard(self, key: str, title: str, check: Callable[[], None]) -> None:
        """Run ``check``; a crash becomes an ERROR row (a result, not the end of the harness)."""
        try:
            check()
        except Exception as error:  # noqa: BLE001 - a check's crash is a result too
            self.add(key, "ERROR", title, f"{type(error).__name__}: {error}".replace("\n", " ")[:600])
            if self.show_tracebacks:
                traceback.print_exc()

    def to_dict(self) -> Dict[str, Any]:
        return dict(name=self.name, meta=self.meta, checks=self.rows)

    def statuses(self) -> Dict[str, str]:
        return {row["check"]: row["status"] for row in self.rows}

    def failures(self) -> List[str]:
        return [row["check"] for row in self.rows if row["status"] in ("FAIL", "ERROR")]
