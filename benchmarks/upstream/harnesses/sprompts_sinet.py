"""iamwangyabin/S-Prompts (official code, S-iPrompts: ``models/sinet.py`` ``SiNet``) under
``retrofit(method="generic")``.

Real classes: ``models.sinet.SiNet`` (one prompt ``nn.Linear`` and one classifier per domain in
``prompt_pool`` / ``classifier_pool``, its ``ViT_Prompts`` encoder) and the ``methods.sprompt.SPrompts``
learner, with the CDDB configuration (2 classes per domain, prompt length 10, SGD with momentum 0.9). In
memory only: ``models.sinet._create_vision_transformer`` (which loads ViT-B/16 weights) returns the checkout's
``ViT_Prompts`` at the harness size with random weights; the checkout's ``models.slinet`` (the CLIP variant,
S-liPrompts, which builds a tokenizer on import and is unused here) is a stand-in.

The learner's own calls: at a task start what ``incremental_train`` / ``_train`` do (``after_task`` and
``clustering`` of the previous task, the task counters, ``update_fc``, only the current domain's prompt and
classifier trainable, a new SGD optimizer and cosine scheduler; ``_train`` reads ``self._network.module``,
which exists only under ``DataParallel``, so the harness sets the same flags on the network itself); per
batch ``train_function`` on a loader of that one batch (one epoch: it puts the network in eval mode, trains,
steps the scheduler and evaluates its own ``forward`` on a test loader); evaluation ``_eval_cnn``: the
prompt-free ``extract_vector``, the nearest k-means key per domain, then ``interface(image, selection)``.

The generic seams: the query is the encoder's prompt-free call (``query_when``: no prompt tokens), which
``extract_vector`` makes at evaluation and the user's line before the training forward makes in training; the
route is ``interface``'s ``selection`` (``route_method``), the head the pool ``classifier_pool``; the learner
trains in eval mode (``train_in_eval=True``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.upstream.checks import Settings, run_checks
from benchmarks.upstream.harnesses._flygcl import TINY_VIT
from benchmarks.upstream.loading import import_upstream, install_stub
from benchmarks.upstream.observe import backward_losses, match_rows
from benchmarks.upstream.pair import Pair, active_handle
from benchmarks.upstream.task_stream import CLASSES_PER_TASK, NUM_TASKS, make_stream

ARGS = dict(dataset="cddb", net_type="sip", embd_dim=TINY_VIT["embed_dim"], prompt_length=10,
            total_sessions=NUM_TASKS, memory_size=0, memory_per_class=0, fixed_memory=True, device=["cpu"],
            EPSILON=1e-8, init_epoch=1, init_lr=0.01, init_lr_decay=0.1, init_weight_decay=2e-4, epochs=1,
            lrate=0.01, lrate_decay=0.1, batch_size=8, weight_decay=2e-4, num_workers=0)


def stacked_prompts(net):
    """(domains, length, width): the prompt of each domain, as ``interface`` stacks them."""
    return torch.stack([p.weight for p in net.prompt_pool], 0)


def prompt_free(args, kwargs) -> bool:
    """The user's ``query_when``: the encoder's prompt-free call (``extract_vector``'s), not the prompted ones."""
    return len(args) < 2 and kwargs.get("instance_tokens") is None


class QueryPassLoader:
    """``train_function``'s loader of one batch. With a retrofit, the user's line in ``train_function`` runs right
    before the training forward, ``with torch.no_grad(): self._network.extract_vector(inputs)`` (their training
    runs no prompt-free pass, the router's query): here when the loader hands the batch over (the loop then only
    masks the batch, all of the current domain, and calls the model), so the model sees the same calls in the
    same order."""

    def __init__(self, ctx, x, y) -> None:
        self.ctx, self.batch = ctx, (None, x, y)

    def __len__(self) -> int:
        return 1

    def __iter__(self):
        if active_handle(self.ctx) is not None:
            with torch.no_grad():
                self.ctx.model.extract_vector(self.batch[1])
        yield self.batch


class SPromptsSiNet(Pair):
    name = "S-Prompts / S-iPrompts (SiNet)"
    method = "generic"
    schedule = "session"
    counter_name = "SiNet.numtask - 1 (update_fc)"

    def __init__(self, checkout: Path) -> None:
        self.stubs = import_upstream(checkout, ["models.sinet"])
        install_stub("models.slinet")  # the CLIP variant (S-liPrompts): builds a tokenizer on import, unused here
        self.stubs.append("models.slinet")
        import_upstream(checkout, ["methods.sprompt"])
        sinet = importlib.import_module("models.sinet")

        def tiny_encoder(variant, pretrained=False, **kwargs):
            return sinet.ViT_Prompts(**TINY_VIT, num_classes=0)

        sinet._create_vision_transformer = tiny_encoder
        self.learner_cls = importlib.import_module("methods.sprompt").SPrompts

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"models.sinet.SiNet (ViT_Prompts at harness size, {NUM_TASKS} domains of "
                          f"{CLASSES_PER_TASK} classes) in methods.sprompt.SPrompts; experts = domains")

    def build(self, seed):
        torch.manual_seed(seed)
        learner = self.learner_cls(dict(ARGS))
        train, (x_test, y_test) = make_stream(seed=seed)
        ctx = SimpleNamespace(learner=learner, model=learner._network, optimizer=None, scheduler=None, stream=train,
                              test_loader=[(None, x_test[:8], y_test[:8])])
        self.start_task(ctx, 0, True)
        return ctx

    def family_options(self, ctx):
        net = ctx.model
        return dict(num_experts=NUM_TASKS, query_module=net.image_encoder, query_when=prompt_free,
                    route_module=net, route_method="interface", route_kwarg="selection",
                    head_owner=net, head_name="classifier_pool", train_in_eval=True)

    def start_task(self, ctx, task, own_advance):
        learner, net = ctx.learner, ctx.model
        if task > 0:
            self.cluster(ctx, task - 1)
            learner.after_task()
        elif ctx.optimizer is not None:
            return
        learner._cur_task = task
        learner._total_classes = learner._known_classes + CLASSES_PER_TASK
        net.update_fc(learner._total_classes)
        current = (f"classifier_pool.{net.numtask - 1}", f"prompt_pool.{net.numtask - 1}")
        for name, parameter in net.named_parameters():
            parameter.requires_grad_(name.startswith(current))
        lr, decay = (learner.init_lr, learner.init_weight_decay) if task == 0 else (learner.lrate, learner.weight_decay)
        ctx.optimizer = torch.optim.SGD(net.parameters(), momentum=0.9, lr=lr, weight_decay=decay)
        ctx.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer=ctx.optimizer, T_max=1)
        learner.run_epoch = 1

    def cluster(self, ctx, task):
        """``clustering`` of one domain's training images (the learner runs it after ``_train``)."""
        if len(ctx.learner.all_keys) <= task:
            ctx.learner.clustering([(None, x, y) for x, y in ctx.stream[task]])

    def train_batch(self, ctx, x, y, task):
        with backward_losses() as losses:
            ctx.learner.train_function(QueryPassLoader(ctx, x, y), ctx.test_loader, ctx.optimizer, ctx.scheduler)
        return losses

    def eval_logits(self, ctx, x, y):
        """The logits ``interface`` returns inside ``_eval_cnn``, and the domain prompt each sample used."""
        net = ctx.model
        self.cluster(ctx, net.numtask - 1)
        seen, rows = [], []

        def prompted(module, args, kwargs):
            tokens = args[1] if len(args) > 1 else kwargs.get("instance_tokens")
            if tokens is not None and tokens.ndim == 3:
                rows.append(match_rows(tokens, stacked_prompts(net)))

        hook = net.image_encoder.register_forward_pre_hook(prompted, with_kwargs=True)
        own, interface = net.__dict__.get("interface"), net.interface  # an instance patch (a retrofit's) stays
        net.interface = lambda *args, **kwargs: seen.append(interface(*args, **kwargs)) or seen[-1]
        try:
            ctx.learner._eval_cnn([(None, x, y)])
        finally:
            hook.remove()
            if own is None:
                del net.__dict__["interface"]
            else:
                net.interface = own
        return seen[-1].detach(), rows[-1] if rows else None

    def counter(self, ctx):
        return int(ctx.model.numtask) - 1

    def verify_forward(self, ctx, handle):
        """The learner's calls: ``forward`` in training (``train_function``); in evaluation (``_eval_cnn``) the
        prompt-free ``extract_vector``, then ``interface`` with a selection (domain 0 here, the router's
        choice once routed)."""
        net = ctx.model

        def forward(x):
            with torch.no_grad():
                net.extract_vector(x)  # the query pass: the user's line in training, _eval_cnn's own at inference
            if net.training:
                return net(x)
            return net.interface(x, torch.zeros(len(x), dtype=torch.long))

        return forward

    def roots(self, ctx):
        return {"network": ctx.model}


def run(checkout: Path, settings: Settings):
    return run_checks(SPromptsSiNet(checkout), settings)
