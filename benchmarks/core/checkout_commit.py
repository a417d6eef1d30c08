"""The commit of an upstream checkout, read one way by every command that names one (the upstream checks, the
fidelity tables, the speed comparison): ``git rev-parse HEAD`` in a git checkout; in an exported tree without
``.git`` (``git archive``, a release archive), the hash its ``.upstream_commit`` file holds; "unknown" otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Union

__all__ = ["COMMIT_FILE", "checkout_commit"]

#: the file an exported tree keeps its commit in (one line: the hash)
COMMIT_FILE = ".upstream_commit"


def checkout_commit(path: Union[str, Path]) -> str:
    """The commit of the checkout at ``path``. Only the checkout's own ``.git`` is asked (never a repository
    the folder happens to sit in), then its :data:`COMMIT_FILE`; "unknown" when neither answers."""
    path = Path(path)
    if (path / ".git").exists():
        try:
            found = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                   timeout=30)
        except (OSError, subprocess.SubprocessError):
            found = None
        if found is not None and found.returncode == 0 and found.stdout.strip():
            return found.stdout.strip()
    marker = path / COMMIT_FILE
    if marker.is_file():
        words = marker.read_text(errors="replace").split()
        if words:
            return words[0]
    return "unknown"
