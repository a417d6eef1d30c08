"""What the cross-ablation's checks before any data work cost (benchmarks/ablation/preflight.py).

    python -m benchmarks.speed.preflight_time [cross-ablation flags]

builds the backbone and every method of the sweep the flags describe, scores one blank image with each, and
prints the time; nothing is trained or written (docs/benchmark.md).
"""

from __future__ import annotations

import sys
import time
from typing import Optional, Sequence

import torch

from benchmarks.ablation import preflight
from benchmarks.ablation.arguments import build_parser
from benchmarks.ablation.sweep import resolve


def main(argv: Optional[Sequence[str]] = None) -> int:
    sweep = resolve(build_parser().parse_args(argv))
    started = time.perf_counter()
    preflight.check(sweep)
    print(f"checks of {len(sweep.methods)} methods on {sweep.protocol.model}: {time.perf_counter() - started:.1f} s "
          f"on {torch.get_num_threads()} CPU thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
