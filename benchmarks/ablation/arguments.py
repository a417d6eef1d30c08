"""The cross-ablation's command line: value types, the protocol flag table and the parser.

Every value is checked when it is parsed (an ``argparse`` type per flag); values that are each valid but do
not fit together are found by :mod:`benchmarks.ablation.sweep` and :mod:`benchmarks.ablation.preflight`.
A flag of the sweep is added in :func:`add_sweep_flags`; a protocol field gets its flag from
:data:`PROTOCOL_FLAGS` (or, without an entry, from its default's type).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from benchmarks.ablation.expert_schedules import EXPERT_SCHEDULES
from benchmarks.ablation.loggers import LOGGERS, parse_loggers
from benchmarks.ablation.logit_masks import TRAIN_MASKS
from benchmarks.ablation.output_layout import SWEEP_OUTPUTS
from benchmarks.ablation.preemption import RESUMABLE_EXIT_CODE
from benchmarks.ablation.shard import parse_shard
from benchmarks.ablation.sweep_values import SWEEP_ALIASES, parser_of
from benchmarks.backbone import BACKBONES
from benchmarks.core.errors import UsageError
from benchmarks.core.method_names import canonical_method
from benchmarks.core.presets import PRESETS
from benchmarks.core.protocol import ROUTER_QUERIES, Protocol
from benchmarks.core.proxy_datasets import PROXY_DATASETS
from benchmarks.core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS
from benchmarks.data.loaders import DATASETS
from benchmarks.flags import Checked, add_output_flag
from benchmarks.methods import list_methods
from benchmarks.studies.command import STUDIES
from benchmarks.studies.router_set import ROUTERS
from fly_modules import AGGREGATION_RULES
from fly_modules._validation import SHARED_PARAMETERS, Constraint, Integer, Real

DESCRIPTION = "Cross-ablation of the analytic router and the temporal ensemble: methods x variants x datasets x seeds."


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

    parse.rules = (Integer(minimum=minimum),)  # what it refuses, for tests/test_parameter_flags.py
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

    parse.rules = (Real(above=low, maximum=high) if open_low else Real(minimum=low, maximum=high),)
    return parse


def _shared(name: str, *, narrower: Optional[Constraint] = None) -> Checked:
    """The type of the flag of a parameter the library shares: checked by the library's rule
    (``SHARED_PARAMETERS[name]``), so the flag refuses what the library refuses, with its message; then by
    ``narrower``, a rule of the benchmarks on top."""
    return Checked(name, SHARED_PARAMETERS[name], *([narrower] if narrower else []))


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


_seeds.rules = (Integer(minimum=0),)  # type: ignore[attr-defined]


def _checkpoint_period(text: str) -> Union[str, int]:
    if text in ("evaluation", "off"):
        return 0 if text == "off" else text
    try:
        return _integer(0)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'evaluation', 'off' or a number of batches >= 0, got {text!r}") from None


_checkpoint_period.rules = (Integer(minimum=0),)  # type: ignore[attr-defined]


def parse_names(text: str) -> List[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def parse_methods(text: str) -> List[str]:
    """Comma-separated methods, each by its name here whichever spelling is given (``coda_prompt``:
    ``coda-prompt``, :data:`~benchmarks.core.method_names.METHOD_ALIASES`); one named twice is refused."""
    spelt = parse_names(text)
    names = [canonical_method(name) for name in spelt]
    for later, name in enumerate(names):
        if names.index(name) != later:
            raise argparse.ArgumentTypeError(f"{spelt[names.index(name)]} and {spelt[later]} both name {name}; "
                                             "name each method once")
    return names


#: Protocol field -> (argparse type or choices, help); a field missing here is parsed by its default's type.
#: The parameters the library shares (``fly_modules._validation.SHARED_PARAMETERS``) are checked by its rules.
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
    "num_experts": (_shared("num_experts", narrower=Integer(minimum=1)),
                    "experts (steps/tasks/prompt groups) per method, at least 1"),
    "lr": (_real(0.0, math.inf, open_low=True), "Adam learning rate (default: the method's, 0.005; 0.003 for "
                                               "HiDe-Prompt/NoRGa)"),
    "expansion_dim": (_shared("expansion_dim"), "router random-expansion width M (0: no expansion, "
                                                          "ridge regression on the query features)"),
    "ridge": (_shared("ridge"), "router ridge lambda > 0, or 'auto' (generalised cross-validation)"),
    "decays": (_shared("decays"), "comma-separated EMA decays of the ensemble, distinct, in (0, 1)"),
    "aggregate": (_shared("aggregate"), "ensemble aggregation rule, one of " + ", ".join(AGGREGATION_RULES)),
    "amp": (_bool, "mixed precision training on CUDA (true/false)"),
    "augment": (_bool, "reference training augmentation (true/false)"),
    "method_kwargs": (_json_object, "JSON object: method name -> constructor keyword arguments"),
    "misa_prompts": (_misa_prompts, "folder with MISA's g_prompt.pt and e_prompt.pt"),
    "router_query": (ROUTER_QUERIES, "router statistics from 'clean' (a frozen fp32 pass over the un-augmented "
                                     "batch, as the official code) or 'first_iteration' (the first online "
                                     "iteration's query pass, one backbone pass fewer)"),
    "expert_schedule": (tuple(EXPERT_SCHEDULES), "when experts start: " + "; ".join(
        f"{name}: {text}" for name, text in EXPERT_SCHEDULES.items())),
    "train_mask": (tuple(TRAIN_MASKS), "training logit mask: " + "; ".join(
        f"{name}: {text}" for name, text in TRAIN_MASKS.items())),
}


def _preset_epilog() -> str:
    width = max(len(name) for name in PRESETS)
    lines = ["presets:"] + [f"  {name:<{width}}  {PRESETS[name]['description']}" for name in PRESETS]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``cross_ablation.py``: the sweep's flags, its cost and jobs, then one flag per protocol field."""
    parser = _Parser(prog="cross_ablation.py", description=DESCRIPTION, epilog=_preset_epilog(),
                     formatter_class=_HelpFormatter)
    add_sweep_flags(parser)
    add_cost_flags(parser.add_argument_group("cost and several jobs (docs/benchmark.md)"))
    add_study_flags(parser.add_argument_group("the paper's other studies (docs/benchmark.md, Studies)"))
    add_protocol_flags(parser.add_argument_group("protocol (each defaults to the preset's value)"))
    return parser


