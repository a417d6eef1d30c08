#!/usr/bin/env python
"""The cost of the paper's table on this device, in one command of at most 8 minutes on one H100.

    python -m benchmarks.gpu.paper_cost --output OUT                          # the GPU check (CUDA)
    python -m benchmarks.gpu.paper_cost --device cpu --tiny --output /tmp/c   # toy sizes, the CI check

1. A CIFAR-100-format stand-in: 100 classes of 32x32 uint8 images in memory, with CIFAR-100's statistics
   and AutoAugment policy (the record ``load_cifar100`` returns), random pixels: no data can be fetched.
2. The plan probe (``benchmarks.ablation.probe``) of every method of the table, FlyPrompt included, on
   the paper protocol (ViT-B/16, random weights: none can be fetched; batch 64, 3 online iterations,
   M = 10,000, AMP), and the plan of the whole paper table priced by it: CIFAR-100, ImageNet-R and
   CUB-200 at their sizes (classes evened out), 5 seeds, every variant and the oracle, beside the same
   table run as one training per variant.
3. A short paper-preset sweep of every method on the stand-in (every variant scored), its ms per stream
   batch and seconds per evaluation, and the evaluation measured side by side without reuse.

Everything goes to ``OUT/paper_cost.json``, rewritten after each step; a step that would pass the budget
is skipped and recorded as such. docs/gpu.md ("Cost of the paper's table") explains the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks.ablation.plan import format_plan, make_plan
from benchmarks.ablation.run_specs import run_specs as specs_of
from benchmarks.core.method_names import canonical_method
from benchmarks.core.presets import PRESETS
from benchmarks.core.protocol import PAPER_METHODS
from benchmarks.core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS
from benchmarks.data.records import AUTOAUGMENT_POLICY, DATASET_STATS, TensorImageDataset
from benchmarks.flags import Parser, add_flag, add_output_flag
from fly_modules._validation import Real

METHODS = (*PAPER_METHODS, "flyprompt")
BUDGET_SECONDS = 480
#: the paper's datasets: (classes, training images, test images); ImageNet-R split 80/20 as the loader does,
#: CUB-200-2011 as its official split
PAPER_DATASETS = {"cifar100": (100, 50_000, 10_000), "imagenet-r": (200, 24_000, 6_000),
                  "cub200": (200, 5_994, 5_794)}


def scale(tiny: bool) -> Dict[str, Any]:
    """The protocol and stand-in sizes of the check; ``tiny``: a small random ViT at 32 pixels (CI)."""
    protocol = replace(PRESETS["paper"]["protocol"], pretrained=False)
    if tiny:
        protocol = replace(protocol, model="vit_tiny_patch16_224", image_size=32, batch_size=16, test_batch_size=64,
                           model_kwargs=dict(img_size=32, patch_size=8, embed_dim=48, depth=5, num_heads=3),
                           expansion_dim=64, eval_period=200)
        return {"protocol": protocol, "train_per_class": 3, "test_per_class": 1, "probe_batches": 2,
                "probe_eval_images": 32}
    return {"protocol": protocol, "train_per_class": 20, "test_per_class": 10, "probe_batches": 4,
            "probe_eval_images": 512}


def cifar_stand_in(train_per_class: int, test_per_class: int, image_size: int, *, classes: int = 100,
                   seed: int = 0) -> Tuple[TensorImageDataset, TensorImageDataset]:
    """``(train, test)`` records shaped as ``load_cifar100`` returns them, with random 32x32 pixels."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for per_class in (train_per_class, test_per_class):
        targets = torch.arange(classes).repeat(per_class)  # classes interleaved, as CIFAR's files
        images = torch.randint(0, 256, (len(targets), 3, 32, 32), dtype=torch.uint8, generator=generator)
        out.append(TensorImageDataset(images, targets, [f"class{c}" for c in range(classes)], name="cifar100",
                                      image_size=image_size, stats=DATASET_STATS["cifar100"],
                                      autoaugment_policy=AUTOAUGMENT_POLICY["cifar100"]))
    return out[0], out[1]


