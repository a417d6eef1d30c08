"""Files of a sweep that appear whole or not at all: written to a temporary file beside the target, then
renamed into place, so that a crash or a failed write (disk full, permissions) keeps the previous file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable

__all__ = ["WriteError", "save_figure", "temporary_beside", "write_atomic"]


class WriteError(Exception):
    """A file could not be written (disk full, permissions); the previous version of it, if any, is kept."""

    @classmethod
    def of(cls, path: Path, error: OSError) -> "WriteError":
        kept = "the previous file is kept" if Path(path).exists() else "nothing was written"
        reason = f"{type(error).__name__}: {error.strerror or error}"
        return cls(f"cannot write {path} ({reason}); {kept}: free space or make the folder writable, "
                   "or choose another --output")


def temporary_beside(path: Path) -> "tuple[int, str]":
    """An open descriptor and the name of a new temporary file in ``path``'s folder (created if needed);
    :class:`WriteError` when the folder cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise WriteError.of(path, error) from error


def write_atomic(path: Path, write: Callable[[IO[Any]], Any], *, binary: bool = False, durable: bool = False) -> None:
    """Call ``write(stream)`` on a temporary file beside ``path``, then rename it to ``path``. ``durable``
    also fsyncs the file and its folder (checkpoints: the rename survives a crash of the machine). An
    ``OSError`` becomes :class:`WriteError`, with the temporary file removed and ``path`` untouched."""
    path = Path(path)
    handle, temporary = temporary_beside(path)
    try:
        with os.fdopen(handle, "wb" if binary else "w") as stream:
            write(stream)
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp creates 0600; these are ordinary files
        os.replace(temporary, path)
        if durable:
            _fsync_folder(path.parent)
    except BaseException as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise WriteError.of(path, error) from error
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    if os.name == "nt":  # Windows cannot open a folder for fsync; its renames are journaled
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save_figure(figure: Any, path: Path) -> None:
    """``savefig`` whole or not at all: a failed write keeps the previous figure (:class:`WriteError`)."""
    write_atomic(path, lambda stream: figure.savefig(stream, dpi=100, format=path.suffix.lstrip(".")), binary=True)
