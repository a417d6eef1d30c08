"""MoE_PromptCL's copy of HiDe-Prompt under ``retrofit(method="hide", original_model=...)``; see ``_hide.py``."""

from benchmarks.upstream.harnesses._hide import run_variant


def run(checkout, settings):
    return run_variant(checkout, settings, "hide", "MoE_PromptCL / HiDe")
