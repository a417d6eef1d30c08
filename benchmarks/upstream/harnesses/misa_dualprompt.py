"""MISA (its DualPrompt-based model) under ``retrofit(method="misa")``.

Real classes: ``models.dualprompt.DualPrompt`` as MISA's ``select_model`` builds it (task_num 10, pool
10, one slot per task) and ``methods.dualprompt.DualPrompt`` (trainer: its own ``online_step`` per
batch, its ``online_after_task`` at each task end -- MISA's own step advance, ``model.task_id += 1``
-- and ``online_evaluate``, which adds no seen-class mask). Flags as MISA's scripts without prompt
files: load_pt, learnable_mask, imbalance, isa, e_proj, g_proj off; replay memory empty.
The adapter refuses ``router=True``: the pool's ``forward(query, s, e)`` matches keys in ``[s, e)`` but
gathers prompts with slice-local indices, so routing through ``s, e`` cannot change the prompt. Which
slot a step trains shows in the key gradient (the only per-step part), recorded after each batch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses import _misa
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES, OnlineTrainerPair, replay_settings
from benchmarks.upstream.observe import match_rows
from benchmarks.upstream.task_stream import NUM_TASKS


class MISADualPrompt(OnlineTrainerPair):
    name = "MISA / MISA (DualPrompt-based)"
    method = "misa"
    counter_name = "model.task_id"
    import_checkout = staticmethod(_misa.import_misa)
    modules = ("models.dualprompt", "methods.dualprompt")
    backbone = _misa.BACKBONE
    model_class, trainer_class = "models.dualprompt.DualPrompt", "methods.dualprompt.DualPrompt"
    model_options = dict(class_num=NUM_CLASSES, load_pt=False, learnable_mask=False, imbalance=False, memory_size=0,
                         isa=False, e_proj=False, g_proj=False)
    model_description = "models.dualprompt.DualPrompt(class_num=4): task_num 10, e_pool 10, 1 slot per task"
    scheduler_gamma = None
    masks_logits = False  # MISA's online_evaluate adds no seen-class mask

    def trainer_options(self):
        return dict(nobatchmask=False, sessionmask=False, task_id=0, dataset="cifar100", n_tasks=NUM_TASKS,
                    **replay_settings())

    def build(self, seed):
        ctx = super().build(seed)
        ctx.key_usage = torch.zeros(ctx.model.e_pool)
        return ctx

    def start_task(self, ctx, task, own_advance):
        if task > 0 and own_advance:
            ctx.trainer.online_after_task(task - 1)
        super().start_task(ctx, task, own_advance)

    def train_batch(self, ctx, x, y, task):
        losses = super().train_batch(ctx, x, y, task)
        grad = ctx.model.e_prompt.key.grad
        if grad is not None:
            ctx.key_usage += (grad.abs().sum(1) > 0).float()
        return losses

    def used_rows(self, ctx, capture):
        return match_rows(capture.seen[-1][:, 0], ctx.model.e_prompt.prompts)

    def counter(self, ctx):
        return int(ctx.model.task_id)

    def slot_usage(self, ctx):
        return ctx.key_usage.clone()

    def slots_per_expert(self, ctx):
        return ctx.model.num_pt_per_task


def run(checkout: Path, settings: Settings):
    return run_checks(MISADualPrompt(checkout), settings)
