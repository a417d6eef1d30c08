"""How a rank spawned by the distributed tests ends (``torch.multiprocessing.spawn`` children)."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Callable


def leave_after(body: Callable[..., None], *args: Any) -> None:
    """Run one rank's ``body(*args)``, then leave with ``os._exit``: the process group is never torn down, since
    before torch 2.8 its gloo destructor can deadlock on the GIL with a worker thread still dropping a finished
    collective's tensor (docs/router.md), whatever the barrier before it. ``body`` writes the rank's results to
    disk; a failure is printed, then a non-zero exit for the spawner to report."""
    try:
        body(*args)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)
