import sys

from benchmarks.upstream.cli import main

sys.exit(main())
