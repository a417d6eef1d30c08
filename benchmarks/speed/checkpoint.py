#!/usr/bin/env python
"""What mid-run checkpoints cost: their size and the time they add to a training (docs/checkpoints.md).

Measured: one training of the proxy benchmark (``--preset proxy``: the pretrained proxy ViT, its
generated data, every variant scored) with checkpoints at the default period (after every anytime
evaluation) and with them off, in alternating rounds in this process. The target is on the time
the run spends writing checkpoints (measured inside the run) over the run's time: under 5%.

Estimated (``--estimate``, nothing is trained or allocated: the models are built on the meta device):
the checkpoint of each method at the paper's settings (ViT-B/16, M = 10,000, 100 and 200 classes),
part by part, and its write time at the stated disk speeds.

Run from the repository root::

    python -m benchmarks.speed.checkpoint                  # proxy scale, DualPrompt with the added router and ensemble
    python -m benchmarks.speed.checkpoint --quick          # a short stream (smoke test)
    python -m benchmarks.speed.checkpoint --estimate       # ViT-B/16 sizes at the paper's settings
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from benchmarks.ablation.arguments import build_parser
from benchmarks.ablation.run_specs import run_specs
from benchmarks.ablation.runner import CheckpointPolicy, run_training
from benchmarks.ablation.sweep import resolve, run_setting
from benchmarks.ablation.sweep_data import load_data
from benchmarks.core.checkpointing import CheckpointStore, read_checkpoint
from benchmarks.speed.timing import Report, configure_threads, median, print_header

TARGET_OVERHEAD = 0.05  # of the training's time, at the default period
DISK_SPEEDS = {"local NVMe, 1 GB/s": 1e9, "network file system, 200 MB/s": 2e8}


# ----------------------------------------------------------------------------------- measured
def measure(args: argparse.Namespace, report: Report) -> None:
    flags = ["--preset", "proxy", "--methods", args.method, "--seeds", "1", "--threads", str(args.threads)]
    if args.quick:
        flags += ["--synthetic-classes", "5", "--synthetic-train-per-class", "40", "--eval-period", "80",
                  "--expansion-dim", "20"]
    sweep = resolve(build_parser().parse_args(flags))
    configure_threads(sweep.threads)
    train, test = load_data("synthetic", sweep, "data", False)
    setting = run_setting(sweep, "synthetic")
    specs = run_specs(sweep.methods, sweep.variants, sweep.datasets, sweep.seeds)
    variants = [spec.variant for spec in specs]
    print_header("mid-run checkpoints at proxy scale", {
        "method": f"{args.method} (variants {', '.join(variants)})", "rounds": args.rounds,
        "stream": f"{len(train)} samples, batch {sweep.protocol.batch_size}, {sweep.protocol.online_iter} steps a "
                  f"batch, anytime evaluation every {sweep.protocol.eval_period} samples",
    })
    walls: Dict[str, List[float]] = {"off": [], "evaluation": []}
    written: List[dict] = []
    read_seconds: List[float] = []
    with tempfile.TemporaryDirectory() as folder:
        store = CheckpointStore(Path(folder) / "run")
        for round_index in range(args.rounds):
            order = ["off", "evaluation"] if round_index % 2 == 0 else ["evaluation", "off"]
            for period in order:
                store.clear()
                checkpointing = CheckpointPolicy(store, 0 if period == "off" else period, setting)
                started = time.perf_counter()
                records = run_training(args.method, "synthetic", 1, variants, sweep.protocol, train, test,
                                       device=torch.device("cpu"), checkpointing=checkpointing)
                walls[period].append(time.perf_counter() - started)
                if period == "evaluation":
                    written.append(dict(records[variants[0]]["checkpoints"], wall=walls[period][-1]))
                    started = time.perf_counter()
                    read_checkpoint(store.paths()[-1])
                    read_seconds.append(time.perf_counter() - started)
                print(f"  round {round_index + 1}, checkpoints {period}: {walls[period][-1]:.1f} s", flush=True)
        store.clear()
    fraction = median([w["write_seconds"] / w["wall"] for w in written])
    last = written[-1]
    report.info(f"checkpoint size {last['bytes'] / 2**20:.2f} MiB, {last['written']} written a run; reading one "
                f"{1e3 * median(read_seconds):.0f} ms")
    report.info(f"training {median(walls['off']):.1f} s without checkpoints, {median(walls['evaluation']):.1f} s "
                f"with (medians; the difference is within the machine's noise when it is below the write time)")
    report.check("time writing checkpoints / training time", 100 * fraction, "<=", 100 * TARGET_OVERHEAD, unit="%",
                 detail=f"{median([w['write_seconds'] for w in written]):.2f} s of writes a run (median)")


# ---------------------------------------------------------------------------------- estimated
def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def estimate(args: argparse.Namespace) -> None:
    """Checkpoint sizes at the paper's settings from the tensors' shapes (meta device: nothing allocated)."""
    import timm

    from benchmarks.core.presets import PRESETS
    from benchmarks.methods import method_class
    from fly_modules import AnalyticRouter, TemporalEnsembleHead

    protocol = PRESETS["paper"]["protocol"]
    m = protocol.expansion_dim
    anytime = 50_000 // protocol.eval_period  # CIFAR-100's stream: the most evaluations of the paper's datasets
    print(f"== checkpoint sizes at the paper's settings: {protocol.model}, M = {m:,}, {protocol.num_experts} experts, "
          f"Adam; G stored as its lower triangle (float64), the frozen backbone left out ==")
    header = ("method", "classes", "prompts+heads", "Adam moments", "router G", "router R+Q", "EMA banks", "total")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    worst = 0
    for classes in (100, 200):
        for name in ("l2p", "dualprompt", "mvp", "hide", "norga", "flyprompt"):
            with torch.device("meta"):
                backbone = timm.create_model(protocol.model, pretrained=False, num_classes=0)
                model = method_class(name).from_protocol(backbone, classes, protocol, 1)
                if model.builtin_components:
                    router, ensemble = model.router, model.ensemble
                else:  # what benchmarks.ablation.components.AddedComponents adds
                    classifier = model.get_classifier()
                    router = AnalyticRouter(int(getattr(model, "router_dim", classifier.in_features)),
                                            model.num_experts, expansion_dim=m, ridge=protocol.ridge, seed=1)
                    ensemble = TemporalEnsembleHead(classifier, model.num_banks, decays=protocol.decays)
            trainable = list(model.trainable_parameters())
            frozen = {id(p) for p in backbone.parameters()}
            parts = {id(t): t for t in (*model.parameters(), *model.buffers()) if id(t) not in frozen}
            gram = m * (m + 1) // 2 * router.gram.element_size()
            routers = _bytes([router.cross, router.counts, router.expansion.weight])
            banks = _bytes([b for b in (ensemble.ema_weight, ensemble.ema_bias) if b is not None])
            model_only = _bytes(t for key, t in parts.items()
                                if key not in {id(b) for b in (*router.buffers(), *ensemble.buffers())})
            adam = 2 * _bytes(trainable)
            total = model_only + adam + gram + routers + banks
            cells = [name, str(classes), *(f"{b / 1e6:.1f} MB" for b in (model_only, adam, gram, routers, banks)),
                     f"{total / 1e6:.0f} MB"]
            print("| " + " | ".join(cells) + " |")
            worst = max(worst, total)
    print(f"\nworst case {worst / 1e6:.0f} MB per checkpoint; at the default period {anytime} checkpoints a "
          f"CIFAR-100 run ({anytime * worst / 1e9:.1f} GB written, two files on disk at a time):")
    for disk, speed in DISK_SPEEDS.items():
        print(f"  {disk}: {worst / speed:.2f} s per checkpoint, {anytime * worst / speed / 60:.1f} min a run")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--method", default="dualprompt", help="the method trained (its variants are all scored)")
    parser.add_argument("--rounds", type=int, default=2, help="trainings with and without checkpoints, alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="20 classes instead of 100 (smoke test)")
    parser.add_argument("--estimate", action="store_true", help="only the paper-scale size estimate")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.estimate:
        estimate(args)
        return 0
    report = Report()
    measure(args, report)
    return 1 if report.summary() else 0


if __name__ == "__main__":
    sys.exit(main())
