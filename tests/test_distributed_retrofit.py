"""A retrofit inside a data-parallel launch: two gloo processes, each training the model wrapped in
``DistributedDataParallel`` on half of every global batch (``DistributedSampler``'s split: rank ``r`` gets
samples ``r, r + 2, ...``), against one process fed the same global batches.

One spawn runs every case (process start-up dominates); each rank writes its results, the test process runs
the single-process references and compares."""

from __future__ import annotations

import os
import sys
import traceback
from datetime import timedelta
from typing import Any, Callable, Dict, List

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

pytest.importorskip("timm")
from ridge_bounds import assert_same_solution  # noqa: E402
from upstream_cases import CASES, adapt, batch, trainable  # noqa: E402
from upstream_standins import hide_train_forward, jhlee_forward  # noqa: E402

from fly_modules import SampleBudgetSchedule, _compat  # noqa: E402

pytestmark = pytest.mark.distributed

WORLD = 2
TIMEOUT = timedelta(seconds=120)
#: 4 global batches of 16; the second expert starts once 48 global samples were trained (after batch 2):
#: counting a process's own 8 samples per batch it would never start.
BATCHES, GLOBAL_BATCH, BUDGET = 4, 16, 48

#: each codebase's training call, on the model or on its DDP wrapper (the loop calls the wrapper)
TRAIN_CALLS: Dict[str, Callable[[nn.Module, Any, Tensor, int], Tensor]] = {
    "jhlee-l2p": lambda net, original, x, task: jhlee_forward(net, original, x, task)["logits"],
    "flygcl-dualprompt": lambda net, original, x, task: net(x),
    "hide": lambda net, original, x, task: hide_train_forward(net, original, x, task)["logits"],
    "siblurry-mvp": lambda net, original, x, task: net(x),
    "flygcl-sprompt": lambda net, original, x, task: net(x),
}
#: DistributedDataParallel's options per case: the key-pool stand-ins train with cross-entropy alone (no key
#: term), so some trainable parameters get no gradient in a step; MVP reads its mask outside ``forward`` (its
#: loss), which the unused-parameter search refuses
DDP_OPTIONS = {name: {"find_unused_parameters": name not in ("siblurry-mvp", "flygcl-sprompt")} for name in TRAIN_CALLS}