class _Targets:
    """A dataset of the paper table for counting only: targets and classes (the plan reads nothing else)."""

    def __init__(self, classes: int, size: int) -> None:
        self.targets = torch.arange(size) % classes
        self.classes = [str(c) for c in range(classes)]

    def __len__(self) -> int:
        return len(self.targets)


def paper_table_plan(units: Dict[tuple, Dict[str, Any]], protocol: Any, methods: Sequence[str]) -> Dict[str, Any]:
    """The paper table (3 datasets x ``methods`` x 5 seeds) priced by the stand-in's probes."""
    from benchmarks.ablation.plan import count_work, summarize

    specs = specs_of(list(methods), [*ABLATION_VARIANTS, *ORACLE_VARIANTS], list(PAPER_DATASETS), [1, 2, 3, 4, 5])
    data = {name: (_Targets(c, n), _Targets(c, m)) for name, (c, n, m) in PAPER_DATASETS.items()}
    work = count_work(specs, protocol, lambda name: data[name])
    priced = {(item.dataset, item.method): {**units[("cifar100", item.method)], "dataset": item.dataset}
              for item in work}
    return summarize(work, priced, device=next(iter(units.values()))["device"], results=len(specs),
                     probe_batches=next(iter(units.values()))["batches"], probe_seconds=0.0)


def short_sweep(method: str, protocol: Any, train: Any, test: Any, device: torch.device) -> Dict[str, Any]:
    """One training of ``method`` on the stand-in, every variant, and its evaluation without reuse beside it."""
    from benchmarks.ablation.profile import profile_method

    started = time.perf_counter()
    result = profile_method(method, "cifar100", 1, protocol, train, test, device=device)
    result["wall_seconds"] = time.perf_counter() - started
    return result


class CostDocument:
    """``paper_cost.json`` as the run fills it: rewritten after every step, so a run stopped from outside
    still leaves what finished, and the budget left to the steps."""

    def __init__(self, args: argparse.Namespace, device: torch.device, setting: Dict[str, Any], output: Path,
                 started: float) -> None:
        self.started, self.budget = started, args.budget
        self.path = output / "paper_cost.json"
        self.document: Dict[str, Any] = {
            "scale": "tiny" if args.tiny else "gpu", "device": str(device), "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "budget_seconds": args.budget, "protocol": setting["protocol"].to_dict(),
            "stand_in": {"classes": 100, "train_per_class": setting["train_per_class"],
                         "test_per_class": setting["test_per_class"]},
            "probes": {}, "sweep": {}, "skipped": [], "errors": {},
        }

    def save(self) -> None:
        self.document["seconds"] = time.perf_counter() - self.started
        self.path.write_text(json.dumps(self.document, indent=1))

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.started)

    def record_error(self, step: str, error: Exception) -> None:
        """A step that failed: recorded, and the next one still runs."""
        self.document["errors"][step] = "".join(traceback.format_exception_only(type(error), error)).strip()
        self.save()


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    device = torch.device(args.device)
    if args.tiny:
        torch.set_num_threads(1)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    setting = scale(args.tiny)
    protocol = setting["protocol"]
    cost = CostDocument(args, device, setting, output, started)
    train, test = cifar_stand_in(setting["train_per_class"], setting["test_per_class"], protocol.image_size)
    cost.save()
    units = probe_methods(args, cost, setting, device, train, test)  # the probes first: they decide the estimate
    priced = [method for method in args.methods if ("cifar100", method) in units]
    if priced:
        price_paper_table(cost, units, protocol, priced, output)
    for method in args.methods:
        if cost.left() < args.reserve:
            cost.document["skipped"].append(f"sweep {method}")
            continue
        try:
            result = short_sweep(method, protocol, train, test, device)
        except Exception as error:
            cost.record_error(f"sweep {method}", error)
            continue
        cost.document["sweep"][method] = result
        print(f"paper_cost: sweep {method}: {1000 * result['train_per_batch']:.1f} ms/batch, evaluation "
              f"{result['eval_per_evaluation']:.2f} s (without reuse {result['reference_eval_per_evaluation']:.2f} s), "
              f"logs identical: {result['logs_identical']}", flush=True)
        cost.save()
    cost.save()
    document = cost.document
    print(f"paper_cost: {document['seconds']:.0f} s; written {cost.path}", flush=True)
    failed = bool(document["errors"]) or not all(r["logs_identical"] for r in document["sweep"].values())
    return 1 if failed else 0


