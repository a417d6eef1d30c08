"""The walk over every command of ``benchmarks/`` that the command-line tests share: each module with a
``main(argv)``, the parser it builds (read without running it), and a command line's outcome stopped as soon
as it is parsed (so that no command does any work)."""

from __future__ import annotations

import argparse
import importlib
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


class _Captured(BaseException):
    """Raised in place of parsing: carries the parser a command built (BaseException: no handler of the
    command catches it)."""


class _Accepted(BaseException):
    """Raised when a command line was parsed without error, so that the command does no work."""


def commands() -> Dict[str, Callable[..., Any]]:
    """``module name -> main`` for every module of ``benchmarks/`` that defines ``main`` (the entry of a
    command), ``__main__`` files left out (importing one runs it)."""
    found = {}
    for path in sorted(BENCHMARKS.rglob("*.py")):
        if path.name != "__main__.py" and re.search(r"^def main\(", path.read_text(), re.MULTILINE):
            name = ".".join(path.relative_to(BENCHMARKS.parent).with_suffix("").parts)
            found[name] = importlib.import_module(name).main
    return found


COMMANDS = commands()


@contextmanager
def parsing(monkeypatch, replacement: Callable[..., Any]) -> Iterator[None]:
    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", replacement)
        yield


def parser_of(main: Callable[..., Any], monkeypatch) -> argparse.ArgumentParser:
    """The parser ``main`` builds, read at its first parse (nothing of the command runs)."""
    def capture(self, args=None, namespace=None):
        raise _Captured(self)

    with parsing(monkeypatch, capture), pytest.raises(_Captured) as captured:
        main([])
    return captured.value.args[0]


def outcome(main: Callable[..., Any], argv: List[str], monkeypatch, capsys) -> Tuple[Any, str]:
    """``(exit status, stderr)`` of ``main(argv)``, stopped as soon as the command line is accepted."""
    original = argparse.ArgumentParser.parse_known_args

    def parse_then_stop(self, args=None, namespace=None):
        _, extras = original(self, args, namespace)
        if extras:  # as parse_args does
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        raise _Accepted()

    capsys.readouterr()
    with parsing(monkeypatch, parse_then_stop):
        try:
            status = main(argv)
        except SystemExit as exit:
            status = exit.code
        except _Accepted:
            status = "accepted"
    return status, capsys.readouterr().err
