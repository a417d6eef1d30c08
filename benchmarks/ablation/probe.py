"""A short timed run of one method on one dataset: what a stream batch and a test image cost, by part.

:func:`probe` builds the run as :func:`benchmarks.ablation.runner.run_training` does (same model, stream,
components and evaluator, on the caller's device), trains a few stream batches and evaluates a sample
of the test set twice: the first evaluation also computes the frozen features of its images, the
second reuses them (as every evaluation whose subset is the previous one's). The plan (``benchmarks.ablation.plan``) multiplies
these unit costs by the counted work of every training; docs/benchmark.md ("Cost of a sweep").

The probe trains small batches (``batch_images``) of fewer online iterations (``iterations``) than the protocol's
and scales the measured parts linearly to the protocol's batch (:func:`scale_training`; the probe's record says
what it scaled): a plan must answer in about a minute also where a batch of the paper's size takes minutes.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from ..core.protocol import Protocol
from ..core.timer import PartTimer
from ..data.records import TensorImageDataset
from .runner import build_run

__all__ = ["probe", "scale_training", "test_sample"]

#: the training parts run once per online iteration (the others once per stream batch)
PER_ITERATION_PARTS = ("train/augment", "train/steps")


def test_sample(test: Any, size: int) -> Any:
    """An in-memory record of ``size`` test images drawn without replacement (fixed seed), in dataset order."""
    size = min(int(size), len(test))
    order = torch.randperm(len(test), generator=torch.Generator().manual_seed(0))[:size].sort().values
    raw, targets = test.get_raw_batch(order)
    return TensorImageDataset(raw, targets, test.classes, name=test.name, image_size=test.image_size,
                              stats=(test.mean, test.std), autoaugment_policy=test.autoaugment_policy)


def _per(total: float, count: int) -> float:
    return total / count if count else 0.0


def probe(
    method: str, dataset: str, variants: Sequence[str], protocol: Protocol, train: Any, test: Any, *,
    device: torch.device, seed: int = 1, batches: int = 1, warmup: int = 1, eval_samples: int = 16,
    batch_images: int = 8, iterations: int = 1, routers: Sequence[str] = (), aggregations: Sequence[str] = (),
    heads: Sequence[str] = (), log: Callable[[str], None] = lambda line: None,
) -> Dict[str, Any]:
    """Unit costs of one training of ``method`` (the ``variants`` it scores) measured on ``device``.

    Returns seconds: ``build`` (method, stream, test images on the device), ``per_batch`` (a stream batch
    of training, the mean over ``batches`` after ``warmup``) and ``train_parts`` (its parts per batch),
    ``frozen_per_image`` (a test image's frozen, prompt-free pass; 0 for a method that does not split its
    query, whose query pass is then in ``eval_per_image``), ``prompted_per_image`` (one prompted pass of a
    test image), ``eval_per_image`` (everything else of scoring an image, all variants, query included
    where it is not cached) and ``eval_parts`` (per image), with the counts they were measured on.
    ``routers``, ``aggregations`` and ``heads`` are the studies the training scores (``run_training``), timed
    with it. Stream batches of ``batch_images`` images and ``iterations`` online iterations are timed and scaled
    to the protocol's (``scaled``); ``log`` is told each step as it starts.
    """
    if min(batches, eval_samples, batch_images, iterations) < 1 or warmup < 0:
        raise ValueError(f"probe needs batches, eval_samples, batch_images, iterations >= 1 and warmup >= 0; got "
                         f"{batches}, {eval_samples}, {batch_images}, {iterations}, {warmup}")
    probed = replace(protocol, batch_size=min(batch_images, protocol.batch_size),
                     online_iter=min(iterations, protocol.online_iter),
                     test_batch_size=min(protocol.test_batch_size, eval_samples))
    timer = PartTimer(device)
    started = time.perf_counter()
    log(f"  building {method} on {device} ({protocol.model}) ...")
    sample = test_sample(test, eval_samples)
    run = build_run(method, dataset, seed, variants, probed, train, sample, device=device, timer=timer,
                    routers=routers, aggregations=aggregations, heads=heads)
    build = time.perf_counter() - started
    log(f"  training {warmup + batches} stream batch(es) of {probed.batch_size} images, {probed.online_iter} "
        f"iteration(s) each ...")
    timed, measured, parts = _time_training(run, probed, timer, dataset, warmup=warmup, batches=batches)
    per_batch, train_parts, scaled = scale_training(measured, parts, probed, protocol)
    log(f"  evaluating {len(sample)} test images twice ...")
    (cold, _), (warm, prompted_rows) = _time_evaluations(run, timer)
    images = len(sample)
    seconds = {part: value["seconds"] for part, value in warm.items()}
    prompted = seconds.pop("eval/prompted", 0.0)
    frozen = max(cold.get("eval/query", {}).get("seconds", 0.0) - seconds.get("eval/query", 0.0), 0.0)
    return {
        "method": method, "dataset": dataset, "variants": list(variants), "device": str(device),
        "batches": timed, "warmup": warmup, "eval_images": images, "prompted_passes": _per(prompted_rows, images),
        "build": build, "per_batch": per_batch, "train_parts": train_parts,
        "frozen_per_image": _per(frozen, images) if run.evaluator.reuse_frozen else 0.0,
        "prompted_per_image": _per(prompted, prompted_rows),
        "eval_per_image": _per(sum(seconds.values()), images),
        "eval_parts": {part: _per(value, images) for part, value in seconds.items()},
        "splits_query": run.evaluator.reuse_frozen, "scaled": scaled,
    }


def scale_training(per_batch: float, parts: Dict[str, float], probed: Protocol,
                   protocol: Protocol) -> Tuple[float, Dict[str, float], Dict[str, Any]]:
    """The seconds of a stream batch of ``protocol`` from those measured on the smaller ``probed`` one: every
    part in proportion to the batch's images, the per-iteration parts also to the online iterations (linear:
    an accelerator that a small batch leaves idle is over-estimated, never under-).
    ``(per batch, parts, what was scaled)``."""
    images = protocol.batch_size / probed.batch_size
    iterations = protocol.online_iter / probed.online_iter
    scaled = {part: seconds * images * (iterations if part in PER_ITERATION_PARTS else 1.0)
              for part, seconds in parts.items()}
    rest = max(per_batch - sum(parts.values()), 0.0) * images  # untimed work of the batch
    what = {"batch_size": [probed.batch_size, protocol.batch_size],
            "online_iter": [probed.online_iter, protocol.online_iter]}
    return rest + sum(scaled.values()), scaled, what


def _time_training(
    run: Any, protocol: Protocol, timer: PartTimer, dataset: str, *, warmup: int, batches: int,
) -> Tuple[int, float, Dict[str, float]]:
    """Train ``warmup`` stream batches, then time ``batches``: ``(timed, seconds per batch, parts per batch)``."""
    trainer = run.trainer
    trainer.model.train()
    timed, before = 0, 0.0
    for batch in run.stream.batches(protocol.batch_size, rank=None):
        if batch.index == warmup:
            timer.reset()
            before = trainer.position.train_seconds
        if batch.index >= warmup + batches:
            break
        trainer.advance_to(batch.session)
        trainer.train_batch(batch)
        trainer.position.samples_seen = batch.samples_seen
        trainer.position.batches += 1
        timed += batch.index >= warmup
    if timed == 0:
        raise ValueError(f"the {dataset} stream has {trainer.position.batches} batches; the probe needs more "
                         f"than warmup={warmup}")
    per_batch = (trainer.position.train_seconds - before) / timed
    # (a session that ends inside the probe is evaluated by the loop: its parts are not training)
    parts = {part: _per(value["seconds"], timed) for part, value in timer.summary().items() if part.startswith("train/")}
    return timed, per_batch, parts


def _time_evaluations(run: Any, timer: PartTimer) -> List[Tuple[Dict[str, Any], int]]:
    """Two evaluations of every class: ``[(parts, prompted rows)]``, cold (computes the frozen features)
    then warm (reuses them, as every later evaluation)."""
    # A class the few probe batches did not train is counted for the current expert, so that the
    # evaluation scores every sampled image (the probe's state is thrown away).
    trainer, evaluator = run.trainer, run.evaluator
    usage = evaluator.usage
    untrained = usage.counts.sum(dim=1) == 0
    usage.counts[untrained, int(trainer.model.current_expert)] = 1
    seen = len(run.stream)
    trainer.model.eval()
    timings = []
    for _ in range(2):
        timer.reset()
        rows = evaluator.prompted_rows
        evaluator("anytime", timestamp=seen, samples_seen=seen, session=run.stream.num_sessions - 1, final=False)
        timings.append((timer.summary(), evaluator.prompted_rows - rows))
    trainer.model.train()
    return timings
