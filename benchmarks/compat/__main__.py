import sys

from benchmarks.compat.cli import main

sys.exit(main())
