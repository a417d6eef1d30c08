"""What a sweep runs: methods x variants x datasets x seeds on one protocol, resolved from the command line.

:func:`resolve` checks every value against the registries and the environment (methods, datasets, device,
model, weights, data on disk) before any data or model work; :func:`run_setting` is what decides a run's
numbers besides its key.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from benchmarks.ablation.arguments import UsageError
from benchmarks.ablation.expert_schedules import schedule_refusal
from benchmarks.backbone import BACKBONES, check_backbone_available
from benchmarks.core.head_sets import head_set_members
from benchmarks.core.presets import PRESETS
from benchmarks.core.protocol import PAPER_METHODS, Protocol
from benchmarks.core.proxy_datasets import PROXY_DATASETS, is_generated
from benchmarks.core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS
from benchmarks.data.loaders import DATASETS, canonical_dataset_name, check_dataset
from benchmarks.methods import list_methods, method_class
from benchmarks.studies.command import with_backbone
from benchmarks.studies.paper_numbers import compared_backbone
from benchmarks.studies.router_set import ROUTERS


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
    routers: List[str] = field(default_factory=list)  # the routing study's routers (benchmarks.studies)
    study: Optional[str] = None
    aggregations: List[str] = field(default_factory=list)  # the aggregation study's rules
    heads: List[str] = field(default_factory=list)  # the EMA-decay study's subsets of heads (head_sets.py)
    log: List[str] = field(default_factory=list)  # dashboards the runs are logged to (--log, loggers.py)


def resolve(args: argparse.Namespace) -> Sweep:
    """Check every value and the environment (methods, datasets, device, weights, data on disk); raises
    :class:`UsageError`, ``DatasetNotFoundError`` or ``BackboneLoadError`` with one line saying what to do."""
    preset = PRESETS[args.preset]
    changes = {item.name: getattr(args, item.name) for item in fields(Protocol) if getattr(args, item.name) is not None}
    protocol = replace(preset["protocol"], **changes)
    if getattr(args, "backbone", None) is not None:
        if getattr(args, "model", None) is not None:
            raise UsageError(f"--backbone {args.backbone} names the model ({BACKBONES[args.backbone].model}); "
                             "drop --model")
        protocol = with_backbone(protocol, args)
        if protocol.pretrained and protocol.weights is None and BACKBONES[args.backbone].warning(args.backbone):
            print(f"warning: {BACKBONES[args.backbone].warning(args.backbone)}", file=sys.stderr, flush=True)
    _check_compared_backbone(args, protocol)
    methods = args.methods or list(preset.get("methods", PAPER_METHODS))
    known = list_methods()
    _check_names("method", methods, known)
    _check_names("method in --method-kwargs", list(protocol.method_kwargs), known)
    _check_schedule(methods, protocol.expert_schedule)
    bad = [name for name, value in protocol.method_kwargs.items() if not isinstance(value, dict)]
    if bad:
        raise UsageError(f"--method-kwargs: the value of {bad[0]!r} must be a JSON object of keyword arguments")
    variants = args.variants or [*ABLATION_VARIANTS, *ORACLE_VARIANTS]
    _check_names("variant", variants, [*ABLATION_VARIANTS, *ORACLE_VARIANTS])
    datasets = [canonical_dataset_name(d) for d in (args.datasets or preset["datasets"])]
    _check_names("dataset", datasets, [*DATASETS, *PROXY_DATASETS])
    if args.device is not None:
        try:
            device = torch.device(args.device)
        except (RuntimeError, ValueError):
            raise UsageError(f"--device {args.device!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: CUDA is not available on this machine")
    if not timm_has_model(protocol.model):
        raise UsageError(f"--model {protocol.model!r} is not a timm model name")
    if not (args.plan and protocol.weights is None):  # a plan times random weights where pretrained ones are absent
        check_backbone_available(protocol.model, protocol.pretrained, protocol.weights)
    for name in datasets:  # a plan prices a missing dataset by its sizes
        if not is_generated(name) and not args.plan:
            check_dataset(name, args.data_root, download=args.download)
    data = {name: generated_data_settings(name, args, preset) if is_generated(name) else {} for name in datasets}
    return Sweep(
        preset=args.preset, protocol=protocol, methods=methods, variants=variants, datasets=datasets,
        seeds=args.seeds or list(preset["seeds"]), threads=args.threads if args.threads is not None else
        preset["threads"], output=Path(args.output or Path("results") / args.preset), device=args.device, data=data,
        routers=_routers(args), study=getattr(args, "study", None), aggregations=_aggregations(args),
        heads=_heads(args, protocol), log=list(getattr(args, "log", None) or []),
    )


def _check_schedule(methods: Sequence[str], schedule: str) -> None:
    """Before any training: every method can start its experts on ``schedule``."""
    for name in methods:
        refusal = schedule_refusal(method_class(name), schedule)
        if refusal:
            raise UsageError(f"--expert-schedule {schedule}: {refusal}")


def _check_compared_backbone(args: argparse.Namespace, protocol: Protocol) -> None:
    """Before any training: the tables of the studies asked for can name the paper's backbone they compare with."""
    studies = [*(["aggregations"] if _aggregations(args) else []),
               *(["components"] if getattr(args, "study", None) == "components" else [])]
    for study in studies:
        try:
            compared_backbone(study, protocol.to_dict())
        except ValueError as error:
            raise UsageError(f"the {study} study: {error}") from None


