"""The upstream checks' distributed mode: a codebase's own training loop over gloo processes, against one process.

    python -m benchmarks.upstream.distributed --codebase NAME --checkout DIR [--world 2]

``NAME`` is a row of ``CODEBASES`` (l2p-pytorch, dualprompt-pytorch, HiDe-Prompt, MoE_PromptCL-hide,
MoE_PromptCL-norga) and ``DIR`` a checkout of its repository (imported from there, never copied). Their launch is
distributed (``torch.distributed.launch``; the main script or trainer wraps the model in
``DistributedDataParallel``, gives each process a ``DistributedSampler`` share of ``batch_size`` samples and scales
the learning rate by the global batch). Here each of ``--world`` gloo processes builds the codebase's harness
model (``benchmarks/upstream/harnesses``), retrofits it, wraps it in ``DistributedDataParallel`` as the codebase
does and calls the checkout's ``engine.train_one_epoch`` with ``args.distributed=True`` on a loader of its
``DistributedSampler`` share of each global batch, then ``handle.end_batch()``; the loop's ``task_id`` follows
the expert the schedule started (the task start of the harness: a new optimizer, DualPrompt's slot copy).
Evaluation is the checkout's ``engine.evaluate`` on the model. One process runs the same global batches with
``args.distributed=False``. Printed per process: whether its router holds every process's rows (the float64
bound), its expert starts, routed experts, selected prompts and predictions against the single process.

The metric logger's cross-process averaging (CUDA tensors, for the printed averages only) is off on the CPU.
l2p-pytorch's ``batchwise_prompt`` (an upstream default: the prompts most frequent in the batch a process sees,
so under DDP each process selects from its own share and the method itself trains differently from one process)
stays on unless ``--same-selection`` turns it off; the predictions are then the single process's up to float
rounding. The other codebases train the prompt slot of their task (prompt mask) and select one slot per expert.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fly_modules import AnalyticRouter, SampleBudgetSchedule
from fly_modules._validation import Integer

from ..flags import Parser, add_flag
from .checks import ROUTER_OPTIONS, retrofit
from .harnesses._hide import HiDeLayout
from .harnesses._prompt_options import l2p_prompt
from .harnesses._task_loop import CLASSES_PER_TASK, TaskLoopPair, class_mask
from .harnesses.dualprompt_pytorch_dualprompt import DualPromptPytorch
from .harnesses.l2p_pytorch_l2p import POOL, TOP_K, L2PPytorch
from .loading import no_cuda_sync, quiet
from .observe import capture_outputs
from .registry import checkout_commit
from .task_stream import IMAGE_SIZE

__all__ = ["CODEBASES", "main"]

BATCHES, GLOBAL_BATCH, BUDGET, SEED = 4, 16, 48, 0
BASE_LR = 0.03  # their configs' lr, scaled by the global batch / 256 as their launch does


@dataclass(frozen=True)
class Codebase:
    """How a codebase's launch runs: its harness pair, the DDP wrapper's ``find_unused_parameters`` and where its
    launch wraps the model, and its training terms that depend on the batch a process sees (``batch_dependent``)
    with the change of the pair that turns them off (``--same-training``)."""

    pair: Callable[[Path], TaskLoopPair]
    find_unused_parameters: bool
    wrapped_at: str
    batch_dependent: str
    same_training: Callable[[TaskLoopPair], None]


def _per_sample_prompts(pair: TaskLoopPair) -> None:
    pair.prompt = l2p_prompt(POOL, TOP_K, batchwise_prompt=False)


def _no_orth_loss(pair: TaskLoopPair) -> None:
    pair.run_args = dict(pair.run_args, reg=0.0)


_ORTH = "orth_loss (args.reg 0.1: a contrastive loss between the samples of the batch a process sees)"
CODEBASES: Dict[str, Codebase] = {
    "l2p-pytorch": Codebase(L2PPytorch, False, "main.py:111", "batchwise_prompt (the prompts most frequent in "
                            "the batch a process sees)", _per_sample_prompts),
    "dualprompt-pytorch": Codebase(DualPromptPytorch, False, "main.py:119", "", lambda pair: None),
    "HiDe-Prompt": Codebase(lambda c: HiDeLayout(c, "hide", "HiDe-Prompt / HiDe"), True,
                            "trainers/hideprompt_trainer.py:95", _ORTH, _no_orth_loss),
    "MoE_PromptCL-hide": Codebase(lambda c: HiDeLayout(c, "hide", "MoE_PromptCL / HiDe"), True,
                                  "trainers/hideprompt_trainer.py:95", _ORTH, _no_orth_loss),
    "MoE_PromptCL-norga": Codebase(lambda c: HiDeLayout(c, "norga", "MoE_PromptCL / NoRGa"), True,
                                   "trainers/norgaprompt_trainer.py:99", _ORTH, _no_orth_loss),
}


def _stream() -> List[TensorDataset]:
    """Global batches of labels within a task's classes (the task's offset is added when it is trained)."""
    gen = torch.Generator().manual_seed(SEED)
    return [TensorDataset(torch.randn(GLOBAL_BATCH, 3, IMAGE_SIZE, IMAGE_SIZE, generator=gen) + 0.5 * step,
                          torch.randint(0, CLASSES_PER_TASK, (GLOBAL_BATCH,), generator=gen))
            for step in range(BATCHES)]


def _loader(batch: TensorDataset, task: int, rank: int, world: int) -> DataLoader:
    """Their datasets.py: a DistributedSampler share of ``batch_size`` samples per process (no shuffle here, so
    the single process sees the same global batch); labels in the classes of ``task``."""
    x, y = batch.tensors
    batch = TensorDataset(x, y + task * CLASSES_PER_TASK)
    if world == 1:
        return DataLoader(batch, batch_size=GLOBAL_BATCH)
    sampler = DistributedSampler(batch, num_replicas=world, rank=rank, shuffle=False)
    return DataLoader(batch, sampler=sampler, batch_size=GLOBAL_BATCH // world)


@dataclass(frozen=True)
class Mode:
    """One command's run: the codebase (a key of ``CODEBASES``), its checkout, ``same_training`` (its
    batch-dependent training terms off) and ``alone`` (each process retrofits with ``distributed=False``: the
    synchronisation off, so the checks must fail)."""

    name: str
    checkout: Path
    same_training: bool = False
    alone: bool = False


def _setup(mode: Mode, world: int):
    """The pair, its built context (the launch's arguments and optimizer) and the model as the launch wraps it."""
    codebase = CODEBASES[mode.name]
    pair = codebase.pair(mode.checkout)
    if mode.same_training:
        codebase.same_training(pair)
    sys.modules["utils"].SmoothedValue.synchronize_between_processes = lambda self: None  # CUDA tensors
    ctx = pair.build(SEED)
    ctx.args.distributed, ctx.args.world_size = world > 1, world
    ctx.args.lr = BASE_LR * GLOBAL_BATCH / 256.0  # scaled by the global batch, the same in both runs
    ctx.optimizer = pair.optimizer_for(ctx.args, ctx.model)
    net = ctx.model if world == 1 else torch.nn.parallel.DistributedDataParallel(
        ctx.model, find_unused_parameters=CODEBASES[mode.name].find_unused_parameters)
    return pair, ctx, net


def run(mode: Mode, rank: int, world: int) -> Dict[str, Any]:
    """Train the stream the checkout's way in this process (one of ``world``); the process's results."""
    no_cuda_sync()
    pair, ctx, net = _setup(mode, world)
    # correct_assembly: DualPrompt's and HiDe's prefix assembly mixes the samples of a batch (docs/adapters.md);
    # a model whose assembly does not mix (l2p-pytorch's) is left as it is
    options = {"num_experts": 2, "correct_assembly": True, **pair.family_options(ctx)}
    if mode.alone:
        options["distributed"] = False
    handle = retrofit(ctx.model, pair.method, router=True, ensemble=True, optimizer=ctx.optimizer,
                      schedule=SampleBudgetSchedule(BUDGET, 2), **options)
    starts, queries = [], []
    for batch in _stream():
        with quiet(True):
            pair.engine.train_one_epoch(
                model=net, original_model=ctx.original_model, criterion=torch.nn.CrossEntropyLoss(),
                data_loader=_loader(batch, ctx.task_id, rank, world), optimizer=ctx.optimizer,
                device=torch.device("cpu"), epoch=0, max_norm=ctx.args.clip_grad, set_training_mode=True,
                task_id=ctx.task_id, class_mask=class_mask(), args=ctx.args, **pair.train_options(ctx))
        queries.append(handle.record.query.detach().clone())
        starts.append(handle.end_batch())
        for expert in starts[-1]:  # the loop's task follows the expert (README: pass handle.current_expert)
            pair.start_task(ctx, expert, own_advance=False)
    x = torch.randn(12, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(99))
    with quiet(True), capture_outputs(ctx.model) as outputs:
        pair.engine.evaluate(model=ctx.model, original_model=ctx.original_model,
                             data_loader=[(x, torch.zeros(12).long())], device=torch.device("cpu"),
                             task_id=ctx.task_id, class_mask=class_mask(), args=ctx.args,
                             **pair.evaluate_options(ctx))
    handle.router.flush()
    return {"starts": starts, "queries": queries, "gram": handle.router.gram.clone(), "counts": handle.router.counts,
            "logits": outputs[-1]["logits"].detach(), "selection": outputs[-1]["prompt_idx"].detach(),
            "top_k": pair.top_k}


def _worker(rank: int, world: int, mode: Mode, folder: str) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=world,
                                timeout=timedelta(seconds=300))
        torch.save(run(mode, rank, world), os.path.join(folder, f"rank{rank}.pt"))
        dist.barrier()
    except BaseException:  # noqa: BLE001 - shown, then a non-zero exit for mp.spawn to report
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # no teardown: gloo's destructor can deadlock before torch 2.8 (docs/router.md)


