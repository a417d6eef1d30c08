import sys

from benchmarks.ablation.cli import main

sys.exit(main())