def train_and_evaluate(name: str, rank: int = 0, world: int = 1) -> Dict[str, Any]:
    """The codebase's loop with the retrofit: ``world`` processes share each global batch (``world == 1``:
    one process, the model itself; otherwise the caller's process group and a DDP wrapper)."""
    case = CASES[name]
    model, original = case.build()
    optimizer = torch.optim.Adam(trainable(model), lr=1e-2)
    handle = adapt(case, model, original, optimizer=optimizer, schedule=SampleBudgetSchedule(BUDGET, 2))
    net = model if world == 1 else nn.parallel.DistributedDataParallel(model, **DDP_OPTIONS[name])
    starts: List[List[int]] = []
    queries: List[Tensor] = []
    for step in range(BATCHES):
        x, y = batch(seed=step, n=GLOBAL_BATCH, shift=0.5 * step)
        x, y = x[rank::world], y[rank::world]
        net.train()
        logits = TRAIN_CALLS[name](net, original, x, handle.current_expert)
        loss = case.train_loss(model, logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        queries.append(handle.record.query.detach().double().clone())  # this process's rows
        starts.append(handle.end_batch())
    model.eval()
    with torch.no_grad():
        logits, selection = case.forward(model, original, batch(seed=99, n=12)[0])
    router = handle.router
    router.flush()
    return {
        "starts": starts, "queries": torch.cat(queries), "gram": router.gram.clone(), "cross": router.cross.clone(),
        "counts": router.counts.clone(), "weight": router.weight.clone(), "logits": logits, "selection": selection,
        "ema": handle.ensemble.ema_weight.clone(), "ema_updates": handle.ensemble.num_updates.clone(),
    }


# ------------------------------------------------------------------------------------------ the ranks
def _worker(rank: int, init_file: str, out_dir: str) -> None:
    """Each rank leaves with os._exit, so the process group is never torn down (before torch 2.8 the gloo
    destructor can deadlock; tests/test_distributed.py); the rank's results are on disk by then."""
    try:
        _ranks(rank, init_file, out_dir)
    except BaseException:  # noqa: BLE001 - shown, then a non-zero exit for mp.spawn to report
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def _ranks(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    # A broken collective fails after the timeout instead of hanging the suite.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=TIMEOUT)
    results = {name: train_and_evaluate(name, rank, WORLD) for name in TRAIN_CALLS}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()  # no rank leaves while another still needs it


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{case: [rank 0's results, rank 1's]}``."""
    folder = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(str(folder / "init"), str(folder)), nprocs=WORLD, join=True)
    results = [_compat.load_weights(folder / f"rank{r}.pt") for r in range(WORLD)]
    return {name: [result[name] for result in results] for name in TRAIN_CALLS}


# ------------------------------------------------------------------------------------------ the checks
def assert_same_sum(actual: Tensor, expected: Tensor, rows: int, magnitude: float) -> None:
    """Norm-wise float64 bound of a sum of ``rows`` terms taken in another order:
    ``||actual - expected||_F <= 2 rows eps64 magnitude`` (``magnitude``: the sum of the terms' norms)."""
    assert float((actual - expected).norm()) <= 2 * rows * torch.finfo(torch.float64).eps * magnitude


@pytest.mark.parametrize("name", sorted(TRAIN_CALLS))
def test_every_rank_holds_every_ranks_rows(runs, name):
    """The synchronisation itself: each rank's router is a router fed every rank's recorded rows, global batch
    by global batch (rank 0's share first), and the two ranks' routers and EMA copies are the same bit for bit
    (they fold the same gathered rows, and step the same weights with the same banks, in the same order)."""
    ranks, case = runs[name], CASES[name]
    model, original = case.build()
    reference = adapt(case, model, original, schedule=None).router
    shares = [ranks[r]["queries"].float().split(GLOBAL_BATCH // WORLD) for r in range(WORLD)]
    phi_norms = 0.0
    for step, parts in enumerate(zip(*shares)):
        rows = torch.cat(parts)
        reference.update(rows, int(step >= 3))  # the second expert trains from the fourth batch
        phi_norms += float(reference.expansion(rows).norm(dim=1).pow(2).sum())
    reference.flush()
    total = BATCHES * GLOBAL_BATCH
    for result in ranks:
        assert torch.equal(result["counts"], reference.counts)
        assert_same_sum(result["gram"], reference.gram, total, phi_norms)
        assert_same_sum(result["cross"], reference.cross, total, phi_norms + total)  # |phi| |e| <= |phi|^2 + 1
        assert_same_solution(result["weight"].t(), reference.weight.t(), reference.gram_matrix(), reference.ridge)
    for key in ("gram", "cross", "weight", "ema", "ema_updates"):
        assert torch.equal(ranks[0][key], ranks[1][key]), key


@pytest.mark.parametrize("name", sorted(TRAIN_CALLS))
def test_every_rank_trains_the_single_process_method(runs, name):
    """Against one process fed the global batches: the same expert starts, routes and predictions, the router
    statistics and the EMA copies within the float32 rounding of the two trainings."""
    ranks, single = runs[name], train_and_evaluate(name)
    assert single["starts"] == [[], [], [1], []]
    for result in ranks:
        assert result["starts"] == single["starts"]
        assert torch.equal(result["selection"], single["selection"])
        assert torch.equal(result["logits"].argmax(1), single["logits"].argmax(1))
        # Adam divides each gradient entry by its own scale: an entry near zero moves by up to the learning rate
        # (1e-2) on the float32 rounding of its gradient, which differs between the two trainings.
        torch.testing.assert_close(result["logits"], single["logits"], rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(result["gram"], single["gram"], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(result["counts"], single["counts"])
        torch.testing.assert_close(result["ema"], single["ema"], rtol=1e-3, atol=1e-4)
        assert torch.equal(result["ema_updates"], single["ema_updates"])