def _aggregations(args: argparse.Namespace) -> List[str]:
    """The aggregation study's rules: ``--aggregations``, or all of them for ``--study aggregations``."""
    from fly_modules.ensemble import AGGREGATION_RULES

    study = getattr(args, "study", None) == "aggregations"
    names = getattr(args, "aggregations", None) or (list(AGGREGATION_RULES) if study else [])
    _check_names("aggregation rule", names, list(AGGREGATION_RULES))
    return names


def _heads(args: argparse.Namespace, protocol: Protocol) -> List[str]:
    """The EMA-decay study's subsets of heads (``--heads``), each of decays the run's ensemble has."""
    names = list(getattr(args, "heads", None) or [])
    members = ["online", *(f"ema_{decay:g}" for decay in protocol.decays)]
    for name in names:
        try:
            head_set_members(name, members)
        except ValueError as error:
            raise UsageError(f"--heads: {error}") from None
    return names


def _routers(args: argparse.Namespace) -> List[str]:
    """The routing study's routers: ``--routers``, or all of them for ``--study routers``."""
    names = getattr(args, "routers", None) or (list(ROUTERS) if getattr(args, "study", None) == "routers" else [])
    _check_names("router", names, list(ROUTERS))
    return names


def _check_names(kind: str, given: Sequence[str], known: Sequence[str]) -> None:
    unknown = [name for name in given if name not in known]
    if unknown:
        raise UsageError(f"unknown {kind} {unknown[0]!r}; choose from {', '.join(known)}")


def timm_has_model(name: str) -> bool:
    import timm

    return bool(timm.is_model(name)) or bool(timm.list_models(name.split(".")[0]))


def generated_data_settings(name: str, args: argparse.Namespace, preset: Dict[str, Any]) -> Dict[str, Any]:
    """The generated dataset ``name``'s settings: the preset's (a proxy dataset's own where the preset has
    none), overridden by the command line's ``--synthetic-*`` flags."""
    if name == "synthetic":
        settings = dict(preset.get("synthetic", {}))
    else:
        settings = dict(preset.get("generated", {}).get(name) or PROXY_DATASETS[name].settings())
    for key, flag in (("num_classes", "synthetic_classes"), ("train_per_class", "synthetic_train_per_class"),
                      ("test_per_class", "synthetic_test_per_class")):
        if getattr(args, flag) is not None:
            settings[key] = getattr(args, flag)
    return settings


def run_setting(sweep: Sweep, dataset: str) -> Dict[str, Any]:
    """Everything besides the run's key that decides its numbers: a finished run is reused only when
    its stored setting equals this one (the world size is not part of it: it does not change results)."""
    # Through JSON, so that it compares equal to what a result file stores (tuples become lists).
    setting = {"protocol": sweep.protocol.to_dict(), "data": sweep.data[dataset]}
    for study in ("routers", "aggregations", "heads"):  # only when asked: the cross-ablation's setting stays
        if getattr(sweep, study):
            setting[study] = list(getattr(sweep, study))
    if sweep.study == "cka":  # its runs record what the others do not: a run without it is not reused
        setting["cka"] = True
    return json.loads(json.dumps(setting))
