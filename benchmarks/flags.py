"""Command-line flags from rules: the bridge between ``argparse`` and the library's parameter table.

Every value flag of every benchmark command is checked by a rule when it is parsed: a parameter the
library shares (``fly_modules._validation.SHARED_PARAMETERS``: its rule, its default and its help), a
flag many commands share (:data:`COMMON_FLAGS`: ``--threads``, ``--seed``), or a command's own rule
(``Integer(minimum=1)``, ``Real(above=0)``, ...). A refused value, like any other usage error of a
:class:`Parser`, ends in one line on stderr and exit status 2 (``tests/test_parameter_flags.py`` walks
every command's parser to check it).

    parser = Parser(prog="python -m benchmarks.speed.router")
    add_shared_flag(parser, "expansion_dim")                        # --expansion-dim, default 10,000
    add_common_flag(parser, "threads", default=None, help="torch threads (default: all CPUs)")
    add_flag(parser, "--repeats", Integer(minimum=1), default=15, help="measured rounds")
    add_output_flag(parser, "--json", "file", default=None, help="also write the figures here")

Where a command writes is a flag of its own kind, :class:`OutputPath`: a file where a folder is expected
(or a folder where a file is), a path under a file, or a folder that cannot be written is refused when
the flag is parsed, before any work, by the one rule :func:`output_problem`; so is each path a command
writes inside its output folder, declared with the flag (``contents``). Where a command reads a folder or a
file the user names (a checkout, a results folder), its flag is an :class:`InputPath`: a path that is not
there, or is the other kind, is refused when parsed by :func:`input_problem`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from fly_modules._validation import (
    REQUIRED,
    SHARED_PARAMETERS,
    Constraint,
    Decays,
    Integer,
    InvalidParameterError,
    NoneOr,
    OneOf,
    Parameter,
    Ridge,
)

__all__ = ["COMMON_FLAGS", "Checked", "InputPath", "OutputPath", "Parser", "add_common_flag", "add_flag",
           "add_input_flag", "add_output_flag", "add_shared_flag", "input_problem", "output_problem"]

#: flags many commands share, each with its rule and meaning (the default is each command's own)
COMMON_FLAGS: Dict[str, Parameter] = {
    "threads": Parameter(Integer(minimum=1), help="torch intra-op threads"),
    "seed": Parameter(SHARED_PARAMETERS["seed"].rule, help="seed of the models and the generated data"),
}


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, ``error: ... (see --help)``, and
    exit status 2 (instead of the usage block followed by the error)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see --help)\n")


def _number(text: str) -> Union[int, float]:
    """An int if ``text`` spells one, else a float (``nan`` and ``inf`` included: the rules refuse them)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _number_or_text(text: str) -> Union[int, float, str]:
    try:
        return _number(text)
    except argparse.ArgumentTypeError:
        return text


def _numbers(text: str) -> Tuple[Union[int, float], ...]:
    return tuple(_number(item) for item in text.split(","))


def _reader(rule: Constraint) -> Callable[[str], Any]:
    """How the text of a flag checked by ``rule`` is read before the rule converts it."""
    while isinstance(rule, (Parameter, NoneOr)):
        rule = rule.rule
    if isinstance(rule, Decays):
        return _numbers
    if isinstance(rule, (Ridge, OneOf)):
        return _number_or_text if isinstance(rule, Ridge) else str
    return _number


class Checked:
    """The ``type`` of a flag: its text read as the rules expect, then converted by each of ``rules`` in
    turn; a refused value is an ``ArgumentTypeError`` with the rule's message ("threads must be an int
    >= 1, got 0"). ``rules`` stays readable, so a test can derive the values each flag must refuse."""

    def __init__(self, name: str, *rules: Constraint) -> None:
        self.name, self.rules = name, rules
        self.read = _reader(rules[0])
        self.__name__ = name  # argparse names the type in some messages

    def __call__(self, text: str) -> Any:
        value = self.read(text)
        try:
            for rule in self.rules:
                value = rule.convert(value, self.name)
        except InvalidParameterError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return value

    def __repr__(self) -> str:
        return f"Checked({self.name!r}, {', '.join(map(repr, self.rules))})"