def _expert_per_batch(starts: List[List[int]]) -> List[int]:
    """The expert each batch trained: the last one started before it."""
    experts, current = [], 0
    for started in starts:
        experts.append(current)
        current = started[-1] if started else current
    return experts


def _reference_statistics(ranks: List[Dict[str, Any]]) -> Tensor:
    """``G`` of one router fed every process's recorded rows, global batch by global batch in rank order."""
    queries = [torch.cat(parts) for parts in zip(*(r["queries"] for r in ranks))]
    router = AnalyticRouter(queries[0].shape[1], 2, **ROUTER_OPTIONS)
    for rows, expert in zip(queries, _expert_per_batch(ranks[0]["starts"])):
        router.update(rows, expert)
    router.flush()
    return router.gram


def compare(ranks: List[Dict[str, Any]], single: Dict[str, Any]) -> List[str]:
    """One line per check and process: PASS or FAIL, what it establishes, the figures."""
    reference, lines, top_k = _reference_statistics(ranks), [], single["top_k"]
    rows = int(single["counts"].sum())
    bound = 2 * rows * torch.finfo(torch.float64).eps * float(reference.trace())  # tests/ridge_bounds.py's norm-wise rule
    for rank, result in enumerate(ranks):
        synchronised = float((result["gram"] - reference).norm())
        relative = float((result["gram"] - single["gram"]).norm() / single["gram"].norm())
        difference = float((result["logits"] - single["logits"]).abs().max())
        checks = {
            "router = one router fed every process's rows": (
                synchronised <= bound and int(result["counts"].sum()) == rows,
                f"||G - G_all|| {synchronised:.1e} <= {bound:.1e}, {int(result['counts'].sum())} of {rows} rows"),
            "statistics = the single process's (float32 queries)": (relative <= 1e-5, f"relative {relative:.1e}"),
            "experts start at the same global batch": (result["starts"] == single["starts"], str(result["starts"])),
            f"routes as one process (the expert: prompt_idx // {top_k})": (
                torch.equal(result["selection"][:, 0] // top_k, single["selection"][:, 0] // top_k), "the router's"),
            "selects the prompts one process does (prompt_idx)": (
                torch.equal(result["selection"], single["selection"]), "the method's own key match in the expert"),
            "predicts as one process": (torch.equal(result["logits"].argmax(1), single["logits"].argmax(1)),
                                        f"max |logit difference| {difference:.1e}"),
        }
        lines += [f"process {rank}: {'PASS' if ok else 'FAIL'}  {name}: {detail}" for name, (ok, detail) in checks.items()]
    return lines


def main(argv: List[str] = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codebase", choices=sorted(CODEBASES), default="l2p-pytorch",
                        help="whose loop runs (default l2p-pytorch)")
    parser.add_argument("--checkout", type=Path, required=True, help="a checkout of the codebase's repository")
    add_flag(parser, "--world", Integer(minimum=2, maximum=GLOBAL_BATCH), default=2,
             help=f"processes (a divisor of the global batch of {GLOBAL_BATCH}: each gets an equal share)")
    parser.add_argument("--same-training", "--same-selection", action="store_true",
                        help="the codebase's training terms that depend on the batch a process sees off "
                             "(l2p-pytorch: batchwise_prompt; HiDe-Prompt, MoE_PromptCL: orth_loss)")
    parser.add_argument("--alone", action="store_true",
                        help="each process retrofits with distributed=False (the synchronisation off: checks fail)")
    args = parser.parse_args(argv)
    if GLOBAL_BATCH % args.world:
        parser.error(f"argument --world: {args.world} does not divide the global batch of {GLOBAL_BATCH}")
    codebase = CODEBASES[args.codebase]
    if args.same_training and not codebase.batch_dependent:
        parser.error(f"argument --same-training: {args.codebase} trains nothing that depends on the batch a process "
                     "sees; drop the flag")
    mode = Mode(args.codebase, args.checkout.resolve(), args.same_training, args.alone)
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_worker, args=(args.world, mode, folder), nprocs=args.world, join=True)
        ranks = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(args.world)]
    lines = compare(ranks, run(mode, 0, 1))
    terms = codebase.batch_dependent and (" off" if args.same_training else " on")
    print(f"{args.codebase} ({checkout_commit(mode.checkout)}): {args.world} gloo processes, DistributedDataParallel "
          f"as {codebase.wrapped_at}" + (f"; {codebase.batch_dependent}{terms}" if terms else "")
          + ("; distributed=False" if args.alone else ""))
    print("\n".join(lines))
    return 0 if all(" PASS " in f" {line} " for line in lines) else 1


if __name__ == "__main__":
    raise SystemExit(main())
