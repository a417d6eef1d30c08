"""liangyanshuo/InfLoRA (``models/sinet_inflora.py`` ``SiNet``) under ``retrofit(method="generic")``.

Real classes: ``models.sinet_inflora.SiNet`` (its ``ViT_lora_co`` encoder, whose ``Attention_LoRA`` blocks
hold one LoRA pair per task and add the sum of tasks ``0..task_id``, and one classifier per task in
``classifier_pool``) and the ``methods.inflora.InfLoRA`` learner, with the CIFAR-100 configuration (Adam,
rank 10 scaled to 4, lamb 0.95, lame 1.0). In memory only: ``models.sinet_inflora._create_vision_transformer``
(which loads ViT-B/16 in21k weights) returns the checkout's ``ViT_lora_co`` at the harness size with random
weights; ``ipdb`` (imported, unused) becomes a stand-in when missing.

The learner's own calls: at a task start what ``incremental_train`` / ``_train`` do inline (for the previous
task: the ``get_cur_feat`` pass over its training images, ``update_DualGPM`` and the projection matrices,
``clustering``, ``after_task``; then the task counters, ``update_fc``, only the task's classifier and
``lora_B`` trainable, the ``get_cur_feat`` pass and the SVD initialisation of the task's ``lora_A``, a new Adam
optimizer and ``CosineSchedule``; ``_train`` reads ``self._network.module`` inside a ``try``, which falls back
to the network itself); per batch ``train_function`` on a loader of that one batch (one epoch: it puts the
network in eval mode, trains, steps the scheduler); evaluation ``_eval_cnn``: ``interface(image)``, every
task's classifier on the features of all tasks' LoRA, concatenated.

Nothing selects a task per sample at inference (every sample uses the sum of all tasks' LoRA), so there is
nothing for a router to replace; the ensemble is the part that applies: the head is the pool
``classifier_pool`` (one bank per task's classifier), and the learner trains in eval mode (``train_in_eval=True``).
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._flygcl import TINY_VIT
from benchmarks.upstream.loading import import_upstream
from benchmarks.upstream.observe import backward_losses
from benchmarks.upstream.pair import Pair
from benchmarks.upstream.task_stream import CLASSES_PER_TASK, NUM_TASKS, make_stream

RANK = 4  # their rank 10 for a width of 768; the harness ViT is 32 wide
ARGS = dict(dataset="cifar100", net_type="sip", embd_dim=TINY_VIT["embed_dim"], num_heads=TINY_VIT["num_heads"],
            total_sessions=NUM_TASKS, init_cls=CLASSES_PER_TASK, increment=CLASSES_PER_TASK, memory_size=0,
            memory_per_class=0, fixed_memory=True, device=["cpu"], EPSILON=1e-8, init_epoch=20, optim="adam",
            init_lr=0.0005, init_lr_decay=0.1, init_weight_decay=0.0, epochs=20, lrate=0.0005, lrate_decay=0.1,
            batch_size=8, weight_decay=0.0, rank=RANK, lamb=0.95, lame=1.0, num_workers=0)


class InfLoRASiNet(Pair):
    name = "InfLoRA / SiNet"
    method = "generic"
    schedule = "session"
    counter_name = "SiNet.numtask - 1 (update_fc)"

    def __init__(self, checkout: Path) -> None:
        self.stubs = import_upstream(checkout, ["models.sinet_inflora", "methods.inflora"], allowed_stubs=["ipdb"])
        sinet = importlib.import_module("models.sinet_inflora")

        def tiny_encoder(variant, pretrained=False, n_tasks=NUM_TASKS, rank=RANK, **kwargs):
            return sinet.ViT_lora_co(**TINY_VIT, num_classes=0, n_tasks=n_tasks, rank=rank)

        sinet._create_vision_transformer = tiny_encoder
        self.inflora = importlib.import_module("methods.inflora")

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"models.sinet_inflora.SiNet (ViT_lora_co at harness size, rank {RANK}, {NUM_TASKS} tasks "
                          f"of {CLASSES_PER_TASK} classes) in methods.inflora.InfLoRA; experts = tasks")

    def build(self, seed):
        torch.manual_seed(seed)
        learner = self.inflora.InfLoRA(dict(ARGS))
        ctx = SimpleNamespace(learner=learner, model=learner._network, optimizer=None, scheduler=None,
                              stream=make_stream(seed=seed)[0])
        self.start_task(ctx, 0, True)
        return ctx

    def family_options(self, ctx):
        # No route: every sample uses every task's LoRA. The head is the pool of per-task classifiers; the
        # learner trains in eval mode.
        return dict(num_experts=NUM_TASKS, head_owner=ctx.model, head_name="classifier_pool", train_in_eval=True)

    def loader(self, ctx, task):
        return [(None, x, y) for x, y in ctx.stream[task]]

    def start_task(self, ctx, task, own_advance):
        learner, net = ctx.learner, ctx.model
        if task > 0:
            self.end_task(ctx, task - 1)
        elif ctx.optimizer is not None:
            return
        learner._cur_task = task
        learner._total_classes = learner._known_classes + CLASSES_PER_TASK
        net.update_fc(learner._total_classes)
        current = tuple(f"{part}.{net.numtask - 1}" for part in ("classifier_pool", "lora_B_k", "lora_B_v"))
        for name, parameter in net.named_parameters():
            parameter.requires_grad_(any(part in name for part in current))
        self.initialise_lora(ctx, task)
        ctx.optimizer = torch.optim.Adam(net.parameters(), lr=learner.init_lr if task == 0 else learner.lrate,
                                         weight_decay=learner.init_weight_decay if task == 0 else learner.weight_decay,
                                         betas=(0.9, 0.999))
        ctx.scheduler = self.inflora.CosineSchedule(optimizer=ctx.optimizer,
                                                    K=learner.init_epoch if task == 0 else learner.epochs)
        learner.run_epoch = 1

    def attention_modules(self, net):
        return [m for m in net.modules() if isinstance(m, self.inflora.Attention_LoRA)]

    def initialise_lora(self, ctx, task):
        """``_train``'s first ``get_cur_feat`` pass and the SVD initialisation of the task's ``lora_A``."""
        learner, net = ctx.learner, ctx.model
        with torch.no_grad():
            for _, inputs, _ in self.loader(ctx, task):
                net(inputs, get_cur_feat=True)
            for kk, module in enumerate(self.attention_modules(net)):
                matrix = module.cur_matrix
                if task > 0:
                    projection = torch.mm(learner.feature_mat[kk], matrix)
                    matrix = matrix - projection if learner.project_type[kk] == "remove" else projection
                u = torch.linalg.svd(matrix, full_matrices=False)[0]
                for lora in (module.lora_A_k[task], module.lora_A_v[task]):
                    lora.weight.data.copy_(u[:, :module.rank].T / math.sqrt(3))
                module.cur_matrix.zero_()
                module.n_cur_matrix = 0

    def end_task(self, ctx, task):
        """``_train``'s last ``get_cur_feat`` pass, ``update_DualGPM``, the projection matrices, then
        ``clustering`` and ``after_task``."""
        learner, net = ctx.learner, ctx.model
        with torch.no_grad():
            for _, inputs, _ in self.loader(ctx, task):
                net(inputs, get_cur_feat=True)
            mat_list = []
            for module in self.attention_modules(net):
                mat_list.append(module.cur_matrix.clone().numpy())  # numpy < 2 (their pin) returned numpy
                module.cur_matrix.zero_()
                module.n_cur_matrix = 0
            learner.update_DualGPM(mat_list)
            learner.feature_mat = [torch.Tensor(np.dot(f, f.transpose())) for f in learner.feature_list]
        learner.clustering(self.loader(ctx, task))
        learner.after_task()

    def train_batch(self, ctx, x, y, task):
        with backward_losses() as losses:
            ctx.learner.train_function([(None, x, y)], None, ctx.optimizer, ctx.scheduler)
        return losses

    def eval_logits(self, ctx, x, y):
        """The logits ``interface`` returns inside ``_eval_cnn`` (no prompt row: nothing is selected)."""
        net, seen = ctx.model, []
        own, interface = net.__dict__.get("interface"), net.interface  # an instance patch (a retrofit's) stays
        net.interface = lambda *args, **kwargs: seen.append(interface(*args, **kwargs)) or seen[-1]
        try:
            ctx.learner._eval_cnn([(None, x, y)])
        finally:
            if own is None:
                del net.__dict__["interface"]
            else:
                net.interface = own
        return seen[-1].detach(), None

    def counter(self, ctx):
        return int(ctx.model.numtask) - 1

    def verify_forward(self, ctx, handle):
        """The learner's calls: ``forward`` in training (``train_function``), ``interface`` in evaluation."""
        net = ctx.model
        return lambda x: net(x) if net.training else net.interface(x)

    def roots(self, ctx):
        return {"network": ctx.model}


def run(checkout: Path, settings: Settings):
    return run_checks(InfLoRASiNet(checkout), settings)
