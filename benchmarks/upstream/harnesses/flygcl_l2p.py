"""FlyGCL L2P under ``retrofit(method="l2p", num_experts=2)``.

Real classes: ``models.l2p.L2P`` (pool 10, top 5; its prompts live in a FlyGCL ``Prompt`` with
``key``, ``prompts`` and ``forward(query, s=None, e=None)``) and ``methods.l2p.L2P`` (trainer:
``online_step`` -> ``online_train``, ``online_evaluate``). Experts are key-pool slices routed through
``s, e``.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _flygcl
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES, OnlineTrainerPair
from benchmarks.upstream.observe import capture_outputs, match_rows
from benchmarks.upstream.task_stream import NUM_TASKS

POOL, TOP_K = 10, 5


class FlyGCLL2P(OnlineTrainerPair):
    name = "FlyGCL / L2P"
    method = "l2p"
    counter_name = None
    counter_na = "L2P trains whatever keys its (diversified) top-k match picks over the whole pool; no step counter"
    import_checkout = staticmethod(_flygcl.import_flygcl)
    modules = ("models.l2p", "methods.l2p")
    backbone = _flygcl.BACKBONE
    model_class, trainer_class = "models.l2p.L2P", "methods.l2p.L2P"
    model_options = dict(task_num=NUM_TASKS, num_classes=NUM_CLASSES, e_pool=POOL, selection_size=TOP_K)
    model_description = f"models.l2p.L2P(e_pool={POOL}, selection_size={TOP_K}, task_num=2, num_classes=4)"

    def trainer_options(self):
        return dict(no_batchmask=False, task_id=0)

    def family_options(self, ctx):
        return dict(num_experts=NUM_TASKS)

    def selection_capture(self, ctx):
        return capture_outputs(ctx.model.prompt)

    def used_rows(self, ctx, prompt_outputs):
        selection = prompt_outputs[-1][1]  # (B, top_k, length, dim)
        return match_rows(selection[:, 0], ctx.model.prompt.prompts)

    def slot_usage(self, ctx):
        return ctx.model.prompt.counter.detach().clone()

    def slots_per_expert(self, ctx):
        return POOL // NUM_TASKS


def run(checkout: Path, settings: Settings):
    return run_checks(FlyGCLL2P(checkout), settings)
