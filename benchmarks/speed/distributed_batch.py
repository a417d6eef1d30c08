"""What a retrofit's ``end_batch`` costs in a data-parallel run: gloo processes side by side with one process.

    python -m benchmarks.speed.distributed_batch [--world 2] [--expansion-dim 2048] [--quick]

Each of ``--world`` processes (gloo, CPU, one thread each) holds a batch of ``--batch`` ``d``-wide query rows and
adds them to its router with ``process_group`` set, as ``Retrofit.end_batch`` does: one header of five ints per
process, then the rows (every process folds the global batch). Beside it, in interleaved rounds, process 0
alone adds the whole global batch to a router of its own (the single-process run the retrofit reproduces), and
the exchange alone is timed (header and rows, no fold). Prints milliseconds per stream batch and the ratio to
the single process; the other processes wait in the collectives while process 0 times its local rows.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from typing import Callable, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fly_modules import AnalyticRouter
from fly_modules._validation import Integer
from fly_modules.distributed import gather_rows

from ..flags import Parser, add_flag
from ..parallel import leave_after
from .timing import best_ratio, median, print_header, time_side_by_side

__all__ = ["bytes_per_batch", "main"]

HEADER_INTS = 5  # verdict, dtype, rows, counted samples, expert id (fly_modules.distributed.all_gather_update)


def bytes_per_batch(world: int, batch: int, dim: int, feature_bytes: int = 4) -> Dict[str, int]:
    """What one process sends and receives per stream batch (float32 rows; float16/bfloat16 are sent as
    float32, exactly), and the ``M x M`` float64 statistics an all-reduce before each solve would send."""
    rows = batch * dim * feature_bytes + HEADER_INTS * 8
    return {"sent": rows, "received": (world - 1) * rows}


def _candidates(rank: int, world: int, args: object) -> Dict[str, Callable[[], object]]:
    gen = torch.Generator().manual_seed(rank)
    local = torch.randn(args.batch, args.dim, generator=gen)
    settings = dict(expansion_dim=args.expansion_dim, ridge=1.0, seed=0)
    gathered = AnalyticRouter(args.dim, 4, **settings)
    gathered.process_group = dist.group.WORLD
    alone = AnalyticRouter(args.dim, 4, **settings)
    global_batch = torch.randn(world * args.batch, args.dim, generator=gen)
    return {
        "one process, global batch": (lambda: alone.update(global_batch, 0)) if rank == 0 else (lambda: None),
        f"{world} processes, end_batch": lambda: gathered.update(local, 0),
        f"{world} processes, exchange only": lambda: gather_rows(local),  # a header of sizes, then the rows
    }


def _rank(rank: int, world: int, init_file: str, args: object) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    # Every process runs the same rounds in the same order, so the collectives pair up.
    candidates = _candidates(rank, world, args)
    times = time_side_by_side(candidates, repeats=args.repeats, inner={name: 8 for name in candidates})
    dist.barrier()
    if rank == 0:
        _report(times, world, args)


def _report(times: Dict[str, List[float]], world: int, args: object) -> None:
    single = median(times["one process, global batch"])
    for name, seconds in times.items():
        print(f"  {name:<32} {1e3 * median(seconds):9.3f} ms per stream batch   x{median(seconds) / single:.2f}")
    print(f"  best rounds: end_batch / one process {best_ratio(times, f'{world} processes, end_batch', 'one process, global batch')}")
    sent = bytes_per_batch(world, args.batch, args.dim)
    print(f"  per process and stream batch: sends {sent['sent']:,} bytes, receives {sent['received']:,}; "
          f"an all-reduce of G (M = 10,000) would send {10_000 ** 2 * 8:,} bytes per solve", flush=True)


def _worker(rank: int, world: int, init_file: str, args: object) -> None:
    leave_after(_rank, rank, world, init_file, args)


def main(argv: List[str] = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    add_flag(parser, "--world", Integer(minimum=2), default=2, help="processes")
    add_flag(parser, "--batch", Integer(minimum=1), default=64, help="rows per process and stream batch")
    add_flag(parser, "--dim", Integer(minimum=1), default=768, help="width d of the query rows (ViT-B/16)")
    add_flag(parser, "--expansion-dim", Integer(minimum=0), default=2048,
             help="the router's M (the paper's 10,000 takes seconds per fold on a CPU)")
    add_flag(parser, "--repeats", Integer(minimum=1), default=7, help="measured rounds")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke test (seconds)")
    args = parser.parse_args(argv)
    if args.quick:
        args.expansion_dim, args.repeats = 256, 3
    print_header("end_batch across gloo processes against one process",
                 {"world": args.world, "batch per process": args.batch, "d": args.dim, "M": args.expansion_dim,
                  "repeats": args.repeats})
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_worker, args=(args.world, os.path.join(folder, "init"), args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
