"""Router statistics across two real processes (gloo backend, CPU)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ridge_bounds import assert_same_solution
from spawned_rank import leave_after

from fly_modules import AnalyticRouter, _compat
from fly_modules.distributed import all_gather_update, all_reduce_statistics

pytestmark = pytest.mark.distributed

WORLD = 2
TIMEOUT = timedelta(seconds=60)


def _data():
    """float64 features (with float32 values, so a rank may send them as float32 exactly): the routers
    expand float64 features with a float64 product, so any split of the batches gives the same
    statistics up to float64 rounding."""
    g = torch.Generator().manual_seed(0)
    features = torch.randn(50, 6, generator=g).double()
    ids = torch.randint(0, 3, (50,), generator=g)
    return features, ids


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    leave_after(_collectives, rank, init_file, out_dir)

def _collectives(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    # A broken collective fails after the timeout instead of hanging the suite.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=TIMEOUT)
    features, ids = _data()
    # 1) Disjoint shards, merged once by an all-reduce. Rank 1 declares fewer experts.
    shard = slice(rank * 25, (rank + 1) * 25)
    reduced = AnalyticRouter(6, 3 - rank, expansion_dim=40, ridge=1.0, seed=5)
    local_ids = ids[shard].clamp_max(reduced.num_experts - 1)
    reduced.update(features[shard], local_ids)
    all_reduce_statistics(reduced)
    # 2) Per-step gather: unequal batch sizes (rank 1 gets the shorter tail of each step).
    gathered = AnalyticRouter(6, 3, expansion_dim=40, ridge=1.0, seed=5)
    for start in range(0, 50, 10):
        own = slice(start, start + 6) if rank == 0 else slice(start + 6, start + 10)
        # Rank 1 sends float32 in the last steps: a float64 batch anywhere makes every rank gather float64.
        share = features[own].float() if rank == 1 and start >= 30 else features[own]
        all_gather_update(gathered, share, ids[own])
    # 3) One rank's bad batch: every rank raises (no one blocks in the gather), nothing is added.
    bad = torch.full((2, 6), float("nan")) if rank == 1 else features[:2]
    try:
        all_gather_update(gathered, bad, 0)
        rejected = None
    except (RuntimeError, ValueError) as error:  # the bad batch's InvalidParameterError is a ValueError
        rejected = "ValueError" if isinstance(error, ValueError) else type(error).__name__
    torch.save(
        {"reduced": reduced.state_dict(), "gathered": gathered.state_dict(), "ids": local_ids,
         "rejected": rejected},
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    dist.barrier()  # no rank leaves while another still needs it


def test_all_reduce_and_gathered_updates_equal_one_router_fed_the_union(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    features, ids = _data()
    shards = [_compat.load_weights(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    union = AnalyticRouter(6, 3, expansion_dim=40, ridge=1.0, seed=5)
    union.update(features, torch.cat([shards[0]["ids"], shards[1]["ids"]]))
    union.flush()
    whole = AnalyticRouter(6, 3, expansion_dim=40, ridge=1.0, seed=5)
    whole.update(features, ids)
    assert [shard["rejected"] for shard in shards] == ["RuntimeError", "ValueError"]
    for shard in shards:
        reduced = AnalyticRouter(6, 0, expansion_dim=40, ridge=1.0, seed=5)
        reduced.load_state_dict(shard["reduced"])
        assert reduced.num_experts == 3
        torch.testing.assert_close(reduced.gram, union.gram, rtol=1e-12, atol=1e-9)
        assert_same_solution(reduced.weight, union.weight, union.gram_matrix(), 1.0)
        gathered = AnalyticRouter(6, 3, expansion_dim=40, ridge=1.0, seed=5)
        gathered.load_state_dict(shard["gathered"])
        assert torch.equal(gathered.counts, whole.counts)
        assert_same_solution(gathered.weight, whole.weight, whole.gram_matrix(), 1.0)


def test_helpers_require_an_initialised_process_group():
    router = AnalyticRouter(3, 1, expansion_dim=4)
    with pytest.raises(RuntimeError, match="not initialised"):
        all_reduce_statistics(router)
    with pytest.raises(RuntimeError, match="not initialised"):
        all_gather_update(router, torch.zeros(1, 3), 0)
