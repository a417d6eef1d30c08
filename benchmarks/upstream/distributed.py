"""The upstream checks' distributed mode: l2p-pytorch's own training loop over gloo processes, against one process.

    python -m benchmarks.upstream.distributed --checkout DIR [--world 2]

``DIR`` is a checkout of JH-LEE-KR/l2p-pytorch (imported from there, never copied). Its launch is distributed
(``torch.distributed.launch``; ``main.py`` wraps the model in ``DistributedDataParallel`` and gives each process a
``DistributedSampler`` share of ``batch_size`` samples, the learning rate scaled by the global batch). Here each of
``--world`` gloo processes builds the harness's model (``benchmarks/upstream/harnesses/l2p_pytorch_l2p.py``),
retrofits it, wraps it in ``DistributedDataParallel`` and calls the checkout's ``engine.train_one_epoch`` with
``args.distributed=True`` on a loader of its ``DistributedSampler`` share of each global batch, then
``handle.end_batch()``; evaluation is the checkout's ``engine.evaluate`` on the model. One process runs the same
global batches with ``args.distributed=False``. Printed per process: whether its router holds every process's
rows (the float64 bound), its expert starts, routed experts, selected prompts and predictions against the single
process.

The metric logger's cross-process averaging (CUDA tensors, for the printed averages only) is off on the CPU.
``batchwise_prompt`` (an upstream default: the prompts most frequent in the batch a process sees, so under DDP
each process selects from its own share and the method itself trains differently from one process) stays on
unless ``--same-selection`` turns it off; the predictions are then the single process's up to float rounding.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fly_modules import AnalyticRouter, SampleBudgetSchedule
from fly_modules._validation import Integer

from ..flags import Parser, add_flag
from .checks import ROUTER_OPTIONS, retrofit
from .harnesses._prompt_options import l2p_prompt
from .harnesses._task_loop import class_mask
from .harnesses.l2p_pytorch_l2p import POOL, TOP_K, L2PPytorch
from .loading import no_cuda_sync, quiet
from .observe import capture_outputs
from .task_stream import IMAGE_SIZE

__all__ = ["main"]

BATCHES, GLOBAL_BATCH, BUDGET, SEED = 4, 16, 48, 0


class SameSelectionL2P(L2PPytorch):
    """The harness's L2P with ``batchwise_prompt`` off (see the module docstring)."""

    prompt = l2p_prompt(POOL, TOP_K, batchwise_prompt=False)


def _stream() -> List[TensorDataset]:
    gen = torch.Generator().manual_seed(SEED)
    return [TensorDataset(torch.randn(GLOBAL_BATCH, 3, IMAGE_SIZE, IMAGE_SIZE, generator=gen) + 0.5 * step,
                          torch.randint(0, 2, (GLOBAL_BATCH,), generator=gen)) for step in range(BATCHES)]


def _loader(batch: TensorDataset, rank: int, world: int) -> DataLoader:
    """Their datasets.py: a DistributedSampler share of ``batch_size`` samples per process (no shuffle here, so
    the single process sees the same global batch)."""
    if world == 1:
        return DataLoader(batch, batch_size=GLOBAL_BATCH)
    sampler = DistributedSampler(batch, num_replicas=world, rank=rank, shuffle=False)
    return DataLoader(batch, sampler=sampler, batch_size=GLOBAL_BATCH // world)


def run(checkout: Path, rank: int, world: int, same_selection: bool) -> Dict[str, Any]:
    """Train the stream the checkout's way in this process (one of ``world``); the process's results."""
    no_cuda_sync()
    pair = (SameSelectionL2P if same_selection else L2PPytorch)(checkout)
    engine = pair.engine
    sys.modules["utils"].SmoothedValue.synchronize_between_processes = lambda self: None  # CUDA tensors
    ctx = pair.build(SEED)
    ctx.args.distributed, ctx.args.world_size = world > 1, world
    ctx.args.lr = 0.03 * GLOBAL_BATCH / 256.0  # main.py: scaled by the global batch, the same in both runs
    ctx.optimizer = pair.optimizer_for(ctx.args, ctx.model)
    handle = retrofit(ctx.model, "l2p", router=True, ensemble=True, optimizer=ctx.optimizer,
                      schedule=SampleBudgetSchedule(BUDGET, 2), num_experts=2)
    net = ctx.model if world == 1 else torch.nn.parallel.DistributedDataParallel(ctx.model)
    starts, queries = [], []
    for batch in _stream():
        with quiet(True):
            engine.train_one_epoch(model=net, original_model=ctx.original_model, criterion=torch.nn.CrossEntropyLoss(),
                                   data_loader=_loader(batch, rank, world), optimizer=ctx.optimizer,
                                   device=torch.device("cpu"), epoch=0, max_norm=ctx.args.clip_grad,
                                   set_training_mode=True, task_id=0, class_mask=class_mask(), args=ctx.args)
        queries.append(handle.record.query.detach().clone())
        starts.append(handle.end_batch())
    x = torch.randn(12, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(99))
    with quiet(True), capture_outputs(ctx.model) as outputs:
        engine.evaluate(model=ctx.model, original_model=ctx.original_model, data_loader=[(x, torch.zeros(12).long())],
                        device=torch.device("cpu"), task_id=0, class_mask=class_mask(), args=ctx.args)
    handle.router.flush()
    return {"starts": starts, "queries": queries, "gram": handle.router.gram.clone(), "counts": handle.router.counts,
            "logits": outputs[-1]["logits"].detach(), "selection": outputs[-1]["prompt_idx"].detach()}


def _worker(rank: int, world: int, checkout: str, folder: str, same_selection: bool) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=world,
                                timeout=timedelta(seconds=300))
        torch.save(run(Path(checkout), rank, world, same_selection), os.path.join(folder, f"rank{rank}.pt"))
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
    reference, lines = _reference_statistics(ranks), []
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
            "routes as one process (the expert: prompt_idx // top_k)": (
                torch.equal(result["selection"][:, 0] // TOP_K, single["selection"][:, 0] // TOP_K), "the router's"),
            "selects the prompts one process does (prompt_idx)": (
                torch.equal(result["selection"], single["selection"]), "the method's own key match in the expert"),
            "predicts as one process": (torch.equal(result["logits"].argmax(1), single["logits"].argmax(1)),
                                        f"max |logit difference| {difference:.1e}"),
        }
        lines += [f"process {rank}: {'PASS' if ok else 'FAIL'}  {name}: {detail}" for name, (ok, detail) in checks.items()]
    return lines


def main(argv: List[str] = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="a checkout of JH-LEE-KR/l2p-pytorch")
    add_flag(parser, "--world", Integer(minimum=2, maximum=GLOBAL_BATCH), default=2,
             help=f"processes (a divisor of the global batch of {GLOBAL_BATCH}: each gets an equal share)")
    parser.add_argument("--same-selection", action="store_true",
                        help="batchwise_prompt off: every process selects prompts per sample, as one process does")
    args = parser.parse_args(argv)
    if GLOBAL_BATCH % args.world:
        parser.error(f"argument --world: {args.world} does not divide the global batch of {GLOBAL_BATCH}")
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_worker, args=(args.world, str(args.checkout.resolve()), folder, args.same_selection),
                 nprocs=args.world, join=True)
        ranks = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(args.world)]
    single = run(args.checkout.resolve(), 0, 1, args.same_selection)
    lines = compare(ranks, single)
    print("\n".join(lines))
    return 0 if all(" PASS " in f" {line} " for line in lines) else 1


if __name__ == "__main__":
    raise SystemExit(main())
