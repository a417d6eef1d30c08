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
import csv
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

if __package__ in (None, ""):  # run as a script from a checkout: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks.runner import PAPER_METHODS, VARIANTS, Protocol, RunSpec, run

ABLATION_VARIANTS = ("baseline", "router", "ensemble", "both")
VARIANT_ORDER = {name: i for i, name in enumerate((*ABLATION_VARIANTS, "full"))}
METRICS = ("A_auc", "A_last", "A_avg", "F_last")

_PROXY_WEIGHTS = str(Path(__file__).resolve().parent / "checkpoints" / "proxy_vit.safetensors")
#: The CPU proxy of the paper's setting (README "Proxy benchmark (CPU)"): a tiny timm ViT pretrained by
#: benchmarks/pretrain_proxy.py on upstream classes 0..399 of the hard generated data, loaded from
#: benchmarks/checkpoints/ through timm's pretrained-file path, and a Si-Blurry stream over the 100
#: disjoint downstream classes 400..499 (r_D 0.5, r_B 0.1, 5 sessions, anytime evaluation).
_PROXY_PROTOCOL = Protocol(
    model="vit_tiny_patch16_224",
    model_kwargs=dict(img_size=32, patch_size=8, embed_dim=128, depth=6, num_heads=4),
    pretrained=True, weights=_PROXY_WEIGHTS, image_size=32, batch_size=16, online_iter=3, eval_period=400,
    test_batch_size=250, expansion_dim=2000, ridge=1e4, amp=False, router_query="first_iteration",
)
_PROXY_DATA = dict(num_classes=100, class_offset=400, difficulty="hard", train_per_class=20, test_per_class=10,
                   image_size=32)

#: Presets: the protocol, the datasets and seeds, how the data are built, and the default methods.
PRESETS: Dict[str, Dict[str, Any]] = {
    # The CPU proxy benchmark: all six methods in all four variants plus FlyPrompt, three seeds.
    "proxy": {
        "protocol": _PROXY_PROTOCOL,
        "datasets": ["synthetic"],
        "seeds": [1, 2, 3],
        "synthetic": dict(_PROXY_DATA),
        "threads": 1,
        "methods": [*PAPER_METHODS, "flyprompt"],
    },
    # The default (no arguments): the proxy shortened to one seed, 8 stream and 5 test images per class.
    "proxy-short": {
        "protocol": replace(_PROXY_PROTOCOL, eval_period=200),
        "datasets": ["synthetic"],
        "seeds": [1],
        "synthetic": dict(_PROXY_DATA, train_per_class=8, test_per_class=5),
        "threads": 1,
        "methods": [*PAPER_METHODS, "flyprompt"],
    },
    # Runs in a few minutes on 2 CPU cores: a tiny random ViT on generated images. The numbers test
    # the pipeline, not the method (a random backbone gives prompts nothing to build on).
    "cpu": {
        "protocol": Protocol(
            model="vit_tiny_patch16_224",
            model_kwargs=dict(img_size=32, patch_size=8, embed_dim=48, depth=4, num_heads=3),
            pretrained=False, image_size=32, batch_size=16, online_iter=3, eval_period=200,
            test_batch_size=128, expansion_dim=1000, ridge=1e2, amp=False, router_query="first_iteration",
            method_kwargs={"l2p": {"pool_size": 10, "top_k": 2}},
        ),
        "datasets": ["synthetic"],
        "seeds": [1],
        "synthetic": dict(num_classes=20, train_per_class=40, test_per_class=10, image_size=32),
        "threads": 1,
    },
    # The paper's protocol (reference-protocol section 0): ViT-B/16 with the original ImageNet-21k
    # weights, CIFAR-100 / ImageNet-R / CUB-200, r_D 0.5, r_B 0.1, 5 sessions, batch 64, 3 online
    # iterations, Adam 0.005 (0.003 for HiDe-Prompt/NoRGa), AMP, evaluation every 1000 samples,
    # seeds 1-5, M = 10,000, lambda = 1e4, decays 0.9/0.99, softmax-max. The baselines keep the
    # reference's behaviour where it differs from our defaults (reference-protocol 4.2, 4.5, 4.9):
    # DualPrompt/MISA select over the whole pool at test time, MVP's loss terms are batch-global, and
    # HiDe-Prompt/NoRGa's router reads g_mlp outputs; the router sees the clean batch (router_query).
    "paper": {
        "protocol": Protocol(method_kwargs={
            "dualprompt": {"reference_quirks": True}, "misa": {"reference_quirks": True},
            "mvp": {"reference_quirks": True},
            "hide": {"router_features": "g_mlp"}, "norga": {"router_features": "g_mlp"},
        }),
        "datasets": ["cifar100", "imagenet-r", "cub200"],
        "seeds": [1, 2, 3, 4, 5],
        "synthetic": dict(num_classes=100, train_per_class=500, test_per_class=100, image_size=224),
        "threads": None,
    },
}


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


