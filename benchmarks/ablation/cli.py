"""Cross-ablation of the analytic router and the temporal ensemble: methods x variants x datasets x seeds.

    python benchmarks/cross_ablation.py                  # the default: preset proxy-short, < 10 min on 2 cores
    python benchmarks/cross_ablation.py --preset proxy   # the CPU proxy benchmark (docs/proxy.md)
    python benchmarks/cross_ablation.py --preset paper   # the paper's protocol (GPU, real data, ViT-B/16)

Each finished run is written to ``<output>/runs/<dataset>/<method>/<variant>/seed<k>.json`` (atomically),
and rerunning the same command skips finished runs. The table is printed and written as ``table.md``,
``table.csv`` and ``table.json`` with ``curves.png`` and ``deltas.png``; ``<output>`` defaults to
``results/<preset>``. Every value is checked before any data or model work; usage and environment
errors print one line and exit with status 2. A training that fails becomes error rows in the tables and
the sweep goes on (exit status 1). Several sweeps may share one output folder (``claims.py``). Nothing is
downloaded without ``--download``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from benchmarks.ablation import failures, preflight
from benchmarks.ablation.checkpointing import CheckpointError
from benchmarks.ablation.claims import ClaimHeldError, Claims
from benchmarks.ablation.plan import count_work, format_plan, make_plan, training_key
from benchmarks.ablation.preemption import RESUMABLE_EXIT_CODE, RunInterrupted, StopSignals, any_process
from benchmarks.ablation.presets import PRESETS
from benchmarks.ablation.protocol import PAPER_METHODS, ROUTER_QUERIES, Protocol, RunSpec
from benchmarks.ablation.report import add_failures, plot_curves, plot_paper_deltas, summarize_results, write_tables
from benchmarks.ablation.results import (
    ProtocolMismatchError,
    WriteError,
    check_checkpoints,
    check_resumable,
    checkpoints_of,
    load_results,
    plan,
    remove_finished_checkpoints,
    result_path,
    trainings,
    write_json_atomic,
)
from benchmarks.ablation.runner import CheckpointPolicy, run_training
from benchmarks.ablation.shard import PLAN_FILE, parse_shard, plan_costs, split, work_costs
from benchmarks.ablation.variants import ABLATION_VARIANTS, ORACLE_VARIANTS
from benchmarks.backbone import BackboneLoadError, check_backbone_available, downloads_allowed
from benchmarks.data.loaders import DATASETS, canonical_dataset_name, check_dataset
from benchmarks.data.records import DatasetNotFoundError
from benchmarks.methods import list_methods, method_class
from benchmarks.parallel import DataParallel
from fly_modules import AGGREGATION_RULES


# ------------------------------------------------------------------------------------------- CLI
class UsageError(Exception):
    """A command-line value is invalid, or the machine lacks something the sweep needs (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see --help)")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows a default only where there is one (the protocol flags default to the preset's values)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _integer(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def _real(low: float, high: float, *, open_low: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or value > high or (open_low and value == low):
            bound = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"expected a number in {bound}, got {text}")
        return value

    return parse


def _ridge(text: str) -> Union[float, str]:
    return "auto" if text == "auto" else _real(0.0, math.inf, open_low=True)(text)


