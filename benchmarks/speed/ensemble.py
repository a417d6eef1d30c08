#!/usr/bin/env python
"""Micro-benchmark of :class:`fly_modules.ensemble.TemporalEnsembleHead` inference (CPU or CUDA).

Ours: ``TemporalEnsembleHead.forward(features, expert_ids, logit_mask)``, i.e. on the CPU one matmul
per routed expert over its own samples (all its EMA copies at once), on a GPU one matmul against
every expert's copies and a gather (no host synchronisation), then the logit mask and the
aggregation, with no per-sample loop.

Reference approach (re-implemented from docs/protocol.md, sections 3.6 and 6.1, ``forward_with_ema``):
every expert owns separate ``nn.Linear`` EMA heads; a Python loop over the samples applies the online
head and the routed expert's EMA heads to each sample, adds the seen-class mask, takes the softmax of
each head and the element-wise maximum over heads (``softmax_max``, the default aggregation).

Both are timed side by side in this run (interleaved rounds, medians) and their scores are compared.

Run from the repository root::

    python -m benchmarks.speed.ensemble            # 5 experts, 2 decays, 100 classes, d=768, batches 64 / 256
    python -m benchmarks.speed.ensemble --quick    # small smoke test
    python -m benchmarks.speed.ensemble --device cuda   # on a GPU (timings synchronise the device)
    python -m benchmarks.speed.ensemble --json ensemble.json   # also every target and figure as JSON
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

import torch
from torch import Tensor, nn

from benchmarks.flags import Parser, add_flag
from benchmarks.speed.figures import FigureReport
from benchmarks.speed.timing import (
    Report,
    add_run_options,
    best_ratio,
    describe_device,
    format_seconds,
    median,
    print_header,
    start_run,
    time_side_by_side,
)
from fly_modules._validation import Integer, Real, shared_default
from fly_modules.ensemble import TemporalEnsembleHead

TARGET_SMALL_BATCH = 3.0
TARGET_LARGE_BATCH = 5.0
TARGET_MAX_ABS_DIFF = 1e-5  # float32 scores in [0, 1]


def build_ensemble(
    dim: int, classes: int, experts: int, decays: Sequence[float], *, seed: int, device: torch.device
) -> TemporalEnsembleHead:
    """An ensemble whose experts' EMA copies all differ from each other and from the online head."""
    generator = torch.Generator().manual_seed(seed)
    online = nn.Linear(dim, classes)
    ensemble = TemporalEnsembleHead(online, num_experts=0, decays=decays)
    with torch.no_grad():
        for expert in range(experts):
            ensemble.start_expert(expert)
            for _ in range(5):  # a few "optimizer steps" per expert
                online.weight.add_(0.05 * torch.randn(online.weight.shape, generator=generator))
                online.bias.add_(0.05 * torch.randn(online.bias.shape, generator=generator))
                ensemble.update()
    return ensemble.to(device).eval()


class ReferenceEnsemble:
    """The reference's layout: the online head plus, per expert, a list of separate EMA ``nn.Linear`` heads."""

    def __init__(self, ensemble: TemporalEnsembleHead) -> None:
        self.online = ensemble.online
        self.ema_heads: List[List[nn.Linear]] = []
        for expert in range(ensemble.num_experts):
            heads = []
            for decay in range(ensemble.num_decays):
                head = nn.Linear(ensemble.in_features, ensemble.num_classes, device=ensemble.ema_weight.device)
                with torch.no_grad():
                    head.weight.copy_(ensemble.ema_weight[expert, decay])
                    head.bias.copy_(ensemble.ema_bias[expert, decay])
                heads.append(head.eval())
            self.ema_heads.append(heads)

    @torch.no_grad()
    def forward(self, features: Tensor, expert_ids: Tensor, logit_mask: Tensor) -> Tensor:
        scores = []
        for index in range(features.shape[0]):  # per-sample loop, as in forward_with_ema
            sample = features[index:index + 1]
            heads = [self.online] + self.ema_heads[int(expert_ids[index])]
            probabilities = [torch.softmax(head(sample) + logit_mask, dim=-1) for head in heads]
            scores.append(torch.stack(probabilities).amax(dim=0))
        return torch.cat(scores)


