"""Stopping a sweep early without losing work: SIGTERM and SIGUSR1, what SLURM sends before a time limit
or a pre-emption, only set a flag; the training checks it at its next batch boundary, writes a
checkpoint and stops, and the sweep exits with :data:`RESUMABLE_EXIT_CODE`. Rerunning the same command
resumes (docs/checkpoints.md).
"""

from __future__ import annotations

import signal
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, Optional

__all__ = ["RESUMABLE_EXIT_CODE", "STOP_SIGNALS", "StopSignals", "RunInterrupted", "any_process"]

#: Exit status of a sweep stopped by a signal after saving its state: EX_TEMPFAIL of sysexits.h,
#: "a temporary failure; the user is invited to retry".
RESUMABLE_EXIT_CODE = 75
#: The signals that stop a sweep resumably (SIGUSR1 does not exist on Windows).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))


class StopSignals:
    """Context manager: while active, :data:`STOP_SIGNALS` set :attr:`received` instead of ending the
    process; on exit the previous handlers are back. Outside the main thread (where Python cannot
    install handlers) it warns and leaves the handlers alone."""

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self._previous: Dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.received is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else "no signal"

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum  # only a flag: the loop acts on it at a batch boundary

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            warnings.warn("not the main thread: SIGTERM/SIGUSR1 keep their handlers and stop the run without a "
                          "checkpoint", stacklevel=2)
            return self
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


class RunInterrupted(Exception):
    """A training stopped on a stop request after writing its checkpoint (``path``, after ``batches``)."""

    def __init__(self, key: str, path: Optional[Path], batches: int, total: int) -> None:
        saved = f", saved in {path}" if path is not None else ""
        super().__init__(f"{key} at batch {batches} of {total}{saved}")
        self.key, self.path, self.batches, self.total = key, path, batches, total


def any_process(flag: bool, parallel: Any, device: Any) -> bool:
    """Whether ``flag`` holds on any process of ``parallel`` (a ``benchmarks.parallel.DataParallel``):
    every process stops at the same batch, since the signal may reach them at different times."""
    if parallel.world == 1:
        return bool(flag)
    import torch

    return bool(parallel.sum_counts(torch.tensor([int(bool(flag))], device=device)).item())
