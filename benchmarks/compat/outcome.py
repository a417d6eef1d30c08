"""What one check of one environment gave: a status, one line of detail, and its time."""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict

#: the statuses a cell of the table can hold; "not run" when an earlier step of the same environment failed
STATUSES = ("pass", "fail", "not run", "skipped")


@dataclass
class Outcome:
    status: str
    detail: str
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Outcome: expected a status in {STATUSES}, got {self.status!r}")

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @property
    def cell(self) -> str:
        """The table's cell: the status and its detail."""
        return f"{self.status}: {self.detail}" if self.detail else self.status


def timed(check: Callable[..., Outcome]) -> Callable[..., Outcome]:
    """The check's Outcome with its wall-clock seconds filled in."""

    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> Outcome:
        start = time.monotonic()
        outcome = check(*args, **kwargs)
        outcome.seconds = round(time.monotonic() - start, 1)
        return outcome

    return run
