"""Claims: several processes on one output folder share its trainings instead of racing for them.

Before it trains a (dataset, method, seed), a sweep claims it with a lock file
``claims/<dataset>/<method>/seed<k>.lock`` holding its host, process id and process start time. The file
is written beside its name and hard-linked into place, which fails when the name exists: exactly one
process holds a claim, and a reader never sees a half-written one. A process trains every training it
can claim, then waits for the ones others hold and ends with the complete table; when a holder dies,
a waiting process takes its training over (resuming from its checkpoint).

A claim is stale when its process no longer runs on this host (or its process id now belongs to a
process started later). Stale claims are taken over under a short second lock (``<claim>.break``), so
that two processes never both remove one and a live claim is never removed. A claim of another host is
never judged stale, since its processes cannot be seen from here: delete the file when that host's sweep
is gone. The table is written under the lock ``claims/table.lock`` after reading every result, so the
last table written is the complete one.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch

from ..core.files import WriteError, temporary_beside
from ..core.protocol import RunSpec

__all__ = ["Claim", "ClaimHeldError", "Claims", "claim_path", "holder_text", "this_process"]


class ClaimHeldError(Exception):
    """A lock stayed held by a live process for longer than the caller waits (one line: who holds it)."""


def claim_path(output: Path, spec: RunSpec) -> Path:
    """The claim of the training that gives ``spec`` (one per dataset, method and seed)."""
    return Path(output) / "claims" / spec.dataset / spec.method / f"seed{spec.seed}.lock"


def _start_time(pid: int) -> Optional[str]:
    """The process's start time since boot (Linux ``/proc``), telling a reused process id from its first
    owner; ``None`` where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def this_process() -> Dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid()),
            "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "argv": sys.argv[1:]}


def holder_text(holder: Dict[str, Any]) -> str:
    if not holder:
        return "a process that left no readable claim"
    return f"process {holder.get('pid')} on host {holder.get('host')} (since {holder.get('since')})"


def _same_process(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    return all(a.get(key) == b.get(key) for key in ("host", "pid", "start"))


def alive(holder: Dict[str, Any]) -> bool:
    """Whether the claim's process may still run: always for another host; on this host, whether its
    process id runs and (where readable) started when the claim's process did."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, under another user
        pass
    start = _start_time(pid)
    return holder.get("start") is None or start is None or start == holder["start"]


def _read(path: Path) -> Optional[Dict[str, Any]]:
    """The holder in a lock file; ``None`` when the file is gone; ``{}`` when it is not a claim."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _link_new(path: Path, holder: Dict[str, Any]) -> bool:
    """Create ``path`` holding ``holder``, complete and atomically; ``False`` if it exists. A folder that
    cannot be written raises :class:`WriteError`."""
    handle, temporary = temporary_beside(path)
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(holder, stream)
        try:
            os.link(temporary, path)
        except OSError as error:
            if error.errno not in _NO_HARD_LINKS:
                raise
            return _create_new(path, holder)
        return True
    except FileExistsError:
        return False
    except OSError as error:
        raise WriteError.of(path, error) from error
    finally:
        os.unlink(temporary)


#: errno of a file system without hard links; claims are then created with O_EXCL and written after.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def _create_new(path: Path, holder: Dict[str, Any]) -> bool:
    descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)  # FileExistsError: held
    with os.fdopen(descriptor, "w") as stream:
        json.dump(holder, stream)
    return True


