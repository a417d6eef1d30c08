"""A retrofit inside a data-parallel launch: two gloo processes, each training the model wrapped in
``DistributedDataParallel`` on half of every global batch (``DistributedSampler``'s split: rank ``r`` gets
samples ``r, r + 2, ...``), against one process fed the same global batches.

One spawn runs every case (process start-up dominates); each rank writes its results, the test process runs
the single-process references and compares."""

from __future__ import annotations

import os
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from spawned_rank import leave_after
from torch import Tensor, nn

pytest.importorskip("timm")
from ridge_bounds import assert_same_solution  # noqa: E402
from upstream_cases import CASES, adapt, batch, trainable  # noqa: E402
from upstream_standins import hide_train_forward, jhlee_forward  # noqa: E402

from fly_modules import InvalidParameterError, SampleBudgetSchedule, _compat  # noqa: E402

pytestmark = pytest.mark.distributed

WORLD = 2
TIMEOUT = timedelta(seconds=120)
#: 4 global batches of 16; the second expert starts once 48 global samples were trained (after batch 2):
#: counting a process's own 8 samples per batch it would never start.
BATCHES, GLOBAL_BATCH, BUDGET = 4, 16, 48
RESUMED = "jhlee-l2p"  # the codebase of the checkpoint, verify and opt-out checks

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


