"""The upstream checks' distributed mode: a codebase's own training loop over gloo processes, against one process.

    python -m benchmarks.upstream.distributed --codebase NAME --checkout DIR [--world 2]

``NAME`` is a row of ``CODEBASES`` and ``DIR`` a checkout of its repository (imported from there, never copied).
Their launches are distributed: JH-LEE's and HiDe's (``torch.distributed.launch``) wrap the model in
``DistributedDataParallel``, give each process a ``DistributedSampler`` share of ``batch_size`` samples and scale
the learning rate by the global batch; the online trainers of FlyGCL, Si-Blurry and MISA spawn one process per
GPU, divide ``batchsize`` by the world size, wrap ``self.model`` (static graph) and give each process every
``world``-th sample of the stream. Here each of ``--world`` gloo processes builds the codebase's harness model
(``benchmarks/upstream/harnesses``), retrofits it, wraps it as the codebase does and runs the checkout's own
per-batch training call on its share of each global batch (``distributed_loops.py``), then
``handle.end_batch()``; evaluation is the checkout's own call on the model. One process runs the same global
batches undivided. Printed per process: whether its router holds every process's rows (the float64 bound), its
expert starts, routed experts, selected prompts and predictions against the single process.

Training terms that depend on the batch a process sees (l2p-pytorch's ``batchwise_prompt``, HiDe's and NoRGa's
``orth_loss``) stay on unless ``--same-training`` turns them off; the predictions are then the single process's
up to float rounding. ``--alone`` retrofits with ``distributed=False`` in every process: the checks must fail.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fly_modules import AnalyticRouter, SampleBudgetSchedule
from fly_modules._validation import Integer

from ..flags import Parser, add_flag, add_input_flag
from ..parallel import leave_after
from .checks import ROUTER_OPTIONS, retrofit
from .distributed_loops import EngineLoop, TrainerLoop
from .harnesses._flygcl_hide import FlyGCLPrefix
from .harnesses._hide import HiDeLayout
from .harnesses._prompt_options import l2p_prompt
from .harnesses._task_loop import CLASSES_PER_TASK
from .harnesses.dualprompt_pytorch_dualprompt import DualPromptPytorch
from .harnesses.flygcl_dualprompt import FlyGCLDualPrompt
from .harnesses.flygcl_l2p import FlyGCLL2P
from .harnesses.flygcl_mvp import FlyGCLMVP
from .harnesses.flygcl_sprompt import FlyGCLSPrompt
from .harnesses.l2p_pytorch_l2p import POOL, TOP_K, L2PPytorch
from .harnesses.misa_mvp import MISAMVP
from .harnesses.siblurry_mvp import SiBlurryMVP
from .loading import no_cuda_sync
from .registry import checkout_commit
from .task_stream import IMAGE_SIZE

__all__ = ["CODEBASES", "main"]

BATCHES, GLOBAL_BATCH, BUDGET, SEED = 4, 16, 48, 0
REPEAT = 4  # each label this many times in a row: see _stream


@dataclass(frozen=True)
class Codebase:
    """How a codebase's launch runs: its harness pair and loop kind, the DDP wrapper's ``find_unused_parameters``
    and where its launch wraps the model, and its training terms that depend on the batch a process sees
    (``batch_dependent``) with the change of the pair that turns them off (``--same-training``), if any."""

    pair: Callable[[Path], Any]
    loop: type
    find_unused_parameters: bool
    wrapped_at: str
    batch_dependent: str = ""
    same_training: Optional[Callable[[Any], None]] = None
    num_experts: int = 2  # MVP routes to a prompt: as many experts as prompts


def _per_sample_prompts(pair: Any) -> None:
    pair.prompt = l2p_prompt(POOL, TOP_K, batchwise_prompt=False)


def _no_orth_loss(pair: Any) -> None:
    pair.run_args = dict(pair.run_args, reg=0.0)


_ORTH = "orth_loss (args.reg 0.1: a contrastive loss between the samples of the batch a process sees)"
_HIDE = "trainers/hideprompt_trainer.py:95"
_FLYGCL = "methods/_trainer.py:156"
_OWN_SHARE = ("training through model_without_ddp ({}): DDP never averages the gradients, each process trains "
              "its model on its own share")
_PREFIX_SHARE = _OWN_SHARE.format("methods/hide_norga_trainer.py:146, 149")
CODEBASES: Dict[str, Codebase] = {
    "l2p-pytorch": Codebase(L2PPytorch, EngineLoop, False, "main.py:111", "batchwise_prompt (the prompts most "
                            "frequent in the batch a process sees)", _per_sample_prompts),
    "dualprompt-pytorch": Codebase(DualPromptPytorch, EngineLoop, False, "main.py:119"),
    "HiDe-Prompt": Codebase(lambda c: HiDeLayout(c, "hide", "HiDe-Prompt / HiDe"), EngineLoop, True, _HIDE, _ORTH,
                            _no_orth_loss),
    "MoE_PromptCL-hide": Codebase(lambda c: HiDeLayout(c, "hide", "MoE_PromptCL / HiDe"), EngineLoop, True, _HIDE,
                                  _ORTH, _no_orth_loss),
    "MoE_PromptCL-norga": Codebase(lambda c: HiDeLayout(c, "norga", "MoE_PromptCL / NoRGa"), EngineLoop, True,
                                   "trainers/norgaprompt_trainer.py:99", _ORTH, _no_orth_loss),
    "FlyGCL-dualprompt": Codebase(FlyGCLDualPrompt, TrainerLoop, False, _FLYGCL),
    "FlyGCL-l2p": Codebase(FlyGCLL2P, TrainerLoop, False, _FLYGCL),
    "FlyGCL-mvp": Codebase(FlyGCLMVP, TrainerLoop, False, _FLYGCL, _OWN_SHARE.format("methods/mvp.py:151")),
    "FlyGCL-sprompt": Codebase(FlyGCLSPrompt, TrainerLoop, False, _FLYGCL),
    "FlyGCL-hide": Codebase(lambda c: FlyGCLPrefix(c, "hide"), TrainerLoop, False, _FLYGCL, _PREFIX_SHARE),
    "FlyGCL-norga": Codebase(lambda c: FlyGCLPrefix(c, "norga"), TrainerLoop, False, _FLYGCL, _PREFIX_SHARE),
    "Si-Blurry-mvp": Codebase(SiBlurryMVP, TrainerLoop, False, "methods/_trainer.py:115",
                              _OWN_SHARE.format("methods/mvp.py:96")),
    "MISA-mvp": Codebase(MISAMVP, TrainerLoop, False, "methods/_trainer.py:274", _OWN_SHARE.format("methods/mvp.py:145"),
                         num_experts=10),
}


def _stream() -> List[TensorDataset]:
    """Global batches of labels within a task's classes (the task's offset is added when it is trained), each
    label ``REPEAT`` times in a row, so the share of each of 2 or 4 processes holds the classes of the global batch
    in the same order (the online trainers' per-batch class mask and exposed-class order are then those of one
    process)."""
    gen = torch.Generator().manual_seed(SEED)
    return [TensorDataset(torch.randn(GLOBAL_BATCH, 3, IMAGE_SIZE, IMAGE_SIZE, generator=gen) + 0.5 * step,
                          torch.randint(0, CLASSES_PER_TASK, (GLOBAL_BATCH // REPEAT,), generator=gen)
                          .repeat_interleave(REPEAT)) for step in range(BATCHES)]


def _loader(batch: TensorDataset, step: int, task: int, rank: int, world: int, indexed: bool) -> DataLoader:
    """A DistributedSampler share of the global batch per process (no shuffle, so the single process sees the same
    global batch): the JH-LEE / HiDe datasets.py's sampler, and the samples the online trainers' OnlineSampler
    gives a process (every ``world``-th of the stream, from its rank: ``utils/onlinesampler.py``) in batches of
    ``batchsize // world_size``; labels in the classes of ``task``; ``indexed``: each sample's index in the stream
    too (the online trainers' ``OnlineIterDataset`` gives it, their replay memory gathers it)."""
    x, y = batch.tensors
    fields = (x, y + task * CLASSES_PER_TASK) + ((torch.arange(len(x)) + step * GLOBAL_BATCH,) if indexed else ())
    batch = TensorDataset(*fields)
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


def run(mode: Mode, rank: int, world: int) -> Dict[str, Any]:
    """Train the stream the checkout's way in this process (one of ``world``); the process's results."""
    no_cuda_sync()
    codebase = CODEBASES[mode.name]
    pair = codebase.pair(mode.checkout)
    if mode.same_training:
        codebase.same_training(pair)
    loop = codebase.loop(pair, codebase.find_unused_parameters)
    ctx = loop.build(SEED, GLOBAL_BATCH, world)
    # correct_assembly: DualPrompt's and HiDe's prefix assembly mixes the samples of a batch (docs/adapters.md);
    # a model whose assembly does not mix is left as it is
    options = {"num_experts": codebase.num_experts, "correct_assembly": True, **pair.family_options(ctx)}
    if mode.alone:
        options["distributed"] = False
    ctx.handle = handle = retrofit(ctx.model, pair.method, router=True, ensemble=True, optimizer=ctx.optimizer,
                                   schedule=SampleBudgetSchedule(BUDGET, codebase.num_experts), **options)
    loop.start(ctx)
    starts, queries = [], []
    for step, batch in enumerate(_stream()):
        loop.train(ctx, _loader(batch, step, handle.current_expert, rank, world, loop.indexed))
        queries.append(handle.record.query.detach().clone())
        starts.append(handle.end_batch())
        for expert in starts[-1]:
            loop.start_expert(ctx, expert)
    logits, selection, route = loop.evaluate(
        ctx, torch.randn(12, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(99)))
    handle.router.flush()
    return {"starts": starts, "queries": queries, "gram": handle.router.gram.clone(), "counts": handle.router.counts,
            "logits": logits, "selection": selection, "route": route}


def _worker(rank: int, world: int, mode: Mode, folder: str) -> None:
    leave_after(_rank, rank, world, mode, folder)


def _rank(rank: int, world: int, mode: Mode, folder: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    torch.save(run(mode, rank, world), os.path.join(folder, f"rank{rank}.pt"))
    dist.barrier()


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
    router = AnalyticRouter(queries[0].shape[1], len(ranks[0]["counts"]), **ROUTER_OPTIONS)
    for rows, expert in zip(queries, _expert_per_batch(ranks[0]["starts"])):
        router.update(rows, expert)
    router.flush()
    return router.gram


def compare(ranks: List[Dict[str, Any]], single: Dict[str, Any]) -> List[Tuple[bool, str]]:
    """``(passed, line)`` per check and process: the line says PASS or FAIL, what it establishes, the figures."""
    reference, lines = _reference_statistics(ranks), []
    rows = int(single["counts"].sum())
    bound = 2 * rows * torch.finfo(torch.float64).eps * float(reference.trace())  # tests/ridge_bounds.py's norm-wise rule
    for rank, result in enumerate(ranks):
        synchronised = float((result["gram"] - reference).norm())
        relative = float((result["gram"] - single["gram"]).norm() / single["gram"].norm())
        same = result["logits"] == single["logits"]  # equal masked (-inf) classes differ by 0, not nan
        difference = float(torch.where(same, 0.0, (result["logits"] - single["logits"]).abs()).max())
        checks = {
            "router = one router fed every process's rows": (
                synchronised <= bound and int(result["counts"].sum()) == rows,
                f"||G - G_all|| {synchronised:.1e} <= {bound:.1e}, {int(result['counts'].sum())} of {rows} rows"),
            "statistics = the single process's (float32 queries)": (relative <= 1e-5, f"relative {relative:.1e}"),
            "experts start at the same global batch": (result["starts"] == single["starts"], str(result["starts"])),
            "routes as one process": (torch.equal(result["route"], single["route"]), "the expert each sample used"),
            "selects the prompts one process does": (
                torch.equal(result["selection"], single["selection"]), "the method's own selection in the expert"),
            "predicts as one process": (torch.equal(result["logits"].argmax(1), single["logits"].argmax(1)),
                                        f"max |logit difference| {difference:.1e}"),
        }
        lines += [(bool(ok), f"process {rank}: {'PASS' if ok else 'FAIL'}  {name}: {detail}")
                  for name, (ok, detail) in checks.items()]
    return lines


def main(argv: List[str] = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codebase", choices=sorted(CODEBASES), default="l2p-pytorch",
                        help="whose loop runs (default l2p-pytorch)")
    add_input_flag(parser, "--checkout", "folder", required=True, help="a checkout of the codebase's repository")
    add_flag(parser, "--world", Integer(minimum=2, maximum=GLOBAL_BATCH), default=2,
             help=f"processes (a divisor of the global batch of {GLOBAL_BATCH}: each gets an equal share)")
    parser.add_argument("--same-training", action="store_true",
                        help="the codebase's training terms that depend on the batch a process sees off "
                             "(l2p-pytorch: batchwise_prompt; HiDe-Prompt, MoE_PromptCL: orth_loss)")
    parser.add_argument("--alone", action="store_true",
                        help="each process retrofits with distributed=False (the synchronisation off: checks fail)")
    args = parser.parse_args(argv)
    if GLOBAL_BATCH % args.world:
        parser.error(f"argument --world: {args.world} does not divide the global batch of {GLOBAL_BATCH}")
    codebase = CODEBASES[args.codebase]
    if codebase.loop.indexed and REPEAT % args.world:
        parser.error(f"argument --world: {args.codebase}'s trainer masks each process's batch to its classes, which "
                     f"are the global batch's only for 2 or 4 processes, got {args.world}")
    if args.same_training and codebase.same_training is None:
        parser.error(f"argument --same-training: {args.codebase} has no batch-dependent term to turn off; drop the "
                     "flag")
    mode = Mode(args.codebase, args.checkout.resolve(), args.same_training, args.alone)
    with tempfile.TemporaryDirectory() as folder:
        previous = os.getcwd()
        os.chdir(folder)  # where the upstream modules write their tensorboard/ and logs/ folders
        try:
            mp.spawn(_worker, args=(args.world, mode, folder), nprocs=args.world, join=True)
            ranks = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=True) for r in range(args.world)]
            single = run(mode, 0, 1)
        finally:
            os.chdir(previous)
    lines = compare(ranks, single)
    terms = codebase.batch_dependent and f"; {codebase.batch_dependent}" + (" (off)" if args.same_training else "")
    print(f"{args.codebase} ({checkout_commit(mode.checkout)}): {args.world} gloo processes, DistributedDataParallel "
          f"as {codebase.wrapped_at}{terms}" + ("; distributed=False" if args.alone else ""))
    print("\n".join(line for _, line in lines))
    return 0 if all(passed for passed, _ in lines) else 1


if __name__ == "__main__":
    raise SystemExit(main())
