"""FlyGCL HiDe-Adapter (``models.hide_adapter_vit.HiDeAdapterModel`` with
``methods.hide_norga_trainer.HiDeGCLTrainer``) under ``retrofit(method="hide")``; see ``_flygcl_experts.py``."""

from benchmarks.upstream.harnesses._flygcl_experts import run_variant


def run(checkout, settings):
    return run_variant(checkout, settings, "adapter")
