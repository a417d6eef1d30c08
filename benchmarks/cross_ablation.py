"""The main job from a checkout: ``python benchmarks/cross_ablation.py [flags]`` is
``python -m benchmarks.ablation [flags]`` (the cross-ablation; ``--help`` lists the flags)."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the checkout importable (benchmarks/ is never installed)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ablation.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
