"""FlyGCL HiDe-Prompt (``models.hide_norga_prefix_vit.HiDePrefixModel`` with
``methods.hide_norga_trainer.HiDeGCLTrainer``) under ``retrofit(method="hide")``; see ``_flygcl_hide.py``."""

from benchmarks.upstream.harnesses._flygcl_hide import run_variant


def run(checkout, settings):
    return run_variant(checkout, settings, "hide")
