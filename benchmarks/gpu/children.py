"""The GPU suite's child processes: each stage runs in its own process group, its output streamed through and
its tail kept, killed with its children when its time is up or the suite is interrupted."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]  # where the children run
TAIL_CHARACTERS = 6000  # of a child's output, kept in its stage's file


class Interrupted(Exception):
    """The suite received SIGTERM or SIGINT."""


def raise_interrupted(signum: int, _frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def run_child(command: Sequence[str], *, limit: float, env: Optional[Dict[str, str]] = None,
              on_poll: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """Run ``command`` in the repository, its output streamed through and its tail kept; killed (with its
    process group) after ``limit`` seconds. ``on_poll`` is called about once a second while it runs."""
    print(f"$ {' '.join(command)}   (limit {limit:.0f} s)", flush=True)
    started = time.monotonic()
    # A process group of its own (not a session: the machine's clean-up must still reach it).
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    process = subprocess.Popen(list(command), cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1, **group)
    lines: "collections.deque[str]" = collections.deque(maxlen=4000)

    def pump() -> None:
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        while True:
            try:
                process.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if on_poll is not None:
                    on_poll()
                if time.monotonic() - started > limit:
                    timed_out = True
                    _stop(process)
                    break
    except BaseException:
        _stop(process)
        raise
    reader.join(timeout=10)
    text = "".join(lines)
    seconds = time.monotonic() - started
    if timed_out:
        print(f"!! killed after {seconds:.0f} s (limit {limit:.0f} s)", flush=True)
    return {"command": list(command), "returncode": process.returncode, "timed_out": timed_out, "seconds": seconds,
            "limit_seconds": limit, "output": text}


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the child's process group (children it started included)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def child_summary(child: Dict[str, Any]) -> Dict[str, Any]:
    """What a stage file keeps of a child: everything but the full output (its tail instead)."""
    kept = {key: value for key, value in child.items() if key != "output"}
    kept["output_tail"] = child["output"][-TAIL_CHARACTERS:]
    return kept


def child_status(children: Sequence[Dict[str, Any]]) -> Optional[str]:
    """``timeout`` or ``error`` if a child ran out of time or exited non-zero, else ``None``."""
    if any(child["timed_out"] for child in children):
        return "timeout"
    if any(child["returncode"] != 0 for child in children):
        return "error"
    return None
