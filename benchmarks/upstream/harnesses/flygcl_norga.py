"""FlyGCL NoRGa (``models.hide_norga_prefix_vit.NoRGaPrefixModel`` with
``methods.hide_norga_trainer.NoRGaGCLTrainer``: freezes its gate scale after the first task) under
``retrofit(method="norga")``; see ``_flygcl_hide.py``."""

from benchmarks.upstream.harnesses._flygcl_hide import run_variant


def run(checkout, settings):
    return run_variant(checkout, settings, "norga")