class Claim:
    """One lock file: :meth:`acquire` (``None`` when this process holds it, else the live holder) and
    :meth:`release`."""

    def __init__(self, path: Path) -> None:
        self.path, self.me = Path(path), this_process()

    def acquire(self) -> Optional[Dict[str, Any]]:
        while True:
            if _link_new(self.path, self.me):
                return None
            holder = _read(self.path)
            if holder is None:  # released meanwhile
                continue
            if _same_process(holder, self.me):  # left by this process (a sweep ended by an error)
                return None
            if alive(holder):
                return holder
            self._break(holder)

    def _break(self, stale: Dict[str, Any]) -> None:
        """Remove the stale claim ``stale`` unless it changed; only the holder of ``<claim>.break`` may."""
        breaker = self.path.with_name(self.path.name + ".break")
        if _link_new(breaker, self.me):
            try:
                if _read(self.path) == stale:
                    self.path.unlink(missing_ok=True)
            finally:
                breaker.unlink(missing_ok=True)
            return
        other = _read(breaker)
        if other is not None and not alive(other):  # a process died while breaking (a window of microseconds)
            breaker.unlink(missing_ok=True)
        else:
            time.sleep(0.05)

    def release(self) -> None:
        """Remove the lock file if this process holds it (a live claim is never replaced by another)."""
        holder = _read(self.path)
        if holder is not None and _same_process(holder, self.me):
            self.path.unlink(missing_ok=True)
        for parent in self.path.parents:  # the folders it leaves empty, up to claims/
            try:
                parent.rmdir()
            except OSError:  # not empty (or gone): another claim lives there
                break
            if parent.name == "claims":
                break

    def wait(self, timeout: float, poll: float = 0.2) -> None:
        """:meth:`acquire`, waiting up to ``timeout`` seconds for a live holder to release it."""
        deadline = time.monotonic() + timeout
        while (holder := self.acquire()) is not None:
            if time.monotonic() > deadline:
                raise ClaimHeldError(
                    f"{self.path} is held by {holder_text(holder)} for more than {timeout:.0f} s; delete it if "
                    "that process is gone"
                )
            time.sleep(poll)


class Claims:
    """The claims of one sweep (``benchmarks.ablation.execution.execute``): :meth:`claimed` yields the trainings
    this process holds, one at a time, releasing each when the loop moves on; leaving the context releases
    the one a loop left early holds.

    In a data-parallel sweep the first process claims and the others follow its decisions.
    """

    def __init__(self, output: Path, *, parallel: Any, device: torch.device, lead: bool, poll: float = 2.0,
                 notify: Callable[[str], None] = print) -> None:
        self.output, self.parallel, self.device, self.lead = Path(output), parallel, device, lead
        self.poll, self.notify = poll, notify
        self.waited_for: List[Dict[str, Any]] = []  # holders this sweep waited for
        self.holding: Optional[Claim] = None

    def __enter__(self) -> "Claims":
        return self

    def __exit__(self, *exc: Any) -> None:
        """Release the claim of a training left by an error or a stop (a loop that did not finish)."""
        if self.holding is not None and self.lead:
            self.holding.release()
        self.holding = None

    def _agreed(self, value: bool) -> bool:
        """The first process's ``value``, on every process of a data-parallel sweep."""
        if self.parallel.world == 1:
            return value
        flag = torch.tensor([1 if self.lead and value else 0], device=self.device)
        return int(self.parallel.sum_counts(flag).item()) > 0

    def claimed(self, groups: Sequence[Sequence[RunSpec]], *, unfinished: Callable[[RunSpec], bool],
                stop: Callable[[], bool]) -> Iterator[List[RunSpec]]:
        """Each group of ``groups`` once this sweep holds its claim, reduced to its ``unfinished`` specs
        (another process may have finished some); groups held by others are retried every ``poll``
        seconds until they are finished or can be claimed. Ends early when ``stop()`` is true."""
        pending = [list(group) for group in groups]
        announced = False
        while pending:
            held = []
            for group in pending:
                if self._agreed(stop()):
                    return
                claim = Claim(claim_path(self.output, group[0]))
                holder = claim.acquire() if self.lead else None
                if not self._agreed(holder is None):
                    held.append((group, holder or {}))
                    continue
                self.holding = claim
                left = [spec for spec in group if self._agreed(unfinished(spec))]
                if left:
                    yield left
                if self.lead:
                    claim.release()
                self.holding = None
            pending = [group for group, _ in held if any([self._agreed(unfinished(spec)) for spec in group])]
            if pending:
                holders = {holder_text(h): h for group, h in held if group in pending}
                if not announced and self.lead:
                    self.notify(f"waiting for {len(pending)} training(s) held by {', '.join(holders)} "
                                f"(claims in {self.output / 'claims'}); a holder that stops leaves them to this sweep")
                announced = True
                self.waited_for = list(holders.values())
                time.sleep(self.poll)

    def table_lock(self, timeout: float = 300.0) -> "_Held":
        """Context manager holding ``claims/table.lock`` while the table is read and written."""
        return _Held(Claim(self.output / "claims" / "table.lock"), timeout)


class _Held:
    def __init__(self, claim: Claim, timeout: float) -> None:
        self.claim, self.timeout = claim, timeout

    def __enter__(self) -> Claim:
        self.claim.wait(self.timeout)
        return self.claim

    def __exit__(self, *exc: Any) -> None:
        self.claim.release()