def _decays(text: str) -> Tuple[float, ...]:
    values = tuple(_real(0.0, 1.0, open_low=True)(v) for v in text.split(","))
    if any(v >= 1.0 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct decays in (0, 1), got {text!r}")
    return values


def _json_object(text: str) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({error.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


def _misa_prompts(text: str) -> str:
    missing = [name for name in ("g_prompt.pt", "e_prompt.pt") if not os.path.isfile(os.path.join(text, name))]
    if missing:
        raise argparse.ArgumentTypeError(f"{text!r} lacks {', '.join(missing)}")
    return text


def _seeds(text: str) -> List[int]:
    seeds = [_integer(0)(s) for s in text.split(",") if s]
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated integers, got {text!r}")
    return seeds


def _checkpoint_period(text: str) -> Union[str, int]:
    if text in ("evaluation", "off"):
        return 0 if text == "off" else text
    try:
        return _integer(0)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'evaluation', 'off' or a number of batches >= 0, got {text!r}") from None


def _names(text: str) -> List[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


#: Protocol field -> (argparse type or choices, help); a field missing here is parsed by its default's type.
PROTOCOL_FLAGS: Dict[str, Tuple[Any, str]] = {
    "model": (str, "timm model name of the backbone"),
    "model_kwargs": (_json_object, "JSON object of extra timm.create_model arguments"),
    "pretrained": (_bool, "load the model's pretrained weights (true/false)"),
    "weights": (_existing_file, "local weight file (.safetensors/.pth/.npz) loaded through timm's pretrained path"),
    "image_size": (_integer(1), "image side fed to the backbone"),
    "batch_size": (_integer(1), "stream batch size B"),
    "online_iter": (_integer(1), "optimizer steps per stream batch"),
    "eval_period": (_integer(1), "anytime evaluation period in samples"),
    "test_batch_size": (_integer(1), "evaluation batch size"),
    "num_sessions": (_integer(1), "Si-Blurry sessions T"),
    "disjoint_ratio": (_real(0.0, 1.0), "r_D, fraction of disjoint classes"),
    "blurry_ratio": (_real(0.0, 1.0), "r_B, fraction of blurry-class samples moved between sessions"),
    "num_experts": (_integer(1), "experts (steps/tasks/prompt groups) per method"),
    "lr": (_real(0.0, math.inf, open_low=True), "Adam learning rate (default: the method's, 0.005; 0.003 for "
                                               "HiDe-Prompt/NoRGa)"),
    "expansion_dim": (_integer(0), "router random-expansion width M (0: no expansion)"),
    "ridge": (_ridge, "router ridge lambda > 0, or 'auto' (generalised cross-validation)"),
    "decays": (_decays, "comma-separated EMA decays of the ensemble, in (0, 1)"),
    "aggregate": (AGGREGATION_RULES, "ensemble aggregation rule"),
    "amp": (_bool, "mixed precision training on CUDA (true/false)"),
    "augment": (_bool, "reference training augmentation (true/false)"),
    "method_kwargs": (_json_object, "JSON object: method name -> constructor keyword arguments"),
    "misa_prompts": (_misa_prompts, "folder with MISA's g_prompt.pt and e_prompt.pt"),
    "router_query": (ROUTER_QUERIES, "router statistics from 'clean' (a frozen fp32 pass over the un-augmented "
                                     "batch, as the official code) or 'first_iteration' (the first online "
                                     "iteration's query pass, one backbone pass fewer)"),
}


def _preset_epilog() -> str:
    width = max(len(name) for name in PRESETS)
    lines = ["presets:"] + [f"  {name:<{width}}  {PRESETS[name]['description']}" for name in PRESETS]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cross_ablation.py", description=__doc__.split("\n\n")[0], epilog=_preset_epilog(), formatter_class=_HelpFormatter)
    parser.add_argument("--preset", choices=list(PRESETS), default="proxy-short",
                        help="base settings (listed below); every other flag overrides them")
    parser.add_argument("--methods", type=_names, default=None,
                        help="comma-separated methods (default: the preset's; registered: "
                             + ", ".join(list_methods()) + ")")
    parser.add_argument("--variants", type=_names, default=None,
                        help="comma-separated variants, from " + ", ".join((*ABLATION_VARIANTS, *ORACLE_VARIANTS))
                             + " (default: all; FlyPrompt runs the first four as 'full'; one training per "
                               "method and seed scores them all)")
    parser.add_argument("--datasets", type=_names, default=None,
                        help="comma-separated datasets, from " + ", ".join(DATASETS) + " (default: the preset's)")
    parser.add_argument("--seeds", type=_seeds, default=None, help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--data-root", default="data", help="folder holding the datasets")
    parser.add_argument("--download", action="store_true",
                        help="allow network access: CIFAR-100 (torchvision, from cs.toronto.edu) and ImageNet-R "
                             "(imagenet-r.tar, about 2 GB) into --data-root if absent, and the backbone's "
                             "pretrained weights from the Hugging Face hub into its cache. CUB-200 has no "
                             "download. Without this flag nothing leaves the machine")
    parser.add_argument("--synthetic-classes", type=_integer(2), default=None, help="classes of the generated dataset")
    parser.add_argument("--synthetic-train-per-class", type=_integer(1), default=None,
                        help="generated training images per class")
    parser.add_argument("--synthetic-test-per-class", type=_integer(1), default=None,
                        help="generated test images per class")
    parser.add_argument("--output", default=None, help="output folder (default: results/<preset>)")
    parser.add_argument("--device", default=None, help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if "
                                                       "available, else cpu)")
    parser.add_argument("--threads", type=_integer(1), default=None,
                        help="torch intra-op threads (default: the preset's)")
    parser.add_argument("--no-resume", action="store_true", help="recompute runs whose result file exists")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--checkpoint-every", type=_checkpoint_period, default="evaluation",
                        help="checkpoint each training after every anytime evaluation ('evaluation'), every N "
                             "stream batches, or never ('off' or 0; SIGTERM/SIGUSR1 still save one before the "
                             f"sweep exits with status {RESUMABLE_EXIT_CODE}); docs/checkpoints.md")
    cost = parser.add_argument_group("cost and several jobs (docs/benchmark.md)")
    cost.add_argument("--plan", action="store_true",
                      help="train nothing: list the trainings and evaluations, time a short probe of each dataset "
                           "and method on this device and print the estimated device-hours (writes plan.json)")
    cost.add_argument("--shard", type=parse_shard, default=None, metavar="K/N",
                      help="run only the K-th of N balanced parts of the trainings (1 <= K <= N), e.g. one task "
                           "of a SLURM job array; --merge makes the tables once all parts have finished")
    cost.add_argument("--merge", action="store_true",
                      help="train nothing: make the tables from the results in the output folder (all must exist)")
    group = parser.add_argument_group("protocol (each defaults to the preset's value)")
    for item in fields(Protocol):
        kind, text = PROTOCOL_FLAGS.get(item.name, (None, item.name.replace("_", " ")))
        flag = f"--{item.name.replace('_', '-')}"
        if isinstance(kind, tuple):
            group.add_argument(flag, choices=kind, default=None, help=text)
        else:
            group.add_argument(flag, type=kind or _field_parser(item), default=None, help=text)
    return parser


def _field_parser(item: Any) -> Callable[[str], Any]:
    """Parser of a protocol field added without a PROTOCOL_FLAGS entry, from its default's type."""
    default = item.default if item.default is not MISSING else None
    if isinstance(default, bool):
        return _bool
    if isinstance(default, int):
        return _integer(0)
    if isinstance(default, float):
        return _real(-math.inf, math.inf)
    return str


@dataclass
class Sweep:
    """Everything a sweep runs, validated before any data or model work."""

    preset: str
    protocol: Protocol
    methods: List[str]
    variants: List[str]
    datasets: List[str]
    seeds: List[int]
    threads: Optional[int]
    output: Path
    device: Optional[str]
    data: Dict[str, Dict[str, Any]]  # dataset -> generated-data settings ({} for real datasets)


def resolve(args: argparse.Namespace) -> Sweep:
    """Check every value and the environment (methods, datasets, device, weights, data on disk); raises
    :class:`UsageError`, ``DatasetNotFoundError`` or ``BackboneLoadError`` with one line saying what to do."""
    preset = PRESETS[args.preset]
    changes = {item.name: getattr(args, item.name) for item in fields(Protocol) if getattr(args, item.name) is not None}
    protocol = replace(preset["protocol"], **changes)
    methods = args.methods or list(preset.get("methods", PAPER_METHODS))
    known = list_methods()
    _check_names("method", methods, known)
    _check_names("method in --method-kwargs", list(protocol.method_kwargs), known)
    bad = [name for name, value in protocol.method_kwargs.items() if not isinstance(value, dict)]
    if bad:
        raise UsageError(f"--method-kwargs: the value of {bad[0]!r} must be a JSON object of keyword arguments")
    variants = args.variants or [*ABLATION_VARIANTS, *ORACLE_VARIANTS]
    _check_names("variant", variants, [*ABLATION_VARIANTS, *ORACLE_VARIANTS])
    datasets = [canonical_dataset_name(d) for d in (args.datasets or preset["datasets"])]
    _check_names("dataset", datasets, list(DATASETS))
    if args.device is not None:
        try:
            device = torch.device(args.device)
        except (RuntimeError, ValueError):
            raise UsageError(f"--device {args.device!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: CUDA is not available on this machine")
    if not timm_has_model(protocol.model):
        raise UsageError(f"--model {protocol.model!r} is not a timm model name")
    check_backbone_available(protocol.model, protocol.pretrained, protocol.weights)
    for name in datasets:
        if name != "synthetic":
            check_dataset(name, args.data_root, download=args.download)
    data = {name: synthetic_settings(args, preset) if name == "synthetic" else {} for name in datasets}
    return Sweep(
        preset=args.preset, protocol=protocol, methods=methods, variants=variants, datasets=datasets,
        seeds=args.seeds or list(preset["seeds"]), threads=args.threads if args.threads is not None else
        preset["threads"], output=Path(args.output or Path("results") / args.preset), device=args.device, data=data,
    )


def _check_names(kind: str, given: Sequence[str], known: Sequence[str]) -> None:
    unknown = [name for name in given if name not in known]
    if unknown:
        raise UsageError(f"unknown {kind} {unknown[0]!r}; choose from {', '.join(known)}")


def timm_has_model(name: str) -> bool:
    import timm

    return bool(timm.is_model(name)) or bool(timm.list_models(name.split(".")[0]))


# ------------------------------------------------------------------------------------------ data
def synthetic_settings(args: argparse.Namespace, preset: Dict[str, Any]) -> Dict[str, Any]:
    """The generated dataset's settings: the preset's, overridden by the command line."""
    settings = dict(preset.get("synthetic", {}))
    for key, flag in (("num_classes", "synthetic_classes"), ("train_per_class", "synthetic_train_per_class"),
                      ("test_per_class", "synthetic_test_per_class")):
        if getattr(args, flag) is not None:
            settings[key] = getattr(args, flag)
    return settings


def load_data(name: str, sweep: Sweep, data_root: str, download: bool):
    from benchmarks import data

    if name == "synthetic":
        settings = sweep.data[name]
        # class_offset: skip the first ids (the proxy's upstream, pretraining classes).
        _, class_ids = data.synthetic_class_split(settings.get("class_offset", 0), settings["num_classes"])
        return data.make_synthetic_train_test(
            class_ids, train_per_class=settings["train_per_class"],
            test_per_class=settings["test_per_class"], seed=0, image_size=sweep.protocol.image_size,
            difficulty=settings.get("difficulty", "standard"),
        )
    return data.load_dataset(name, data_root, image_size=sweep.protocol.image_size, download=download)


def run_setting(sweep: Sweep, dataset: str) -> Dict[str, Any]:
    """Everything besides the run's key that decides its numbers: a finished run is reused only when
    its stored setting equals this one (the world size is not part of it: it does not change results)."""
    # Through JSON, so that it compares equal to what a result file stores (tuples become lists).
    return json.loads(json.dumps({"protocol": sweep.protocol.to_dict(), "data": sweep.data[dataset]}))


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


def execute(
    sweep: Sweep, *, data_root: str, download: bool, resume: bool, show_progress: bool,
    checkpoint_every: Union[str, int] = "evaluation", argv: Optional[Sequence[str]] = None,
    shard: Optional[Tuple[int, int]] = None, merge: bool = False,
) -> int:
    """Run the sweep's missing runs, then write and print the table.

    ``shard=(K, N)`` runs only the K-th of N balanced parts of the trainings and writes no table;
    ``merge`` runs nothing and writes the table once every result exists (``benchmarks.ablation.shard``).

    Each training checkpoints itself every ``checkpoint_every`` and, with ``resume``, continues from its
    last checkpoint. SIGTERM or SIGUSR1 stop the sweep at the next batch boundary after a checkpoint: it
    prints the command that resumes it (``argv``, the same command line) and returns
    ``RESUMABLE_EXIT_CODE``.
    """
    if sweep.threads:
        torch.set_num_threads(sweep.threads)
    specs = plan(sweep.methods, sweep.variants, sweep.datasets, sweep.seeds)
    settings = {name: run_setting(sweep, name) for name in sweep.datasets}
    todo = [s for s in specs if not resume or not result_path(sweep.output, s).exists()]
    if merge and todo:
        raise UsageError(f"--merge: {len(todo)} of {len(specs)} results are missing in {sweep.output} (the first: "
                         f"{todo[0].key}); run the sweep or its --shard jobs first")
    if shard is not None:
        todo = shard_of(sweep, specs, todo, shard, data_root=data_root, download=download)
    groups = trainings(todo)  # one training scores every missing variant of a (dataset, seed, method)
    if resume:
        check_resumable(sweep.output, specs, settings)
        check_checkpoints(sweep.output, groups, settings)
    rank, world, device = _init_distributed(sweep.device)
    parallel = DataParallel.from_process_group()
    lead = rank == 0  # only the first process writes and prints
    if lead:
        sweep.output.mkdir(parents=True, exist_ok=True)
        write_json_atomic(sweep.output / "protocol.json",
                          {"preset": sweep.preset, "protocol": sweep.protocol.to_dict(), "world_size": world})
        if resume:
            remove_finished_checkpoints(sweep.output, specs)
        resumable = sum(bool(checkpoints_of(sweep.output, group).paths()) for group in groups) if resume else 0
        resuming = f"{resumable} training{' resumes' if resumable == 1 else 's resume'} from a checkpoint"
        print(f"{len(specs)} runs, {len(specs) - len(todo)} already finished, {resuming}; results in {sweep.output}",
              flush=True)
        for method in sweep.methods:
            note = method_class(method).protocol_notes(sweep.protocol)
            if note:
                print(f"warning: the {method!r} rows: {note}", file=sys.stderr, flush=True)
    progress = _progress(not show_progress or not lead)
    data_cache: Dict[str, Any] = {}
    outer = progress(total=len(todo), desc="runs") if progress else None
    stopped: Optional[str] = None
    # Other processes may share the output folder: each training is claimed before it starts (claims.py).
    claims = Claims(sweep.output, parallel=parallel, device=device, lead=lead,
                    notify=lambda line: print(line, file=sys.stderr, flush=True))
    unfinished = _unfinished(sweep.output, resume, since=time.time())
    with StopSignals() as stop, claims:
        for group in claims.claimed(groups, unfinished=unfinished, stop=lambda: stop.requested):
            first = group[0]
            if any_process(stop.requested, parallel, device):
                stopped = f"before {first.dataset}/{first.method}/seed{first.seed}"
                break
            if first.dataset not in data_cache:
                data_cache = {first.dataset: load_data(first.dataset, sweep, data_root, download)}
            train, test = data_cache[first.dataset]
            store = checkpoints_of(sweep.output, group)
            checkpointing = CheckpointPolicy(store, checkpoint_every, settings[first.dataset],
                                          stop_requested=lambda: stop.requested, lead=lead,
                                          resume=store.latest_agreed(parallel, device) if resume else None)
            if checkpointing.resume is None and lead:
                store.clear()  # a fresh start: nothing of an earlier training of this key may remain
            # A checkpoint may train more variants than are missing (killed between two result files).
            variants = [spec.variant for spec in group]
            if checkpointing.resume is not None:
                variants = checkpointing.resume["run"]["variants"]
            started = time.perf_counter()
            try:
                records = run_training(first.method, first.dataset, first.seed, variants, sweep.protocol, train,
                                       test, device=device, progress=progress, checkpointing=checkpointing)
            except RunInterrupted as interrupted:
                stopped = str(interrupted)
                break
            except Exception as error:  # one failed training must not lose the others' results
                if not failures.recordable(error, world):
                    raise
                _report_failure(sweep.output, group, error, settings[first.dataset], lead, outer)
                continue
            wall = time.perf_counter() - started
            for spec in group:
                result = records[spec.variant]
                result["wall_seconds"] = wall  # of this process's part of the training shared by the group
                result["world_size"] = world
                result["setting"] = settings[spec.dataset]
                if not lead:
                    continue
                write_json_atomic(result_path(sweep.output, spec), result)
                failures.clear_failures(sweep.output, [spec])
                m = result["metrics"]
                line = (f"{spec.key}: A_auc {100 * m['A_auc']:.2f}  A_last {100 * m['A_last']:.2f}  "
                        f"F_last {100 * m['F_last']:.2f}  {result['seconds_per_batch'] * 1000:.1f} ms/batch  "
                        f"peak {result['peak_memory_mb']:.0f} MB  ({wall:.0f} s, {len(group)} variants)")
                (outer.write if outer else print)(line)
                if outer:
                    outer.update(1)
            if lead:
                store.clear()  # the result files replace the checkpoints
    if stopped is None and stop.requested:  # while waiting for trainings held by other processes
        stopped = "while waiting for trainings that other processes hold"
    if outer:
        outer.close()
    if world > 1:
        import torch.distributed as dist

        dist.barrier()  # torch < 2.8 with gloo can deadlock in destroy_process_group without it
        dist.destroy_process_group()
    if stopped is not None:
        if lead:
            print(f"stopped by {stop.name}: {stopped}\nresume with the same command: {_command(argv, world)}",
                  file=sys.stderr, flush=True)
        return RESUMABLE_EXIT_CODE
    if not lead:
        return 0
    if shard is not None:  # the tables come from --merge once every shard has finished
        failed = failures.load_failures(sweep.output, todo)
        print(f"shard {shard[0]}/{shard[1]} finished; once every shard has: "
              f"{_command(argv, 1, merge=True)}")
        if failed:
            print(f"error: {len(failed)} of this shard's runs failed (tracebacks in "
                  f"{sweep.output / 'failures'}); rerunning the shard trains them again", file=sys.stderr)
            return failures.FAILED_RUNS_EXIT_CODE
        return 0
    with claims.table_lock():  # whoever writes the table last has read every result written before it
        check_resumable(sweep.output, specs, settings)  # a sweep of another setting may share the folder
        results = load_results(sweep.output, specs)
        failed = failures.load_failures(sweep.output, specs)
        rows = add_failures(summarize_results(results), failed)
        markdown = write_tables(sweep.output, rows, caption=PRESETS[sweep.preset]["caption"])
        plot_curves(sweep.output, results)
        plot_paper_deltas(sweep.output, [row for row in rows if row["seeds"]])
    print(markdown)
    if failed:
        print(f"error: {len(failed)} of {len(specs)} runs failed (error rows in the table; tracebacks in "
              f"{sweep.output / 'failures'}); rerunning the command trains them again", file=sys.stderr)
        return failures.FAILED_RUNS_EXIT_CODE
    return 0


def _unfinished(output: Path, resume: bool, since: float) -> Callable[[RunSpec], bool]:
    """Whether a run still needs training: no result file, or (``resume`` off) one older than this sweep."""

    def unfinished(spec: RunSpec) -> bool:
        try:
            written = result_path(output, spec).stat().st_mtime
        except FileNotFoundError:
            return True
        return not resume and written < since

    return unfinished


def _report_failure(output: Path, group: Sequence[RunSpec], error: BaseException, setting: Dict[str, Any],
                    lead: bool, outer: Any) -> None:
    """Print the failed training's traceback and record it (benchmarks/ablation/failures.py)."""
    if not lead:
        return
    import traceback

    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    path = failures.record_failure(output, group, error, setting)
    first = group[0]
    line = (f"{first.dataset}/{first.method}/seed{first.seed} failed ({failures.one_line(error)}); "
            f"{len(group)} run(s) recorded as failed in {path.parent.parent}; the sweep goes on")
    print(line, file=sys.stderr, flush=True)
    if outer:
        outer.update(len(group))


def _device(sweep: Sweep) -> torch.device:
    return torch.device(sweep.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def run_plan(sweep: Sweep, *, data_root: str, download: bool, argv: Optional[Sequence[str]] = None) -> int:
    """``--plan``: count the sweep's work, probe each (dataset, method), print and write ``plan.json``."""
    if sweep.threads:
        torch.set_num_threads(sweep.threads)
    cache: Dict[str, Any] = {}

    def data(name: str) -> Any:
        if name not in cache:
            cache.clear()  # one dataset in memory at a time, as the sweep
            cache[name] = load_data(name, sweep, data_root, download)
        return cache[name]

    specs = plan(sweep.methods, sweep.variants, sweep.datasets, sweep.seeds)
    document = make_plan(specs, sweep.protocol, data, device=_device(sweep),
                         protocol_record=run_setting(sweep, sweep.datasets[0])["protocol"],
                         command=list(sys.argv[1:] if argv is None else argv),
                         log=lambda line: print(line, file=sys.stderr, flush=True))
    sweep.output.mkdir(parents=True, exist_ok=True)
    write_json_atomic(sweep.output / PLAN_FILE, document)
    print(format_plan(document))
    print(f"written: {sweep.output / PLAN_FILE}")
    return 0


def shard_of(sweep: Sweep, specs: List[RunSpec], todo: List[RunSpec], shard: Tuple[int, int], *, data_root: str,
             download: bool) -> List[RunSpec]:
    """The runs of ``todo`` that belong to the K-th of N parts of the sweep's trainings."""
    keys = [training_key(g[0].dataset, g[0].method, g[0].seed) for g in trainings(specs)]
    try:
        costs = plan_costs(sweep.output, keys, run_setting(sweep, sweep.datasets[0])["protocol"])
    except ValueError as error:
        raise UsageError(f"--shard: {error}") from None
    basis = "the estimates of plan.json"
    if costs is None:
        loaded: Dict[str, Any] = {}
        work = count_work(specs, sweep.protocol,
                          lambda name: loaded.setdefault(name, load_data(name, sweep, data_root, download)))
        costs = work_costs(work, sweep.protocol.online_iter, sweep.protocol.batch_size)
        basis = "counted work (no plan.json: run --plan first to balance by measured estimates)"
    mine = set(split(keys, costs, shard[1])[shard[0] - 1])
    print(f"shard {shard[0]}/{shard[1]}: {len(mine)} of {len(keys)} trainings, balanced by {basis}", flush=True)
    return [s for s in todo if training_key(s.dataset, s.method, s.seed) in mine]


#: the documented entry point (a thin file that runs :func:`main`)
_ENTRY_POINT = Path(__file__).resolve().parents[1] / "cross_ablation.py"


def _command(argv: Optional[Sequence[str]], world: int, *, merge: bool = False) -> str:
    """This sweep's command line (under torchrun: with the number of processes per node); with
    ``merge``, the command that makes its tables (``--shard`` replaced by ``--merge``)."""
    script = os.path.relpath(_ENTRY_POINT)
    args = list(sys.argv[1:] if argv is None else argv)
    if merge:
        args = [a for i, a in enumerate(args) if a != "--shard" and (i == 0 or args[i - 1] != "--shard")
                and not a.startswith("--shard=")] + ["--merge"]
    if world > 1:
        return f"torchrun --nproc_per_node {os.environ.get('LOCAL_WORLD_SIZE', world)} {shlex.join([script, *args])}"
    return shlex.join([sys.executable, script, *args])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns the exit status (2 with one line on stderr for usage and environment errors)."""
    try:
        args = build_parser().parse_args(argv)
        sweep = resolve(args)
        if sum((args.plan, args.shard is not None, args.merge)) > 1:
            raise UsageError("--plan, --shard and --merge exclude each other (see --help)")
        preflight.check(sweep)
        with downloads_allowed(args.download):
            if args.plan:
                return run_plan(sweep, data_root=args.data_root, download=args.download, argv=argv)
            return execute(sweep, data_root=args.data_root, download=args.download, resume=not args.no_resume,
                           show_progress=not args.no_progress, checkpoint_every=args.checkpoint_every, argv=argv,
                           shard=args.shard, merge=args.merge)
    except (UsageError, preflight.PreflightError, DatasetNotFoundError, BackboneLoadError, ProtocolMismatchError,
            CheckpointError, WriteError, ClaimHeldError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