def _with_default(text: str, default: Any) -> str:
    if default is None or text == argparse.SUPPRESS or "%(default)" in text:
        return text
    return f"{text} (default: %(default)s)"


def add_flag(parser: Any, flag: str, rule: Constraint, *, default: Any, help: str, **options: Any) -> argparse.Action:
    """``parser.add_argument(flag, ...)`` checked by ``rule`` (the rule's name: the flag's dest), its default
    shown in the help. ``options`` go to ``add_argument`` (``dest``, ``metavar``, ``required``, ...)."""
    name = options.get("dest") or flag.lstrip("-").replace("-", "_")
    return parser.add_argument(flag, type=Checked(name, rule), default=default, help=_with_default(help, default),
                               **options)


def _entry_flag(parser: Any, name: str, entry: Parameter, default: Any, help: Optional[str],
                narrower: Sequence[Constraint], options: Dict[str, Any]) -> argparse.Action:
    if default is REQUIRED:
        default = entry.default
    if default is REQUIRED:
        raise ValueError(f"the flag of {name!r} needs a default: the table has none in common")
    flag = options.pop("flag", None) or f"--{name.replace('_', '-')}"
    text = _with_default(help or entry.help, default)
    if isinstance(entry.rule, OneOf) and not narrower:
        return parser.add_argument(flag, choices=entry.rule.choices, default=default, help=text, **options)
    return parser.add_argument(flag, type=Checked(name, entry.rule, *narrower), default=default, help=text, **options)


def add_shared_flag(parser: Any, name: str, *, default: Any = REQUIRED, help: Optional[str] = None,
                    narrower: Sequence[Constraint] = (), **options: Any) -> argparse.Action:
    """The flag of the library's shared parameter ``name`` (``--expansion-dim`` for ``expansion_dim``): the
    table's rule (then ``narrower``, a command's own rules on top), default and help unless given;
    ``flag=`` names it otherwise."""
    return _entry_flag(parser, name, SHARED_PARAMETERS[name], default, help, narrower, options)


def add_common_flag(parser: Any, name: str, *, default: Any, help: Optional[str] = None,
                    **options: Any) -> argparse.Action:
    """The flag of :data:`COMMON_FLAGS`'s ``name`` (``--threads``), with this command's default."""
    return _entry_flag(parser, name, COMMON_FLAGS[name], default, help, (), options)


# ----------------------------------------------------------------------------------------------- outputs
def _first_existing(path: Path) -> Path:
    """``path``, or the nearest of its parents that exists (a command creates the rest)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def output_problem(path: Path, kind: str, contents: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why a command cannot write its ``kind`` (``"folder"`` or ``"file"``) at ``path``, or ``None``: a
    folder where a file goes or the reverse, a path under a file, a folder that cannot be written in; for a
    folder, also each of ``contents`` (``relative path -> kind``: what the command writes inside it) that
    exists as the other kind or lies under a file. Probes with one temporary file, removed at once; nothing
    else is created."""
    return _place_problem(Path(path), kind) or _contents_problem(Path(path), contents or {})


def _contents_problem(folder: Path, contents: Mapping[str, str]) -> Optional[str]:
    for relative, kind in contents.items():
        path = folder / relative
        if path.exists() and path.is_dir() != (kind == "folder"):
            return f"{path} is a {'folder' if path.is_dir() else 'file'}; expected a {kind} (the command writes it)"
        existing = _first_existing(path.parent)
        if not existing.is_dir():
            return f"{existing} is a file; expected a folder (the command writes {path})"
    return None


