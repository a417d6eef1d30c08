"""The two kinds of per-batch loop the distributed mode (``distributed.py``) runs in each process: a JH-LEE /
HiDe ``engine.train_one_epoch`` (``EngineLoop``) and an online trainer's ``online_step`` (``TrainerLoop``:
FlyGCL, Si-Blurry, MISA), each wrapped in ``DistributedDataParallel`` the way the codebase's launch wraps it."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Tuple

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from .harnesses._task_loop import TaskLoopPair, class_mask
from .loading import quiet
from .observe import capture_outputs
from .pair import Pair

__all__ = ["EngineLoop", "TrainerLoop"]

BASE_LR = 0.03  # the JH-LEE / HiDe configs' lr, scaled by the global batch / 256 as their launch does


class EngineLoop:
    """``engine.train_one_epoch`` on a process's loader, ``engine.evaluate`` on the test batch; the loop's
    ``task_id`` follows the expert (the harness's task start: a new optimizer, DualPrompt's slot copy)."""

    indexed = False  # their loaders give (input, target)

    def __init__(self, pair: TaskLoopPair, find_unused_parameters: bool) -> None:
        self.pair, self.find_unused_parameters = pair, find_unused_parameters

    def build(self, seed: int, global_batch: int, world: int) -> SimpleNamespace:
        sys.modules["utils"].SmoothedValue.synchronize_between_processes = lambda self: None  # CUDA tensors
        ctx = self.pair.build(seed)
        ctx.args.distributed, ctx.args.world_size = world > 1, world
        ctx.args.lr = BASE_LR * global_batch / 256.0  # scaled by the global batch, the same in both runs
        ctx.optimizer = self.pair.optimizer_for(ctx.args, ctx.model)
        ctx.net = ctx.model if world == 1 else torch.nn.parallel.DistributedDataParallel(
            ctx.model, find_unused_parameters=self.find_unused_parameters)
        return ctx

    def start(self, ctx: SimpleNamespace) -> None:
        """Nothing before the first batch: the harness's context starts at task 0."""

    def train(self, ctx: SimpleNamespace, loader: DataLoader) -> None:
        with quiet(True):
            self.pair.engine.train_one_epoch(
                model=ctx.net, original_model=ctx.original_model, criterion=torch.nn.CrossEntropyLoss(),
                data_loader=loader, optimizer=ctx.optimizer, device=torch.device("cpu"), epoch=0,
                max_norm=ctx.args.clip_grad, set_training_mode=True, task_id=ctx.task_id, class_mask=class_mask(),
                args=ctx.args, **self.pair.train_options(ctx))

    def start_expert(self, ctx: SimpleNamespace, expert: int) -> None:
        self.pair.start_task(ctx, expert, own_advance=False)  # README: the task id is handle.current_expert

    def evaluate(self, ctx: SimpleNamespace, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """(logits, the prompts selected ``(N, k)``, the expert each sample was routed to)."""
        with quiet(True), capture_outputs(ctx.model) as outputs:
            self.pair.engine.evaluate(model=ctx.model, original_model=ctx.original_model,
                                      data_loader=[(x, torch.zeros(len(x)).long())], device=torch.device("cpu"),
                                      task_id=ctx.task_id, class_mask=class_mask(), args=ctx.args,
                                      **self.pair.evaluate_options(ctx))
        selection = outputs[-1]["prompt_idx"].detach()
        return outputs[-1]["logits"].detach(), selection, selection[:, 0] // self.pair.top_k


class TrainerLoop:
    """The trainer's own ``online_step`` on a process's batch (its ``self.batchsize // self.world_size``
    samples), its ``online_evaluate`` on the test batch; the trainer set up as its ``setup_distributed_model``
    does (``self.model`` the DDP wrapper with a static graph, ``model_without_ddp`` the model)."""

    indexed = True  # their OnlineIterDataset gives (image, label, index)

    def __init__(self, pair: Pair, find_unused_parameters: bool) -> None:
        self.pair, self.find_unused_parameters = pair, find_unused_parameters

    def build(self, seed: int, global_batch: int, world: int) -> SimpleNamespace:
        ctx = self.pair.build(seed)
        trainer = ctx.trainer
        trainer.distributed, trainer.world_size = world > 1, world
        if world > 1:
            trainer.model = torch.nn.parallel.DistributedDataParallel(
                ctx.model, find_unused_parameters=self.find_unused_parameters)
            trainer.model._set_static_graph()
        return ctx

    def start(self, ctx: SimpleNamespace) -> None:
        with quiet(True):
            self.pair.start_task(ctx, 0, own_advance=False)  # the schedule starts the experts, not the trainer

    def train(self, ctx: SimpleNamespace, loader: DataLoader) -> None:
        with quiet(True):
            for x, y, index in loader:
                ctx.trainer.online_step(x, y, index)

    def start_expert(self, ctx: SimpleNamespace, expert: int) -> None:
        """Nothing: the family's start moved the method's own step counter."""

    def evaluate(self, ctx: SimpleNamespace, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        y = torch.full((len(x),), ctx.trainer.exposed_classes[0], dtype=torch.long)
        with quiet(True):
            logits, rows = self.pair.eval_logits(ctx, x, y)
        return logits, rows.reshape(len(x), -1), rows.reshape(len(x), -1)[:, 0] // self.pair.slots_per_expert(ctx)