def probe_methods(args: argparse.Namespace, cost: CostDocument, setting: Dict[str, Any], device: torch.device,
                  train: Any, test: Any) -> Dict[tuple, Dict[str, Any]]:
    """Each method's timed probe on the stand-in, while the budget allows; the priced units by (dataset, method)."""
    specs = specs_of(args.methods, [*ABLATION_VARIANTS, *ORACLE_VARIANTS], ["cifar100"], [1])
    units: Dict[tuple, Dict[str, Any]] = {}
    for method in args.methods:
        if cost.left() < args.reserve:
            cost.document["skipped"].append(f"probe {method}")
            continue
        try:
            one = make_plan([s for s in specs if s.method == method], setting["protocol"], lambda name: (train, test),
                            device=device, probe_batches=setting["probe_batches"],
                            eval_samples=setting["probe_eval_images"])
        except Exception as error:  # recorded, and the next method still runs
            cost.record_error(f"probe {method}", error)
            continue
        (unit,) = one["probes"]
        units[("cifar100", method)] = unit
        cost.document["probes"][method] = unit
        print(f"paper_cost: probe {method}: {1000 * unit['per_batch']:.1f} ms/batch, "
              f"{1000 * unit['prompted_per_image']:.2f} ms per prompted pass of a test image", flush=True)
        cost.save()
    return units


def price_paper_table(cost: CostDocument, units: Dict[tuple, Dict[str, Any]], protocol: Any, priced: List[str],
                      output: Path) -> None:
    """The paper table's plan from the probed methods: its estimate in the document, the plan in markdown."""
    table = paper_table_plan(units, protocol, priced)
    cost.document["paper_table"] = {"methods": priced, "complete": priced == list(METHODS),
                                    "total_seconds": table["total_seconds"], "trainings": len(table["trainings"]),
                                    "results": table["results"]}
    (output / "paper_table_plan.md").write_text(format_plan(table) + "\n")
    hours = table["total_seconds"]
    print(f"paper_cost: the paper table ({len(priced)} of {len(METHODS)} methods) on this device: "
          f"{hours['ours'] / 3600:.2f} h estimated; one training per variant: {hours['per_variant'] / 3600:.2f} h",
          flush=True)
    cost.save()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_output_flag(parser, "--output", "folder", default=None, required=True,
                    help="folder for paper_cost.json and paper_table_plan.md",
                    contents={"paper_cost.json": "file", "paper_table_plan.md": "file"})
    parser.add_argument("--device", default="cuda", help="cuda (the GPU check) or cpu (with --tiny: the CI check)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: every step end to end in seconds")
    add_flag(parser, "--budget", Real(above=0), default=BUDGET_SECONDS, help="seconds for all steps together")
    add_flag(parser, "--reserve", Real(minimum=0), default=30.0, help="seconds a step needs left to start")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods (the table: all)")
    args = parser.parse_args(argv)
    args.methods = [canonical_method(name) for name in args.methods.split(",") if name.strip()]
    unknown = [name for name in args.methods if name not in METHODS]
    if unknown or not args.methods:
        parser.error(f"--methods: expected names from {', '.join(METHODS)}, found {args.methods}")
    if not args.device.startswith(("cuda", "cpu")):
        parser.error(f"--device: expected cuda or cpu, found {args.device!r}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"paper_cost: --device {args.device}, but torch {torch.__version__} sees no CUDA device; use "
              f"--device cpu --tiny for the CPU check", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