def _place_problem(path: Path, kind: str) -> Optional[str]:
    if path.exists() and path.is_dir() != (kind == "folder"):
        return f"{path} is a {'folder' if path.is_dir() else 'file'}; expected a {kind}"
    existing = _first_existing(path if kind == "folder" else path.parent)
    if not existing.is_dir():
        return f"{existing} is a file; expected a folder"
    try:
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".write-probe.")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        return f"cannot write in {existing} ({type(error).__name__}: {error.strerror or error}); expected a writable folder"
    return None


class OutputPath:
    """The ``type`` of a flag naming where a command writes a ``kind`` (``"folder"`` or ``"file"``):
    :func:`output_problem` is an ``ArgumentTypeError`` (one line, exit 2) at parse time, before any work."""

    def __init__(self, flag: str, kind: str, contents: Optional[Mapping[str, str]] = None) -> None:
        if kind not in ("folder", "file") or (contents and kind != "folder"):
            raise ValueError(f"kind must be 'folder' (with or without contents) or 'file', got {kind!r}")
        self.flag, self.kind, self.contents = flag, kind, dict(contents or {})
        self.__name__ = f"output {kind}"

    def __call__(self, text: str) -> Path:
        problem = output_problem(Path(text), self.kind, self.contents)
        if problem:
            raise argparse.ArgumentTypeError(f"{text}: {problem} (choose another {self.flag})")
        return Path(text)

    def __repr__(self) -> str:
        return f"OutputPath({self.flag!r}, {self.kind!r})"


def add_output_flag(parser: Any, flag: str, kind: str, *, default: Any, help: str,
                    contents: Optional[Mapping[str, str]] = None, **options: Any) -> argparse.Action:
    """``parser.add_argument(flag, ...)`` for where the command writes a ``kind`` (:class:`OutputPath`), and,
    in a folder, the ``contents`` it writes there (``relative path -> kind``); a string default is checked
    too (argparse converts it when the flag is not given)."""
    text = help if default is None else _with_default(help, default)
    return parser.add_argument(flag, type=OutputPath(flag, kind, contents), default=default, help=text, **options)


# ------------------------------------------------------------------------------------------------ inputs
def input_problem(path: Path, kind: str) -> Optional[str]:
    """Why a command cannot read its ``kind`` (``"folder"`` or ``"file"``) at ``path``, or ``None``: nothing
    there, the other kind, or not readable."""
    path = Path(path)
    if not path.exists():
        return f"no {kind} there; expected an existing {kind}"
    if path.is_dir() != (kind == "folder"):
        return f"{path} is a {'folder' if path.is_dir() else 'file'}; expected a {kind}"
    if not os.access(path, os.R_OK | (os.X_OK if kind == "folder" else 0)):
        return f"{path} cannot be read; expected a readable {kind}"
    return None


class InputPath:
    """The ``type`` of a flag naming a ``kind`` (``"folder"`` or ``"file"``) a command reads: :func:`input_problem`
    is an ``ArgumentTypeError`` (one line, exit 2) at parse time; the value is given on as ``convert(text)``."""

    def __init__(self, flag: str, kind: str, convert: Callable[[str], Any] = Path) -> None:
        if kind not in ("folder", "file"):
            raise ValueError(f"kind must be 'folder' or 'file', got {kind!r}")
        self.flag, self.kind, self.convert = flag, kind, convert
        self.__name__ = f"input {kind}"

    def __call__(self, text: str) -> Any:
        problem = input_problem(Path(text), self.kind)
        if problem:
            raise argparse.ArgumentTypeError(f"{text}: {problem} (check {self.flag})")
        return self.convert(text)

    def __repr__(self) -> str:
        return f"InputPath({self.flag!r}, {self.kind!r})"


def add_input_flag(parser: Any, flag: str, kind: str, *, help: str, convert: Callable[[str], Any] = Path,
                   **options: Any) -> argparse.Action:
    """``parser.add_argument(flag, ...)`` for a ``kind`` the command reads (:class:`InputPath`)."""
    return parser.add_argument(flag, type=InputPath(flag, kind, convert), help=help, **options)
