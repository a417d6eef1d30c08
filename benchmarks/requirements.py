"""What the benchmarks need beyond the library: read by benchmarks/__init__.py before anything else runs.

The library (fly_modules) supports Python >= 3.8 and torch >= 1.12; the benchmarks use newer syntax and
torch 2 APIs. This file must stay parseable by Python 3.8, so that an older interpreter gets one line
saying what is needed instead of a SyntaxError from a module further down.
"""

import os
import sys

#: set by ``python -m benchmarks.upstream`` for its harness processes, which may run under a user's older
#: environment (--python): the child side (benchmarks.upstream.child, the harnesses and what they import)
#: keeps to Python 3.8 and torch 1.12, as tests/test_compat.py checks
UPSTREAM_CHILD = "FLY_BENCHMARKS_UPSTREAM_CHILD"
REQUIREMENTS = (("Python", (3, 10)), ("torch", (2, 0)))  # the bench extra of setup.cfg states the same


def _installed(name):
    if name == "Python":
        return "{}.{}.{}".format(*sys.version_info[:3])
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # Python < 3.8 has no importlib.metadata
        return None
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _release(text):
    parts = []
    for part in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def unmet():
    """One line naming what the benchmarks need and what is installed, or None when all is met."""
    found = [(name, needed, _installed(name)) for name, needed in REQUIREMENTS]
    short = [(name, needed, have) for name, needed, have in found if have is None or _release(have) < needed]
    if not short:
        return None
    needs = " and ".join("{} >= {}".format(name, ".".join(map(str, needed))) for name, needed in REQUIREMENTS)
    have = ", ".join("{} {}".format(name, have or "not installed") for name, _, have in found)
    return ("the benchmarks need {} (pip install '.[bench]'); found {}. The library alone (fly_modules) "
            "supports Python >= 3.8 and torch >= 1.12".format(needs, have))


def refuse_if_unmet():
    if os.environ.get(UPSTREAM_CHILD) == "1":
        return
    message = unmet()
    if message is not None:
        raise SystemExit(message)
