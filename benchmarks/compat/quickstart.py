"""The README's Quick start as a check: its python block run unchanged, its printed line against the
README's own "prints `...`" sentence.

The sentence may add "(the last digit may differ ...)": then each number may differ by one unit of its
last printed digit, and nothing else may differ.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional

HEADING = "## Quick start"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class QuickStart:
    code: str  # the first python block of the section, as the README shows it
    expected: str  # what the README says it prints
    last_digit_may_differ: bool


def extract(readme: str) -> QuickStart:
    """The Quick start's code and promised line; ValueError (one line) when the README lacks either."""
    if HEADING not in readme:
        raise ValueError(f"README: expected a section {HEADING!r}")
    section = readme.split(HEADING, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    if block is None:
        raise ValueError(f"README: expected a ```python block under {HEADING!r}")
    after = section[block.end():]
    promise = re.match(r"\s*prints `([^`]+)`([^\n]*)", after)
    if promise is None:
        raise ValueError(f"README: expected 'prints `...`' right after the {HEADING!r} block")
    return QuickStart(block.group(1), promise.group(1), "last digit may differ" in promise.group(2))


def _unit(number: str) -> float:
    """One unit of the last printed digit: 0.01 for "0.96", 1 for "12"."""
    return 10.0 ** -len(number.split(".")[1]) if "." in number else 1.0


def _shape(line: str) -> str:
    """The line with each number replaced by its number of decimals: what must match exactly."""
    return _NUMBER.sub(lambda m: f"#{len(m.group().partition('.')[2])}", line)


def difference(printed: str, quick_start: QuickStart) -> Optional[str]:
    """None when ``printed`` (the run's output) ends with the promised line, else what differs."""
    lines = [line for line in printed.splitlines() if line.strip()]
    if not lines:
        return "printed nothing"
    got, want = lines[-1].strip(), quick_start.expected
    if _shape(got) != _shape(want):
        return f"printed {got!r}, the README says {want!r}"
    tolerance: List[float] = [_unit(n) * 1.000001 if quick_start.last_digit_may_differ else 0.0
                              for n in _NUMBER.findall(want)]
    for value, promised, allowed in zip(_NUMBER.findall(got), _NUMBER.findall(want), tolerance):
        if abs(float(value) - float(promised)) > allowed:
            return f"printed {got!r}, the README says {want!r}"
    return None
