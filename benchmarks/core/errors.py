"""The command line's user error: what every layer of the benchmarks raises for a bad value (one line, exit 2)."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """A command-line value is invalid, or the machine lacks something the sweep needs (exit status 2)."""
