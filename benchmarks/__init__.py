"""Benchmark code run from a checkout (never installed): Si-Blurry stream, metrics, datasets, methods."""

from benchmarks.requirements import refuse_if_unmet

refuse_if_unmet()  # before any module an older Python cannot parse or an older torch cannot run
