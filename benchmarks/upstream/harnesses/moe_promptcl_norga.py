"""MoE_PromptCL NoRGa under ``retrofit(method="norga", original_model=...)``; see ``_hide.py``.

Its ``train_one_epoch`` passes ``prompt_id = task_id`` and never calls original_model (the router's
training queries come from the adapter's own pass); ``evaluate`` runs original_model first.
"""

from benchmarks.upstream.harnesses._hide import run_variant


def run(checkout, settings):
    return run_variant(checkout, settings, "norga", "MoE_PromptCL / NoRGa")
