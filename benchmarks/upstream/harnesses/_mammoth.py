"""Import of aimagelab/mammoth for the harnesses, and its ContinualModels made at the harness size.

Mammoth's package ``__init__`` files import every data set. In memory only: ``models`` is registered as
a bare namespace package over the checkout's ``models/`` (its ``__init__`` not run; ``get_model_names``
answers an empty list), ``datasets`` is a stand-in (the harness passes sizes directly), ``kornia``,
``open_clip`` and ``wandb`` become stand-ins when missing. A ContinualModel is made without
``__init__`` and given what ``observe`` / ``begin_task`` / ``forward`` read (net, loss, args, task
counters, the class offsets of each task); per batch the harness calls its own ``observe``, at a task
start its own ``begin_task`` (which makes ``self.opt``), at evaluation its own ``forward``.
"""

from __future__ import annotations

import sys
import types
from argparse import Namespace
from pathlib import Path
from typing import List, Sequence

import torch
import torch.nn.functional as F

from benchmarks.upstream.loading import import_upstream, install_stub
from benchmarks.upstream.task_stream import CLASSES_PER_TASK


def import_mammoth(checkout: Path, modules: Sequence[str]) -> List[str]:
    sys.path.insert(0, str(checkout))
    package = types.ModuleType("models")
    package.__path__ = [str(checkout / "models")]
    package.get_model_names = lambda: []
    sys.modules["models"] = package
    install_stub("datasets")
    return import_upstream(checkout, modules, allowed_stubs=["datasets", "kornia", "open_clip", "wandb"])


class Offsets:
    """``dataset.get_offsets(task)`` of the harness's split."""

    def get_offsets(self, task):
        return CLASSES_PER_TASK * task, CLASSES_PER_TASK * (task + 1)


def continual_model(cls, net, args):
    model = object.__new__(cls)
    torch.nn.Module.__init__(model)
    model.net = net
    model.loss = F.cross_entropy
    model.args = args
    model.dataset = Offsets()
    model._current_task = 0
    model._n_past_classes, model._n_seen_classes = model.dataset.get_offsets(0)
    model._past_epoch, model._epoch_iteration = 0, 0
    return model


def set_task(model, task):
    model._current_task = task
    model._n_past_classes, model._n_seen_classes = model.dataset.get_offsets(task)


def base_args(**overrides):
    args = Namespace(optimizer="adam", lr=0.03 * 8 / 256.0, optim_wd=0.0, optim_mom=0.0, optim_nesterov=False,
                     clip_grad=1.0, pull_constraint=True, batchwise_prompt=False, use_permute_fix=False)
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def make_net(net_cls, vit_cls, tiny, prompt, args, **attributes):
    """The model's net made without ``__init__`` (it loads pretrained weights): a frozen prompt-free
    ViT (original_model) and the prompted one, with the usual frozen parts."""
    from benchmarks.upstream.harnesses._task_loop import freeze

    net = object.__new__(net_cls)
    torch.nn.Module.__init__(net)
    for key, value in attributes.items():
        setattr(net, key, value)
    net.original_model = vit_cls(**tiny, args=args).eval()
    net.model = vit_cls(**tiny, **prompt, args=args)
    freeze(net.model, net.original_model)
    return net
