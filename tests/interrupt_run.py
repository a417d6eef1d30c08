"""The cross-ablation command line, interrupted by a real signal at a chosen point (for tests/test_checkpoint.py).

    python tests/interrupt_run.py POINT N -- CROSS_ABLATION_ARGS...

POINT (counted in this process; under torchrun in the process of rank $INTERRUPT_RANK, default 0):
  step    SIGKILL at the N-th optimizer step (in the middle of a batch)
  write   SIGKILL in the N-th checkpoint write, after the temporary file is complete, before its rename
  result  SIGKILL right after the N-th result file is written
  term    SIGTERM at the N-th optimizer step (the sweep saves at the batch boundary and exits)
  none    no interruption
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ablation import cli as cross_ablation  # noqa: E402
from benchmarks.ablation import execution  # noqa: E402
from benchmarks.ablation.training import OnlineTrainer  # noqa: E402


def _interrupt(original, count, signum, *, after=False, matches=lambda *args: True):
    """``original`` sending ``signum`` to this process at its ``count``-th matching call (before it, or after)."""
    calls = 0

    def wrapped(*args, **kwargs):
        nonlocal calls
        calls += bool(matches(*args))
        hit = calls == count and matches(*args)
        if hit and not after:
            os.kill(os.getpid(), signum)
        result = original(*args, **kwargs)
        if hit and after:
            os.kill(os.getpid(), signum)
        return result

    return wrapped


def main(argv):
    point, count, separator, *args = argv
    assert separator == "--", "usage: interrupt_run.py POINT N -- ARGS..."
    count = int(count)
    here = os.environ.get("RANK", "0") == os.environ.get("INTERRUPT_RANK", "0")
    if point not in ("none", "step", "term", "write", "result"):
        raise SystemExit(f"unknown point {point!r}")
    if here and point in ("step", "term"):
        signum = signal.SIGKILL if point == "step" else signal.SIGTERM
        OnlineTrainer.train_step = _interrupt(OnlineTrainer.train_step, count, signum)
    elif here and point == "write":
        os.replace = _interrupt(os.replace, count, signal.SIGKILL, matches=lambda source, target: str(target).endswith(".pt"))
    elif here and point == "result":
        execution.write_json_atomic = _interrupt(
            execution.write_json_atomic, count, signal.SIGKILL, after=True,
            matches=lambda path, payload: "runs" in Path(path).parts,
        )
    return cross_ablation.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
