"""FlyGCL L2P under ``retrofit(method="l2p", num_experts=2)``.

Real classes: ``models.l2p.L2P`` (pool 10, top 5; its prompts live in a FlyGCL ``Prompt`` with
``key``, ``prompts`` and ``forward(query, s=None, e=None)``) and ``methods.l2p.L2P`` (trainer:
``online_step`` -> ``online_train``, ``online_evaluate``). Experts are key-pool slices routed through
``s, e``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _flygcl, _online_trainer
from benchmarks.upstream.observe import capture_outputs, match_rows
from benchmarks.upstream.pair import Pair, active_handle
from benchmarks.upstream.stream import CLASSES_PER_TASK, NUM_TASKS

NUM_CLASSES, POOL, TOP_K = NUM_TASKS * CLASSES_PER_TASK, 10, 5


class FlyGCLL2P(Pair):
    name = "FlyGCL / L2P"
    method = "l2p"
    schedule = "samples"
    counter_name = None
    counter_na = "L2P trains whatever keys its (diversified) top-k match picks over the whole pool; no step counter"

    def __init__(self, checkout: Path) -> None:
        self.stubs = _flygcl.import_flygcl(checkout, ["models.l2p", "methods.l2p"])
        import methods.l2p as trainers
        import models.l2p as models
        from utils.train_utils import select_optimizer, select_scheduler

        self.trainers, self.models = trainers, models
        self.select_optimizer, self.select_scheduler = select_optimizer, select_scheduler

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"models.l2p.L2P(e_pool={POOL}, selection_size={TOP_K}, task_num=2, num_classes=4)")

    def build(self, seed):
        torch.manual_seed(seed)
        model = self.models.L2P(backbone_name=_flygcl.BACKBONE, task_num=NUM_TASKS, num_classes=NUM_CLASSES,
                                e_pool=POOL, selection_size=TOP_K)
        optimizer = self.select_optimizer("adam", 5e-3, model)
        scheduler = self.select_scheduler("default", optimizer, 0.9999)
        trainer = _online_trainer.make_trainer(self.trainers.L2P, model, optimizer, scheduler, n_classes=NUM_CLASSES,
                                               no_batchmask=False, task_id=0)
        losses = _online_trainer.record_losses(trainer)
        return SimpleNamespace(model=model, optimizer=optimizer, trainer=trainer, losses=losses)

    def family_options(self, ctx):
        return dict(num_experts=NUM_TASKS)

    def start_task(self, ctx, task, own_advance):
        ctx.trainer.online_before_task(task)

    def train_batch(self, ctx, x, y, task):
        return _online_trainer.train_batch(ctx, x, y)

    def eval_logits(self, ctx, x, y):
        handle = active_handle(ctx)
        if handle is not None:
            handle.set_logit_mask(ctx.trainer.mask.clone())
        ctx.model.eval()
        with capture_outputs(ctx.model.prompt) as prompt_outputs:
            logits = _online_trainer.evaluate(ctx.trainer, ctx.model, x, y)
        selection = prompt_outputs[-1][1]  # (B, top_k, length, dim)
        return logits, match_rows(selection[:, 0], ctx.model.prompt.prompts)

    def slot_usage(self, ctx):
        return ctx.model.prompt.counter.detach().clone()

    def expert_slots(self, ctx, expert):
        size = POOL // NUM_TASKS
        return list(range(expert * size, (expert + 1) * size))


def run(checkout: Path, settings: Settings):
    return run_checks(FlyGCLL2P(checkout), settings)