def bench_batch(
    ensemble: TemporalEnsembleHead, reference: ReferenceEnsemble, batch: int, target: float,
    args: argparse.Namespace, report: Report,
) -> float:
    generator = torch.Generator().manual_seed(args.seed + batch)  # drawn on the CPU: the same numbers everywhere
    features = torch.randn(batch, args.dim, generator=generator).to(args.device)
    expert_ids = torch.randint(args.experts, (batch,), generator=generator).to(args.device)
    logit_mask = torch.zeros(args.classes, device=args.device)
    logit_mask[int(args.classes * args.seen_fraction):] = float("-inf")  # classes not seen yet

    def ours() -> Tensor:
        with torch.no_grad():
            return ensemble(features, expert_ids, logit_mask)

    def naive() -> Tensor:
        return reference.forward(features, expert_ids, logit_mask)

    # Fast side: several calls per round so each timing is well above the clock's resolution.
    times = time_side_by_side({"ours": ours, "reference": naive}, repeats=args.repeats, warmup=2,
                              inner={"ours": 10, "reference": 2}, synchronize=args.synchronize)
    t_ours, t_ref = median(times["ours"]), median(times["reference"])
    report.check(
        f"ensemble.speedup_batch{batch}", t_ref / t_ours, ">=", target, unit="x",
        detail=f"per-sample loop {format_seconds(t_ref)} vs batched {format_seconds(t_ours)} per batch of {batch} "
        f"(median of {args.repeats}; ratio of the best times {best_ratio(times, 'reference', 'ours')})",
    )
    ours_scores, reference_scores = ours(), naive()
    agree = float((ours_scores.argmax(1) == reference_scores.argmax(1)).float().mean())
    report.info(f"batch {batch}: predictions agree on {agree:.1%} of samples")
    return float((ours_scores - reference_scores).abs().max())


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flag(parser, "--dim", Integer(minimum=1), default=768, help="feature width d")
    add_flag(parser, "--classes", Integer(minimum=1), default=100, help="classes C of the head")
    add_flag(parser, "--experts", Integer(minimum=1), default=5, help="experts of the ensemble")
    add_flag(parser, "--decays", Real(above=0, below=1), nargs="+", default=list(shared_default("decays")),
             help="EMA decays of the ensemble, each in (0, 1)")
    add_flag(parser, "--seen-fraction", Real(above=0, maximum=1), default=0.6, help="fraction of classes unmasked")
    add_flag(parser, "--small-batch", Integer(minimum=1), default=64, help=f"batch with target >= {TARGET_SMALL_BATCH:g}x")
    add_flag(parser, "--large-batch", Integer(minimum=1), default=256, help=f"batch with target >= {TARGET_LARGE_BATCH:g}x")
    add_flag(parser, "--repeats", Integer(minimum=1), default=30, help="measured rounds per batch size")
    add_run_options(parser, placed="the heads")
    args = parser.parse_args(argv)
    if args.quick:
        args.small_batch, args.large_batch, args.repeats = 8, 32, 5
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    start_run(args)
    torch.manual_seed(args.seed)
    print_header("TemporalEnsembleHead inference benchmark (batched gather vs per-sample loop, side by side)", {
        "device": describe_device(args.device), "feature dim d": args.dim, "classes": args.classes, "experts": args.experts, "decays": tuple(args.decays),
        "heads per sample": 1 + len(args.decays), "aggregation": "softmax_max",
        "batches": (args.small_batch, args.large_batch),
        "repeats": args.repeats, "dtype": "float32", "mode": "quick (smoke test)" if args.quick else "full",
    })
    ensemble = build_ensemble(args.dim, args.classes, args.experts, args.decays, seed=args.seed, device=args.device)
    reference = ReferenceEnsemble(ensemble)
    report = FigureReport()
    differences = [
        bench_batch(ensemble, reference, args.small_batch, TARGET_SMALL_BATCH, args, report),
        bench_batch(ensemble, reference, args.large_batch, TARGET_LARGE_BATCH, args, report),
    ]
    report.check("ensemble.scores_match", max(differences), "<=", TARGET_MAX_ABS_DIFF, fmt=".1e",
                 detail="max |scores_ours - scores_reference| over both batches (softmax_max scores)")
    return report.finish(args, benchmark="bench_ensemble")


if __name__ == "__main__":
    sys.exit(main())
