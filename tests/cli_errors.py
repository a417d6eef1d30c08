"""What the command-line tests share: a refused command line exits with status 2 and one ``error: ...``
line on stderr (the ``no_work`` fixture in conftest.py checks it was refused before any work)."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence


def one_line_error(capsys, main: Callable[[Optional[Sequence[str]]], int], argv: List[str], *,
                   quiet: bool = True) -> str:
    """``main(argv)``'s error line, asserting exit status 2, one line starting with ``error: `` on stderr
    and, when ``quiet``, nothing on stdout."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" or not quiet
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    return captured.err
