"""thu-ml/HiDe-Prompt under ``retrofit(method="hide", original_model=...)``; model and loop: ``_hide.py``."""

from benchmarks.upstream.harnesses._hide import run_variant


def run(checkout, settings):
    return run_variant(checkout, settings, "hide", "HiDe-Prompt / HiDe")
