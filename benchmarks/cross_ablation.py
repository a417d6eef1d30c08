"""Cross-ablation of the analytic router and the temporal ensemble: methods x variants x datasets x seeds.

    python benchmarks/cross_ablation.py                  # CPU default: the proxy shortened (1 seed, < 10 min)
    python benchmarks/cross_ablation.py --preset proxy   # the CPU proxy benchmark (75 runs; README "Proxy benchmark (CPU)")
    python benchmarks/cross_ablation.py --preset cpu     # pipeline check: tiny random ViT, standard generated data
    python benchmarks/cross_ablation.py --preset paper   # the paper's protocol (GPU, real data, ViT-B/16)

Every finished run is written to ``<output>/runs/<dataset>/<method>/<variant>/seed<k>.json`` at once
(atomically: a temporary file renamed into place), and a rerun of the same command skips the runs
whose file exists, so an interruption loses at most the run in progress. After the sweep the table
is printed as Markdown and written as ``table.md``, ``table.csv`` and ``table.json`` (mean and
standard deviation over seeds, differences from each method's baseline), with ``curves.png``
(anytime accuracy per method and variant).

Variants: ``baseline`` (the method as published), ``router`` (+ analytic router at inference),
``ensemble`` (+ temporal-ensemble head), ``both``; FlyPrompt has both built in and runs as ``full``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

if __package__ in (None, ""):  # run as a script from a checkout: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.presets import PRESETS
from benchmarks.report import ABLATION_VARIANTS, plot_curves, summarize_results, write_tables
from benchmarks.results import (
    ProtocolMismatchError,
    check_resumable,
    load_results,
    plan,
    result_path,
    trainings,
    write_json_atomic,
)
from benchmarks.runner import PAPER_METHODS, Protocol, RunSpec, run_training


# ------------------------------------------------------------------------------------------- CLI
def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


PROTOCOL_HELP = {
    "model": "timm model name of the backbone",
    "model_kwargs": "JSON dict of extra timm.create_model arguments",
    "pretrained": "load the model's pretrained weights (true/false)",
    "weights": "local weight file (.safetensors/.pth/.npz) loaded through timm's pretrained path",
    "image_size": "image side fed to the backbone",
    "batch_size": "stream batch size B",
    "online_iter": "optimizer steps per stream batch",
    "eval_period": "anytime evaluation period in samples",
    "test_batch_size": "evaluation batch size",
    "num_sessions": "Si-Blurry sessions T",
    "disjoint_ratio": "r_D, fraction of disjoint classes",
    "blurry_ratio": "r_B, fraction of blurry-class samples moved between sessions",
    "num_experts": "experts (steps/tasks/prompt groups) per method",
    "lr": "Adam learning rate (default: the method's, 0.005 or 0.003 for HiDe-Prompt/NoRGa)",
    "expansion_dim": "router random-expansion width M",
    "ridge": "router ridge lambda",
    "decays": "comma-separated EMA decays of the ensemble",
    "aggregate": "ensemble aggregation rule",
    "amp": "mixed precision training on CUDA (true/false)",
    "augment": "reference training augmentation (true/false)",
    "method_kwargs": "JSON dict: method name -> constructor keyword arguments",
    "misa_prompts": "folder with MISA's g_prompt.pt and e_prompt.pt",
    "router_query": "router statistics from 'clean' (a frozen fp32 pass over the un-augmented batch, the "
                    "reference's) or 'first_iteration' (the first online iteration's query pass, one pass fewer)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="proxy-short",
                        help="base settings; flags override them")
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods (l2p, dualprompt, mvp, misa, hide, norga, flyprompt); "
                             "default: the preset's (the six of the paper's table, plus flyprompt for proxy presets)")
    parser.add_argument("--variants", default=",".join(ABLATION_VARIANTS), help="comma-separated variants")
    parser.add_argument("--datasets", default=None, help="comma-separated datasets (default: the preset's)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--data-root", default="data", help="folder holding the datasets")
    parser.add_argument("--download", action="store_true", help="download CIFAR-100 through torchvision if absent")
    parser.add_argument("--synthetic-classes", type=int, default=None, help="classes of the generated dataset")
    parser.add_argument("--synthetic-train-per-class", type=int, default=None, help="generated training images per class")
    parser.add_argument("--synthetic-test-per-class", type=int, default=None, help="generated test images per class")
    parser.add_argument("--output", default="results/cross_ablation", help="output folder")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: the preset's)")
    parser.add_argument("--no-resume", action="store_true", help="recompute runs whose result file exists")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    group = parser.add_argument_group("protocol (defaults come from --preset)")
    for item in fields(Protocol):
        group.add_argument(f"--{item.name.replace('_', '-')}", default=None, help=PROTOCOL_HELP[item.name])
    return parser


def _parse_protocol(args: argparse.Namespace, base: Protocol) -> Protocol:
    changes: Dict[str, Any] = {}
    for item in fields(Protocol):
        text = getattr(args, item.name)
        if text is None:
            continue
        current = getattr(base, item.name)
        if item.name in ("model_kwargs", "method_kwargs"):
            changes[item.name] = json.loads(text)
        elif item.name == "decays":
            changes[item.name] = tuple(float(v) for v in text.split(","))
        elif isinstance(current, bool):
            changes[item.name] = _bool(text)
        elif item.name == "lr":
            changes[item.name] = float(text)
        elif isinstance(current, int):
            changes[item.name] = int(text)
        elif isinstance(current, float):
            changes[item.name] = float(text)
        else:
            changes[item.name] = text
    return replace(base, **changes)


# ------------------------------------------------------------------------------------------ data
def synthetic_settings(args: argparse.Namespace, preset: Dict[str, Any]) -> Dict[str, Any]:
    """The generated dataset's settings: the preset's, overridden by the command line."""
    settings = dict(preset.get("synthetic", {}))
    for key, flag in (("num_classes", "synthetic_classes"), ("train_per_class", "synthetic_train_per_class"),
                      ("test_per_class", "synthetic_test_per_class")):
        if getattr(args, flag) is not None:
            settings[key] = getattr(args, flag)
    return settings


def load_data(name: str, args: argparse.Namespace, preset: Dict[str, Any], protocol: Protocol):
    from benchmarks import data

    if name == "synthetic":
        settings = synthetic_settings(args, preset)
        # class_offset: skip the first ids (the proxy's upstream, pretraining classes).
        _, class_ids = data.synthetic_class_split(settings.get("class_offset", 0), settings["num_classes"])
        return data.make_synthetic_train_test(
            class_ids, train_per_class=settings["train_per_class"],
            test_per_class=settings["test_per_class"], seed=0, image_size=protocol.image_size,
            difficulty=settings.get("difficulty", "standard"),
        )
    return data.load_dataset(name, args.data_root, image_size=protocol.image_size, download=args.download)


def run_setting(protocol: Protocol, args: argparse.Namespace, preset: Dict[str, Any], dataset: str) -> Dict[str, Any]:
    """Everything besides the run's key that decides its numbers: a finished run is reused only when
    its stored setting equals this one (the world size is not part of it: it does not change results)."""
    data_settings = synthetic_settings(args, preset) if dataset == "synthetic" else {}
    # Through JSON, so that it compares equal to what a result file stores (tuples become lists).
    return json.loads(json.dumps({"protocol": protocol.to_dict(), "data": data_settings}))


# ------------------------------------------------------------------------------------------ main
def _progress(disabled: bool):
    if disabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


def _init_distributed(device_arg: Optional[str]):
    """``(rank, world, device)``; under ``torchrun`` (WORLD_SIZE > 1) one process per device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available() and (device_arg is None or device_arg.startswith("cuda"))
    if world <= 1:
        return 0, 1, torch.device(device_arg or ("cuda" if use_cuda else "cpu"))
    import torch.distributed as dist

    dist.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), world, device


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    preset = PRESETS[args.preset]
    protocol = _parse_protocol(args, preset["protocol"])
    methods = [m for m in args.methods.split(",") if m] if args.methods else list(preset.get("methods", PAPER_METHODS))
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in ABLATION_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {ABLATION_VARIANTS}")
    datasets = args.datasets.split(",") if args.datasets else list(preset["datasets"])
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(preset["seeds"])
    threads = args.threads if args.threads is not None else preset["threads"]
    if threads:
        torch.set_num_threads(threads)
    rank, world, device = _init_distributed(args.device)
    lead = rank == 0  # only the first process writes and prints
    output = Path(args.output)
    specs = plan(methods, variants, datasets, seeds)
    settings = {name: run_setting(protocol, args, preset, name) for name in datasets}
    if not args.no_resume:
        check_resumable(output, specs, settings)
    todo = [s for s in specs if args.no_resume or not result_path(output, s).exists()]
    if lead:
        output.mkdir(parents=True, exist_ok=True)
        write_json_atomic(output / "protocol.json", {"preset": args.preset, "protocol": protocol.to_dict(), "world_size": world})
        print(f"{len(specs)} runs, {len(specs) - len(todo)} already finished; results in {output}", flush=True)
        if "misa" in methods and not protocol.misa_prompts:
            print("warning: no --misa-prompts: the 'misa' rows are DualPrompt with 10 G-prompt tokens and a uniform "
                  "prompt initialisation, not MISA's pretrained prompts", file=sys.stderr, flush=True)
    progress = _progress(args.no_progress or not lead)
    data_cache: Dict[str, Any] = {}
    outer = progress(total=len(todo), desc="runs") if progress else None
    for group in trainings(todo):  # one training scores every missing variant of a (dataset, seed, method)
        first = group[0]
        if first.dataset not in data_cache:
            data_cache = {first.dataset: load_data(first.dataset, args, preset, protocol)}
        train, test = data_cache[first.dataset]
        started = time.perf_counter()
        records = run_training(first.method, first.dataset, first.seed, [spec.variant for spec in group], protocol,
                               train, test, device=device, progress=progress)
        wall = time.perf_counter() - started
        for spec in group:
            result = records[spec.variant]
            result["wall_seconds"] = wall  # of the training shared by the group
            result["world_size"] = world
            result["setting"] = settings[spec.dataset]
            if not lead:
                continue
            write_json_atomic(result_path(output, spec), result)
            m = result["metrics"]
            line = (f"{spec.key}: A_auc {100 * m['A_auc']:.2f}  A_last {100 * m['A_last']:.2f}  "
                    f"F_last {100 * m['F_last']:.2f}  {result['seconds_per_batch'] * 1000:.1f} ms/batch  "
                    f"peak {result['peak_memory_mb']:.0f} MB  ({wall:.0f} s, {len(group)} variants)")
            (outer.write if outer else print)(line)
            if outer:
                outer.update(1)
    if outer:
        outer.close()
    if world > 1:
        import torch.distributed as dist

        dist.barrier()  # torch < 2.8 with gloo can deadlock in destroy_process_group without it
        dist.destroy_process_group()
    if not lead:
        return 0
    results = [r for r in load_results(output) if RunSpec(**r["spec"]) in set(specs)]
    markdown = write_tables(output, summarize_results(results))
    plot_curves(output, results)
    print(markdown)
    return 0


def _main_with_clear_errors() -> int:
    from benchmarks.data import DatasetNotFoundError
    from benchmarks.runner import BackboneLoadError

    try:
        return main()
    except DatasetNotFoundError as error:
        print(f"error: {error} (or pass --download)", file=sys.stderr)
    except (BackboneLoadError, ProtocolMismatchError) as error:
        print(f"error: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main_with_clear_errors())
