"""Wall time of a run by part (training and evaluation), for the profile and the plan's probe.

The training loop and the evaluator time their parts with a :class:`PartTimer`; the default one
(:data:`NO_TIMER`) does nothing, so runs pay no device synchronisation for it. An enabled timer waits
for the device at each part's start and end, which is what makes a CUDA part's time its own.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Callable, Dict, Iterator, Optional

import torch

__all__ = ["PartTimer", "NO_TIMER"]


class PartTimer:
    """Seconds and calls per named part; parts must not nest (each second is counted once).

    Args:
        device: synchronised at each boundary when it is a CUDA device.
        enabled: ``False`` gives a timer whose parts cost nothing and record nothing.
        clock: ``time.perf_counter`` (wall seconds) or ``time.process_time`` (CPU seconds of the process:
            on a shared CPU with one torch thread, what the part costs an idle core).
    """

    def __init__(self, device: Optional[torch.device] = None, *, enabled: bool = True,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.device = device
        self.enabled = enabled
        self.clock = clock
        self.seconds: Dict[str, float] = defaultdict(float)
        self.calls: Dict[str, int] = defaultdict(int)
        self._open: Optional[str] = None

    def _sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def __call__(self, part: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self._open is not None:
            raise RuntimeError(f"PartTimer: part {part!r} started inside {self._open!r}; parts must not nest")
        self._open = part
        self._sync()
        started = self.clock()
        try:
            yield
        finally:
            self._sync()
            self.seconds[part] += self.clock() - started
            self.calls[part] += 1
            self._open = None

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def summary(self) -> Dict[str, Dict[str, float]]:
        """``{part: {"seconds", "calls"}}`` in the order the parts first ran."""
        return {part: {"seconds": self.seconds[part], "calls": self.calls[part]} for part in self.seconds}


#: the timer of ordinary runs: records nothing, synchronises nothing
NO_TIMER = PartTimer(enabled=False)
