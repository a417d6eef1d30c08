"""The Pair of mammoth's L2P and DualPrompt ContinualModels (retrofit target ``continual_model.net.model``)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from benchmarks.upstream.checks import try_retrofit
from benchmarks.upstream.harnesses import _mammoth
from benchmarks.upstream.observe import capture_outputs
from benchmarks.upstream.pair import Pair


class MammothPair(Pair):
    schedule = "session"
    pool = 10
    top_k = 1

    def make_continual_model(self, seed):
        raise NotImplementedError

    def build(self, seed):
        torch.manual_seed(seed)
        model = self.make_continual_model(seed)
        model.begin_task(None)  # makes model.opt
        return SimpleNamespace(cm=model, model=model.net.model, optimizer=model.opt, usage=torch.zeros(self.pool))

    def family_options(self, ctx):
        return dict(num_experts=2)

    def probes(self, ctx, adapters):
        status, detail = try_retrofit(ctx.cm.net, self.method, num_experts=2)
        return [("r2", "INFO", f"retrofit(continual_model.net, {self.method!r}) {status.lower()}", detail)]

    def start_task(self, ctx, task, own_advance):
        if task > 0:
            _mammoth.set_task(ctx.cm, task)
            ctx.cm.begin_task(None)
            ctx.optimizer = ctx.cm.opt

    def train_batch(self, ctx, x, y, task):
        ctx.cm.train()
        with capture_outputs(ctx.model) as outputs:
            loss = ctx.cm.observe(x, y, x)
        for output in outputs:
            ctx.usage += torch.bincount(output["prompt_idx"].reshape(-1), minlength=self.pool).float()
        return [loss]

    def eval_logits(self, ctx, x, y):
        ctx.cm.eval()
        with torch.no_grad(), capture_outputs(ctx.model) as outputs:
            logits = ctx.cm(x)
        return logits.detach(), outputs[-1]["prompt_idx"][:, 0].detach()

    def roots(self, ctx):
        return {"continual_model": ctx.cm}

    def slot_usage(self, ctx):
        return ctx.usage.clone()

    def expert_slots(self, ctx, expert):
        size = self.pool // 2 if self.counter_name is None else self.top_k
        return list(range(expert * size, (expert + 1) * size))
