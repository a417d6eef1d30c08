"""LAMDA-CL/LAMDA-PILOT for the harnesses: import, Learner construction, and the Pair of its L2P and
DualPrompt learners (retrofit target ``learner._network.backbone``).

In memory only: ``timm.models.layers.weight_init`` (moved in timm 1.0) is aliased to
``timm.layers.weight_init`` where it is gone; ``easydict`` becomes a stand-in when missing. The Learner is made without its
``__init__`` (which builds ViT-B/16 with pretrained weights): ``BaseLearner.__init__`` runs with a small
argument dict and the network holds two harness-size ViTs of the backbone class. At a task start the
harness makes the calls ``incremental_train`` / ``_train`` make (``after_task``, the task counters,
``get_optimizer``, ``_init_prompt``, ``get_optimizer`` again); per batch the Learner's own
``_init_train`` on a loader of that one batch (one epoch); evaluation its own ``_eval_cnn``. PILOT makes
its optimizer inside ``_train``: the retrofit gets task 0's, the most favourable case.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import List, Sequence

import torch

from benchmarks.upstream.checks import try_retrofit
from benchmarks.upstream.harnesses._task_loop import FROZEN, TINY
from benchmarks.upstream.loading import import_upstream
from benchmarks.upstream.observe import backward_losses, capture_outputs
from benchmarks.upstream.pair import Pair
from benchmarks.upstream.task_stream import CLASSES_PER_TASK


def import_pilot(checkout: Path, modules: Sequence[str]) -> List[str]:
    try:  # the path PILOT imports, as timm < 1.0 (the 0.6.12 PILOT pins) has it
        import timm.models.layers.weight_init  # noqa: F401
    except ImportError:
        import timm.layers.weight_init as weight_init

        sys.modules.setdefault("timm.models.layers.weight_init", weight_init)
    return import_upstream(checkout, modules, allowed_stubs=["easydict"])


def base_args(**overrides):
    args = dict(memory_size=0, memory_per_class=0, fixed_memory=False, device=["cpu"], batch_size=8,
                init_lr=0.001875, weight_decay=0, min_lr=1e-5, optimizer="adam", scheduler="constant",
                reinit_optimizer=True, tuned_epoch=1, freeze=list(FROZEN), prompt_pool=True, pull_constraint=True)
    args.update(overrides)
    return args


def make_learner(learner_cls, net_cls, backbone, original_backbone, args):
    from models.base import BaseLearner

    net = object.__new__(net_cls)
    torch.nn.Module.__init__(net)
    net.backbone = backbone
    net.original_backbone = original_backbone.eval()
    learner = object.__new__(learner_cls)
    BaseLearner.__init__(learner, args)
    learner.topk = 1  # BaseLearner's top-5 accuracy needs at least 5 classes
    learner._network = net
    learner.args = args
    for key in ("batch_size", "init_lr", "weight_decay", "min_lr"):
        setattr(learner, key, args[key])
    for p in net.original_backbone.parameters():
        p.requires_grad = False
    for n, p in net.backbone.named_parameters():
        if n.startswith(tuple(args["freeze"])):
            p.requires_grad = False
    return learner


class PilotPair(Pair):
    schedule = "session"
    pool, top_k = 10, 1

    def __init__(self, checkout: Path, backbone_module: str, learner_module: str, prompt: dict, args: dict) -> None:
        self.stubs = import_pilot(checkout, [backbone_module, "utils.inc_net", learner_module])
        import importlib

        self.vit = importlib.import_module(backbone_module).VisionTransformer
        self.learner_cls = importlib.import_module(learner_module).Learner
        self.net_cls = importlib.import_module("utils.inc_net").PromptVitNet
        self.prompt, self.args = prompt, args

    def build(self, seed):
        torch.manual_seed(seed)
        original = self.vit(**TINY)
        backbone = self.vit(**TINY, **self.prompt)
        learner = make_learner(self.learner_cls, self.net_cls, backbone, original, base_args(**self.args))
        ctx = SimpleNamespace(learner=learner, model=backbone, optimizer=None, usage=torch.zeros(self.pool))
        self.start_task(ctx, 0, True)
        return ctx

    def family_options(self, ctx):
        return dict(num_experts=2)

    def probes(self, ctx, adapters):
        status, detail = try_retrofit(ctx.learner._network, self.method, num_experts=2)
        return [("r2", "INFO", f"retrofit(learner._network, {self.method!r}) {status.lower()}", detail)]

    def start_task(self, ctx, task, own_advance):
        learner = ctx.learner
        if task > 0:
            learner.after_task()
        elif ctx.optimizer is not None:
            return
        learner._cur_task = task
        learner._total_classes = learner._known_classes + CLASSES_PER_TASK
        optimizer = learner.get_optimizer()
        if task > 0:
            learner._init_prompt(optimizer)
            if learner.args["reinit_optimizer"]:
                optimizer = learner.get_optimizer()
        ctx.optimizer = optimizer

    def train_batch(self, ctx, x, y, task):
        with capture_outputs(ctx.learner._network.backbone) as outputs, backward_losses() as losses:
            ctx.learner._init_train([(None, x, y)], None, ctx.optimizer, None)
        ctx.usage += torch.bincount(outputs[-1]["prompt_idx"].reshape(-1), minlength=self.pool).float()
        return losses

    def eval_logits(self, ctx, x, y):
        with capture_outputs(ctx.learner._network.backbone) as outputs:
            ctx.learner._eval_cnn([(None, x, y)])
        return outputs[-1]["logits"].detach(), outputs[-1]["prompt_idx"][:, 0].detach()

    def verify_forward(self, ctx, handle):
        return lambda x: ctx.learner._network(x, task_id=handle.current_expert, train=ctx.model.training)

    def roots(self, ctx):
        return {"network": ctx.learner._network}

    def slot_usage(self, ctx):
        return ctx.usage.clone()

    def expert_slots(self, ctx, expert):
        size = self.pool // 2 if self.counter_name is None else self.top_k
        return list(range(expert * size, (expert + 1) * size))
