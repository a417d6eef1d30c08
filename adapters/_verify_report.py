"""What ``Retrofit.verify`` reports: one :class:`Check` per claim, gathered in a :class:`VerifyReport`; and
:func:`attempt`, which turns a check whose run raised into a failed check naming the error."""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional

__all__ = ["Check", "VerifyReport", "attempt"]


@dataclasses.dataclass(frozen=True)
class Check:
    """One verified claim: ``ok`` is ``True``, ``False``, or ``None`` when it does not apply."""

    name: str
    ok: Optional[bool]
    detail: str

    def __str__(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "n/a "}[self.ok]
        return f"[{mark}] {self.name}: {self.detail}"


class VerifyReport:
    """What :meth:`Retrofit.verify` found; ``print(report)`` reads as a list of plain sentences."""

    def __init__(self, title: str, checks: List[Check]) -> None:
        self.title = title
        self.checks = checks

    @property
    def ok(self) -> bool:
        """No check failed."""
        return all(check.ok is not False for check in self.checks)

    @property
    def failures(self) -> List[Check]:
        return [check for check in self.checks if check.ok is False]

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)

    def __str__(self) -> str:
        verdict = "all checks passed" if self.ok else f"{len(self.failures)} check(s) FAILED"
        return "\n".join([f"{self.title}: {verdict}", *(f"  {check}" for check in self.checks)])

    def __repr__(self) -> str:
        return f"VerifyReport(ok={self.ok}, checks={len(self.checks)}, failures={[c.name for c in self.failures]})"


def attempt(name: str, checks: List[Check], action: Callable[[], Optional[Check]]) -> None:
    """Run one check; an exception becomes a failed check naming it."""
    try:
        result = action()
    except Exception as error:  # noqa: BLE001  (any failure of the user's model is reported)
        result = Check(name, False, f"raised {type(error).__name__}: {error}")
    if result is not None:
        checks.append(result)