def add_sweep_flags(parser: argparse.ArgumentParser) -> None:
    """What the sweep runs, where its data and results lie, and how it runs on this machine."""
    parser.add_argument("--preset", choices=list(PRESETS), default="proxy-short",
                        help="base settings (listed below); every other flag overrides them")
    parser.add_argument("--methods", type=parse_methods, default=None,
                        help="comma-separated methods (default: the preset's; registered: "
                             + ", ".join(list_methods()) + ")")
    parser.add_argument("--variants", type=parse_names, default=None,
                        help="comma-separated variants, from " + ", ".join((*ABLATION_VARIANTS, *ORACLE_VARIANTS))
                             + " (default: all; FlyPrompt runs the first four as 'full'; one training per "
                               "method and seed scores them all)")
    parser.add_argument("--datasets", type=parse_names, default=None,
                        help="comma-separated datasets, from " + ", ".join([*DATASETS, *PROXY_DATASETS]) +
                             " (the last three: the CPU proxy's generated stand-ins; default: the preset's)")
    parser.add_argument("--seeds", type=_seeds, default=None, help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--data-root", default="data", help="folder holding the datasets")
    parser.add_argument("--download", action="store_true",
                        help="allow network access: CIFAR-100 (torchvision, from cs.toronto.edu) and ImageNet-R "
                             "(imagenet-r.tar, about 2 GB) into --data-root if absent, and the backbone's "
                             "pretrained weights from the Hugging Face hub into its cache. CUB-200 has no "
                             "download. Without this flag nothing leaves the machine")
    parser.add_argument("--synthetic-classes", type=_integer(2), default=None,
                        help="classes of every generated dataset of the sweep (synthetic and the proxy's)")
    parser.add_argument("--synthetic-train-per-class", type=_integer(1), default=None,
                        help="training images per class of every generated dataset")
    parser.add_argument("--synthetic-test-per-class", type=_integer(1), default=None,
                        help="test images per class of every generated dataset")
    add_output_flag(parser, "--output", "folder", default=None, help="output folder (default: results/<preset>)",
                    contents=SWEEP_OUTPUTS)
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
    parser.add_argument("--log", type=parse_loggers, default=None,
                        help="comma-separated dashboards the runs are logged to as they train, from "
                             + ", ".join(LOGGERS) + ", into <output>/logs (default: none); docs/benchmark.md")


def add_cost_flags(group: Any) -> None:
    """``--plan``, ``--shard`` and ``--merge``: the sweep's cost, and its trainings split over several jobs."""
    group.add_argument("--plan", action="store_true",
                       help="train nothing: list the trainings and evaluations, time a short probe of each dataset "
                            "and method on this device and print the estimated device-hours (writes plan.json)")
    group.add_argument("--shard", type=parse_shard, default=None, metavar="K/N",
                       help="run only the K-th of N balanced parts of the trainings (1 <= K <= N), e.g. one task "
                            "of a SLURM job array; --merge makes the tables once all parts have finished")
    group.add_argument("--merge", action="store_true",
                       help="train nothing: make the tables from the results in the output folder (all must exist)")


def add_study_flags(group: Any) -> None:
    """``--study``, ``--routers`` and ``--backbone``: the paper's studies beside the cross-ablation."""
    group.add_argument("--study", choices=list(STUDIES), default=None,
                       help="run one of the paper's studies and write its table beside the paper's numbers: "
                            + "; ".join(f"{name}: {text}" for name, text in STUDIES.items()).replace("%", "%%"))
    group.add_argument("--router", dest="routers", type=parse_names, default=None,
                       help="comma-separated routers scored in the routed variants on the same training, from "
                            + ", ".join(ROUTERS) + " (default: none; --study routers: all)")
    group.add_argument("--aggregations", type=parse_names, default=None,
                       help="comma-separated TE2 aggregation rules scored in the ensemble variants on the same "
                            "training, from " + ", ".join(AGGREGATION_RULES) + " (default: none; --study "
                            "aggregations: all)")
    group.add_argument("--sweep", type=parser_of(PROTOCOL_FLAGS), default=None, metavar="NAME=v1,v2,...",
                       help="train once per value of one protocol setting, each value into <output>/sweep/NAME=value, "
                            "and write sweep_NAME.md/.json/.png with one row per value; NAME is a protocol flag "
                            "(expansion-dim, ridge, decays with '/' inside a value, ...) or one of "
                            + ", ".join(f"{k} ({v})" for k, v in SWEEP_ALIASES.items()))
    group.add_argument("--heads", type=parse_names, default=None,
                       help="comma-separated subsets of the ensemble's heads scored in the ensemble variants on the "
                            "same training: 'online' or decays joined by '/', e.g. online,0.9,0.9/0.99 (default: "
                            "none; --study decays: the paper's six)")
    group.add_argument("--backbone", choices=list(BACKBONES), default=None,
                       help="one of the paper's backbones: its timm model and the paper's ridge (unless --ridge "
                            "is given); weights from --weights or the local cache (a warning where timm's are not "
                            "the paper's: docs/benchmark.md, 'The paper's backbones')")


def add_protocol_flags(group: Any) -> None:
    """One flag per :class:`Protocol` field (``--expansion-dim`` for ``expansion_dim``), from :data:`PROTOCOL_FLAGS`."""
    for item in fields(Protocol):
        kind, text = PROTOCOL_FLAGS.get(item.name, (None, item.name.replace("_", " ")))
        flag = f"--{item.name.replace('_', '-')}"
        if isinstance(kind, tuple):
            group.add_argument(flag, choices=kind, default=None, help=text)
        else:
            group.add_argument(flag, type=kind or _field_parser(item), default=None, help=text)


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




#: the documented entry point (a thin file that runs ``benchmarks.ablation.cli.main``)
_ENTRY_POINT = Path(__file__).resolve().parents[1] / "cross_ablation.py"


def command_line(argv: Optional[Sequence[str]], world: int, *, merge: bool = False) -> str:
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


def protocol_value(name: str, text: str) -> Any:
    """``text`` read as the protocol flag of the field ``name`` reads it (a study's fixed settings)."""
    return PROTOCOL_FLAGS[name][0](text)