# --------------------------------------------------------------------------------------- results
def result_path(output: Path, spec: RunSpec) -> Path:
    return output / "runs" / f"{spec.key}.json"


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write to a temporary file in the same folder and rename it into place (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(payload, stream)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def load_results(output: Path) -> List[Dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((output / "runs").glob("**/*.json"))]


def run_setting(protocol: Protocol, args: argparse.Namespace, preset: Dict[str, Any], dataset: str) -> Dict[str, Any]:
    """Everything besides the run's key that decides its numbers: a finished run is reused only when
    its stored setting equals this one (the world size is not part of it: it does not change results)."""
    data_settings = synthetic_settings(args, preset) if dataset == "synthetic" else {}
    # Through JSON, so that it compares equal to what a result file stores (tuples become lists).
    return json.loads(json.dumps({"protocol": protocol.to_dict(), "data": data_settings}))


def setting_differences(stored: Dict[str, Any], wanted: Dict[str, Any]) -> List[str]:
    """``name: stored -> wanted`` for each differing entry (results written before settings were
    recorded carry their protocol only; only that is compared then)."""
    differences = []
    for part in ("protocol", "data"):
        if part not in stored:
            continue
        old, new = stored[part], wanted[part]
        if part == "protocol":  # fields added later: what older results did
            old = {**LEGACY_PROTOCOL, **old}
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                differences.append(f"{name}: {old.get(name)!r} -> {new.get(name)!r}")
    return differences


def check_resumable(output: Path, specs: Sequence[RunSpec], settings: Dict[str, Dict[str, Any]]) -> None:
    """Refuse to mix finished runs of another protocol into this table (exit status 2 with the reason)."""
    for spec in specs:
        path = result_path(output, spec)
        if not path.exists():
            continue
        result = json.loads(path.read_text())
        stored = result.get("setting", {"protocol": result.get("protocol", {})})
        differences = setting_differences(stored, settings[spec.dataset])
        if differences:
            raise ProtocolMismatchError(
                f"{path} was run with another setting ({'; '.join(differences[:4])}"
                f"{'; ...' if len(differences) > 4 else ''}); pass --no-resume to recompute such runs, "
                f"or choose another --output"
            )


#: Protocol fields added after results were first written, with the behaviour those results had.
LEGACY_PROTOCOL = {"router_query": "first_iteration"}


class ProtocolMismatchError(RuntimeError):
    """A finished run in the output folder used a different protocol or data setting."""


def summarize_results(results: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (dataset, method, variant): mean/std over seeds of each metric (in %) and the
    difference of the means from the method's baseline."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for result in results:
        spec = result["spec"]
        groups.setdefault((spec["dataset"], spec["method"], spec["variant"]), []).append(result)
    rows = []
    for (dataset, method, variant), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], VARIANT_ORDER.get(kv[0][2], 99))):
        row: Dict[str, Any] = {"dataset": dataset, "method": method, "variant": variant, "seeds": len(runs)}
        for metric in METRICS:
            values = np.array([100 * r["metrics"][metric] for r in runs], dtype=float)
            row[f"{metric}_mean"] = float(np.mean(values))
            row[f"{metric}_std"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        row["seconds_per_batch"] = float(np.mean([r["seconds_per_batch"] for r in runs]))
        row["peak_memory_mb"] = float(np.max([r["peak_memory_mb"] for r in runs]))
        rows.append(row)
    baselines = {(r["dataset"], r["method"]): r for r in rows if r["variant"] == "baseline"}
    for row in rows:
        base = baselines.get((row["dataset"], row["method"]))
        for metric in METRICS:
            row[f"{metric}_delta"] = (row[f"{metric}_mean"] - base[f"{metric}_mean"]) if base else math.nan
    return rows


def format_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    lines = [
        "| dataset | method | variant | seeds | A_auc | ΔA_auc | A_last | ΔA_last | F_last | s/batch | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        def cell(metric: str) -> str:
            return f"{r[f'{metric}_mean']:.2f} ± {r[f'{metric}_std']:.2f}"

        def delta(metric: str) -> str:
            value = r[f"{metric}_delta"]
            return "" if math.isnan(value) or r["variant"] == "baseline" else f"{value:+.2f}"

        lines.append(
            f"| {r['dataset']} | {r['method']} | {r['variant']} | {r['seeds']} | {cell('A_auc')} | {delta('A_auc')} | "
            f"{cell('A_last')} | {delta('A_last')} | {cell('F_last')} | {r['seconds_per_batch']:.3f} | {r['peak_memory_mb']:.0f} |"
        )
    return "\n".join(lines)


def write_tables(output: Path, rows: Sequence[Dict[str, Any]]) -> str:
    markdown = format_markdown(rows)
    (output / "table.md").write_text(markdown + "\n")
    write_json_atomic(output / "table.json", list(rows))
    if rows:
        with open(output / "table.csv", "w", newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return markdown


def plot_curves(output: Path, results: Sequence[Dict[str, Any]]) -> Optional[Path]:
    """Anytime accuracy (mean over seeds) per method and variant, one panel per (dataset, method)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no curves.png", file=sys.stderr)
        return None
    panels: Dict[tuple, Dict[str, List[Dict[str, Any]]]] = {}
    for result in results:
        spec = result["spec"]
        panels.setdefault((spec["dataset"], spec["method"]), {}).setdefault(spec["variant"], []).append(result)
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.5 * rows), squeeze=False)
    for axis, ((dataset, method), variants) in zip(axes.flat, sorted(panels.items())):
        for variant, runs in sorted(variants.items(), key=lambda kv: VARIANT_ORDER.get(kv[0], 99)):
            curves = []
            for r in runs:
                anytime = [e for e in r["log"]["records"] if e["kind"] == "anytime"]
                curves.append(([e["samples_seen"] for e in anytime],
                               [100 * sum(e["correct"]) / max(sum(e["total"]), 1) for e in anytime]))
            length = min(len(c[0]) for c in curves)
            x = curves[0][0][:length]
            y = np.mean([c[1][:length] for c in curves], axis=0)
            axis.plot(x, y, label=variant)
        axis.set_title(f"{method} on {dataset}")
        axis.set_xlabel("stream samples")
        axis.set_ylabel("anytime accuracy (%)")
        axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(panels):]:
        axis.axis("off")
    figure.tight_layout()
    path = output / "curves.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


# ------------------------------------------------------------------------------------------ main
def plan(methods: Sequence[str], variants: Sequence[str], datasets: Sequence[str], seeds: Sequence[int]) -> List[RunSpec]:
    specs = []
    for dataset in datasets:
        for seed in seeds:
            for method in methods:
                for variant in (("full",) if method == "flyprompt" else variants):
                    specs.append(RunSpec(method, variant, dataset, seed))
    return specs


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
    for spec in todo:
        if spec.dataset not in data_cache:
            data_cache = {spec.dataset: load_data(spec.dataset, args, preset, protocol)}
        train, test = data_cache[spec.dataset]
        started = time.perf_counter()
        result = run(spec, protocol, train, test, device=device, progress=progress)
        result["wall_seconds"] = time.perf_counter() - started
        result["world_size"] = world
        result["setting"] = settings[spec.dataset]
        if not lead:
            continue
        write_json_atomic(result_path(output, spec), result)
        m = result["metrics"]
        line = (f"{spec.key}: A_auc {100 * m['A_auc']:.2f}  A_last {100 * m['A_last']:.2f}  F_last {100 * m['F_last']:.2f}  "
                f"{result['seconds_per_batch'] * 1000:.1f} ms/batch  peak {result['peak_memory_mb']:.0f} MB  "
                f"({result['wall_seconds']:.0f} s)")
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