class Run:
    """One codebase's model, optimizer and retrofit in one process of ``world`` (``world == 1``: the model
    itself; otherwise the caller's process group and a DDP wrapper), trained the codebase's way."""

    def __init__(self, name: str, rank: int = 0, world: int = 1, wrap: bool = True, **options: Any) -> None:
        self.name, self.case, self.rank, self.world = name, CASES[name], rank, world
        self.model, self.original = self.case.build()
        if name == "jhlee-l2p":
            # l2p-pytorch's batchwise_prompt trains the prompts most frequent in the batch a process sees: under
            # its own DDP launch a process's half, so its training differs from one process's before any retrofit.
            self.model.prompt.batchwise_prompt = False
        self.optimizer = torch.optim.Adam(trainable(self.model), lr=1e-2)
        self.handle = adapt(self.case, self.model, self.original, optimizer=self.optimizer,
                            schedule=SampleBudgetSchedule(BUDGET, 2), **options)
        self.net = self.model if world == 1 or not wrap else nn.parallel.DistributedDataParallel(self.model, **DDP_OPTIONS[name])
        self.starts: List[List[int]] = []
        self.queries: List[Tensor] = []

    def share(self, step: int) -> Tuple[Tensor, Tensor]:
        """This process's share of global batch ``step`` (``DistributedSampler``'s interleaved split)."""
        x, y = batch(seed=step, n=GLOBAL_BATCH, shift=0.5 * step)
        return x[self.rank::self.world], y[self.rank::self.world]

    def train(self, steps: range) -> "Run":
        for step in steps:
            x, y = self.share(step)
            self.net.train()
            logits = TRAIN_CALLS[self.name](self.net, self.original, x, self.handle.current_expert)
            loss = self.case.train_loss(self.model, logits, y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if self.handle.router is not None:
                self.queries.append(self.handle.record.query.detach().double().clone())  # this process's rows
            self.starts.append(self.handle.end_batch())
        return self

    def inference(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        self.model.eval()
        with torch.no_grad():
            return self.case.forward(self.model, self.original, x, task=self.handle.current_expert)

    def results(self) -> Dict[str, Any]:
        logits, selection = self.inference(batch(seed=99, n=12)[0])
        router, ensemble = self.handle.router, self.handle.ensemble
        router.flush()
        return {
            "starts": self.starts, "queries": torch.cat(self.queries), "gram": router.gram.clone(),
            "cross": router.cross.clone(), "counts": router.counts.clone(), "weight": router.weight.clone(),
            "logits": logits, "selection": selection, "ema": ensemble.ema_weight.clone(),
            "ema_updates": ensemble.num_updates.clone(),
        }


# ------------------------------------------------------------------------------------------ the ranks
def _worker(rank: int, init_file: str, out_dir: str) -> None:
    leave_after(_ranks, rank, init_file, out_dir)

def _ranks(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    # A broken collective fails after the timeout instead of hanging the suite.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=TIMEOUT)
    results = {name: Run(name, rank, WORLD).train(range(BATCHES)).results() for name in TRAIN_CALLS}
    results["rest"] = rest_of_a_run(rank, out_dir)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()  # no rank leaves while another still needs it


def rest_of_a_run(rank: int, out_dir: str) -> Dict[str, Any]:
    """``verify`` on rank 0 alone, then on every rank; a checkpoint rank 0 saves after 2 batches, loaded by
    every rank into a fresh retrofit that trains the last 2; a retrofit on rank 1 that opts out. Rank 0 takes
    part in no collective while rank 1 trains alone, nor rank 1 while rank 0 verifies: any would block."""
    first = Run(RESUMED, rank, WORLD).train(range(2))
    path, checks = os.path.join(out_dir, "checkpoint.pt"), {}

    def forward(x: Tensor) -> Tensor:
        return first.case.forward(first.model, first.original, x, task=first.handle.current_expert)[0]

    if rank == 0:
        checks["verify on one rank"] = first.handle.verify(first.share(7)[0], forward=forward).ok
        state = {"model": first.model.state_dict(), "optimizer": first.optimizer.state_dict(),
                 "retrofit": first.handle.state_dict()}
        torch.save(state, path)
    dist.barrier()
    checks[f"verify on every rank, rank {rank}"] = first.handle.verify(first.share(7)[0], forward=forward).ok
    group = first.handle.process_group
    checks[f"group restored, rank {rank}"] = group is not None and first.handle.router.process_group is group
    resumed = Run(RESUMED, rank, WORLD)
    state = _compat.load_weights(path)
    resumed.model.load_state_dict(state["model"])
    resumed.optimizer.load_state_dict(state["optimizer"])
    resumed.handle.load_state_dict(state["retrofit"])
    resumed.starts, resumed.queries = first.starts, first.queries
    results = resumed.train(range(2, BATCHES)).results()
    checks[f"unfinished batch, rank {rank}"] = unfinished_batch_checkpoint(first, out_dir)
    group = dist.new_group(list(range(WORLD)))  # a group given as the option: the count is over its processes
    no_router = Run(RESUMED, rank, WORLD, wrap=False, router=False, distributed=group).train(range(BATCHES))
    checks[f"no router: global count, rank {rank}"] = no_router.starts == [[], [], [1], []] and \
        no_router.handle.process_group is group
    if rank == 1:
        alone = Run(RESUMED, rank, WORLD, distributed=False, wrap=False).train(range(BATCHES))
        checks["opted out"] = alone.handle.process_group is None and alone.handle.router.process_group is None
        checks["alone: own rows, own count"] = (alone.handle.router.num_samples, alone.starts) == (32, [[]] * 4)
    dist.barrier()
    return {**results, "checks": checks}


def unfinished_batch_checkpoint(run: Run, out_dir: str) -> str:
    """Rank 0 saves in the middle of a batch (its own share recorded); what loading it does on each rank."""
    run.model.train()
    TRAIN_CALLS[run.name](run.model, run.original, run.share(5)[0], run.handle.current_expert)
    path = os.path.join(out_dir, "unfinished.pt")
    if run.rank == 0:
        torch.save(run.handle.state_dict(), path)
    dist.barrier()
    try:
        run.handle.load_state_dict(_compat.load_weights(path))
        return "loaded"
    except InvalidParameterError as refused:
        return str(refused)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{case: [rank 0's results, rank 1's]}``."""
    folder = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(str(folder / "init"), str(folder)), nprocs=WORLD, join=True)
    results = [_compat.load_weights(folder / f"rank{r}.pt") for r in range(WORLD)]
    return {name: [result[name] for result in results] for name in (*TRAIN_CALLS, "rest")}


# ------------------------------------------------------------------------------------------ the checks
def assert_same_statistics(actual: Dict[str, Tensor], expected: Dict[str, Tensor]) -> None:
    """Sums of the same ``N`` rows taken in another order, within the norm-wise float64 bound
    ``||actual - expected||_F <= 2 N eps64 sum_k |term_k|``: ``sum_k ||phi_k||^2 = trace(G)`` for ``G``, at most
    ``trace(G) + N`` for ``Q`` (``||phi_k|| <= ||phi_k||^2 + 1``). The counts are integers: equal."""
    assert torch.equal(actual["counts"], expected["counts"])
    rows, trace = int(expected["counts"].sum()), float(expected["gram"].trace())
    eps = torch.finfo(torch.float64).eps
    assert float((actual["gram"] - expected["gram"]).norm()) <= 2 * rows * eps * trace
    assert float((actual["cross"] - expected["cross"]).norm()) <= 2 * rows * eps * (trace + rows)


@pytest.mark.parametrize("name", sorted(TRAIN_CALLS))
def test_every_rank_holds_every_ranks_rows(runs, name):
    """The synchronisation itself: each rank's router is a router fed every rank's recorded rows, global batch
    by global batch (rank 0's share first), and the two ranks' routers and EMA copies are the same bit for bit
    (they fold the same gathered rows, and step the same weights with the same banks, in the same order)."""
    ranks, case = runs[name], CASES[name]
    model, original = case.build()
    reference = adapt(case, model, original, schedule=None).router
    shares = [ranks[r]["queries"].float().split(GLOBAL_BATCH // WORLD) for r in range(WORLD)]
    for step, parts in enumerate(zip(*shares)):
        reference.update(torch.cat(parts), int(step >= 3))  # the second expert trains from the fourth batch
    reference.flush()
    expected = {"gram": reference.gram, "cross": reference.cross, "counts": reference.counts}
    for result in ranks:
        assert_same_statistics(result, expected)
        assert_same_solution(result["weight"].t(), reference.weight.t(), reference.gram_matrix(), reference.ridge)
    for key in ("gram", "cross", "weight", "ema", "ema_updates"):
        assert torch.equal(ranks[0][key], ranks[1][key]), key


@pytest.mark.parametrize("name", sorted(TRAIN_CALLS))
def test_every_rank_trains_the_single_process_method(runs, name):
    """Against one process fed the global batches: the same expert starts and routed experts; the predictions
    (logits), the router statistics and the EMA copies within the float32 rounding of the two trainings."""
    case, ranks, single = CASES[name], runs[name], Run(name).train(range(BATCHES)).results()
    assert single["starts"] == [[], [], [1], []]
    for result in ranks:
        assert result["starts"] == single["starts"]
        # the router's statistics come from the frozen query path: the routed experts are the single process's
        assert torch.equal(case.expert_of(result["selection"]), case.expert_of(single["selection"]))
        # Adam divides each gradient entry by its own scale: an entry near zero moves by up to the learning rate
        # (1e-2) on the float32 rounding of its gradient, which differs between the two trainings.
        torch.testing.assert_close(result["logits"], single["logits"], rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(result["gram"], single["gram"], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(result["counts"], single["counts"])
        torch.testing.assert_close(result["ema"], single["ema"], rtol=1e-2, atol=1e-2)  # the weights', as above


def test_verify_checkpoints_and_opting_out_on_ranks(runs):
    """verify on one rank or on all (no collective, no deadlock, the process group restored); a checkpoint saved
    by rank 0 and loaded on every rank resumes the uninterrupted run; a retrofit that opts out trains alone."""
    checks = {**runs["rest"][0]["checks"], **runs["rest"][1]["checks"]}
    refused = checks.pop("unfinished batch, rank 1")
    assert "holds process 0's share of an unfinished stream batch, this is process 1: save after end_batch" in refused
    assert checks == {"verify on one rank": True, **{f"{check}, rank {r}": True for r in range(WORLD)
                                                     for check in ("verify on every rank", "group restored")},
                      "opted out": True, "alone: own rows, own count": True, "unfinished batch, rank 0": "loaded",
                      "no router: global count, rank 0": True, "no router: global count, rank 1": True}
    for resumed, uninterrupted in zip(runs["rest"], runs[RESUMED]):
        assert resumed["starts"] == uninterrupted["starts"]
        assert torch.equal(resumed["selection"], uninterrupted["selection"])
        torch.testing.assert_close(resumed["logits"], uninterrupted["logits"], rtol=1e-5, atol=1e-6)
        assert_same_statistics(resumed, uninterrupted)
        torch.testing.assert_close(resumed["ema"], uninterrupted["ema"], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------ one process, refusals
def test_parallel_wrappers_and_bad_options_are_refused_in_one_line():
    case = CASES[RESUMED]
    model, original = case.build()
    with pytest.raises(TypeError, match=r"got a DataParallel wrapper; retrofit the model it wraps \(pass wrapped.module"):
        adapt(case, nn.DataParallel(model), original)
    with pytest.raises(InvalidParameterError, match=r"distributed must be 'auto', False .* or a torch.distributed "
                                                    r"process group, got True"):
        adapt(case, model, original, distributed=True)
    handle = adapt(case, model, original)  # "auto" without torch.distributed: this process alone
    assert handle.process_group is None and handle.router.process_group is None


def test_a_retrofit_made_before_init_process_group_refuses_to_learn_alone(monkeypatch):
    """``"auto"`` found one process when the retrofit was made; once several run, end_batch says so."""
    case = CASES[RESUMED]
    model, original = case.build()
    handle = adapt(case, model, original, ensemble=False, schedule=SampleBudgetSchedule(BUDGET, 2))
    model.train()
    case.forward(model, original, batch()[0])
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    with pytest.raises(RuntimeError, match=r"torch.distributed now runs 2 processes but the retrofit was made before "
                                           r"dist.init_process_group, so each process would learn alone"):
        handle.end_batch()
    assert handle.router.num_samples == 0
    other, original = case.build()
    alone = adapt(case, other, original, ensemble=False, schedule=SampleBudgetSchedule(BUDGET, 2), distributed=False)
    other.train()
    case.forward(other, original, batch()[0])
    alone.end_batch()  # opted out: this process trains alone, as it asked
    assert alone.router.num_samples == 8


def test_avalanche_plugin_refuses_a_distributed_strategy(monkeypatch):
    avalanche = pytest.importorskip("fly_modules.adapters.avalanche")
    monkeypatch.setattr(avalanche.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(avalanche.dist, "get_world_size", lambda group=None: 2)
    plugin = avalanche.FlyPlugin(method="l2p")
    with pytest.raises(RuntimeError, match=r"FlyPlugin: distributed strategies are not handled \(torch.distributed "
                                           r"runs 2 processes\)"):
        plugin.before_training(SimpleNamespace(model=CASES[RESUMED].build()[0]))
    assert plugin.handle is None  # refused before retrofitting anything
