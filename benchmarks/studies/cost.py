"""The cost table (the paper's ``method_cost_extended``): total and trainable parameters of every method
at the paper's configuration (a randomly initialised ViT-B/16, 100 classes; nothing is downloaded), and,
from a sweep's result files and plan, BWT and seconds per batch, each beside the paper's number: training
seconds per stream batch as the runs measured them, inference seconds per test batch from the probe of
``plan.json`` (``cross_ablation.py --plan`` into the same folder): a query pass and one prompted pass of
each of ``test_batch_size`` images, as the official code evaluates one variant.

Parameters are counted as the official code counts them (``sum(p.numel() for p in model.parameters())``,
and those with ``requires_grad``); buffers (the router's random matrix and statistics, the EMA copies
of the heads in this implementation) are listed apart. docs/methods.md ("Parameter counts") explains
each difference from the paper.

    python -m benchmarks.studies.cost [--results DIR] [--output DIR]
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from benchmarks.flags import Parser, add_input_flag, add_output_flag

from ..core.errors import UsageError
from ..core.method_names import canonical_method
from ..core.plan_file import PLAN_FILE, inference_per_image, read_plan
from ..core.results import read_result
from .paper_numbers import COST
from .study_tables import table_cell

__all__ = ["count_parameters", "cost_rows", "format_cost", "main"]

METHODS = ("l2p", "dualprompt", "mvp", "misa", "hide", "norga", "hide-lora", "hide-adapter", "sd-lora", "flyprompt",
           "linear-probe", "ranpac", "seq-ft", "seq-ft-sl", "coda-prompt", "s-prompt")


def count_parameters(model: torch.nn.Module) -> Dict[str, float]:
    """Millions of parameters (all, trainable) and of buffers (persistent or not) of ``model``."""
    return {
        "total": sum(p.numel() for p in model.parameters()) / 1e6,
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6,
        "buffers": sum(b.numel() for b in model.buffers()) / 1e6,
    }


def method_parameters(method: str, num_classes: int = 100) -> Dict[str, float]:
    """:func:`count_parameters` of ``method`` at the paper's configuration, random ViT-B/16 weights."""
    from ..backbone import backbone_of
    from ..core.presets import PRESETS
    from ..methods import method_class

    protocol = replace(PRESETS["paper"]["protocol"], pretrained=False, weights=None)
    torch.manual_seed(0)
    model = method_class(method).from_protocol(backbone_of(protocol), num_classes, protocol, seed=0)
    return count_parameters(model)


def _measured(results: Optional[Path], method: str) -> Dict[str, Optional[float]]:
    """BWT (percent, paper definition) and training seconds per batch, seed means of the method's
    published variant (``baseline``; FlyPrompt: ``full``) in a sweep's result folder."""
    variant = "full" if method == "flyprompt" else "baseline"
    files = sorted(results.glob(f"runs/*/{method}/{variant}/seed*.json")) if results else []
    records = [read_result(path) for path in files]
    if not records:
        return {"BWT": None, "train_s": None, "seeds": 0}
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    return {"BWT": 100 * mean([r["metrics_paper"]["BWT"] for r in records]),
            "train_s": mean([r["seconds_per_batch"] for r in records]), "seeds": len(records)}


def _inference(results: Optional[Path], method: str) -> Dict[str, Any]:
    """Inference seconds per test batch of ``method`` from the probes of the sweep's ``plan.json`` (CIFAR-100's,
    the paper's dataset, where the plan probed it), and what they were measured on."""

    path = results / PLAN_FILE if results else None
    if path is None or not path.is_file():
        return {"infer_s": None, "infer_on": None}
    document = read_plan(path)
    probes = sorted((p for p in document["probes"] if p["method"] == method), key=lambda p: p["dataset"] != "cifar100")
    if not probes:
        return {"infer_s": None, "infer_on": None}
    batch = document["protocol"]["test_batch_size"]
    return {"infer_s": batch * inference_per_image(probes[0]),
            "infer_on": f"{probes[0]['dataset']}, {batch} images, {probes[0]['device']}"}


def cost_rows(methods: Sequence[str] = METHODS, results: Optional[Path] = None) -> List[Dict[str, Any]]:
    """One row per method: our counts and measurements beside the paper's (none for a method its cost table
    has not: the linear probe, RanPAC†, Seq FT)."""
    measured = {method: _measured(results, method) for method in methods}  # the files read before any model is built
    rows = []
    for method in methods:
        paper = dict(zip(("A_auc", "BWT", "total", "trainable", "train_s", "infer_s"), COST.get(method, ())))
        rows.append({"method": method, **method_parameters(method), **measured[method],
                     **_inference(results, method), "paper": paper})
    return rows


def format_cost(rows: Sequence[Dict[str, Any]]) -> str:
    """Markdown: ours / the paper's, per column."""
    lines = ["| method | total params (M) | paper | trainable (M) | paper | buffers (M) | BWT (%) | paper "
             "| train s/batch | paper | infer s/batch | paper | seeds |", "|" + "---|" * 13]
    for row in rows:
        paper = row["paper"]
        lines.append(
            f"| {row['method']} | {row['total']:.2f} | {table_cell(paper.get('total'), 1)} | {row['trainable']:.2f} "
            f"| {table_cell(paper.get('trainable'), 1)} | {row['buffers']:.2f} | {table_cell(row['BWT'], 1)} | {table_cell(paper.get('BWT'), 1)} "
            f"| {table_cell(row['train_s'], 1, 3)} | {table_cell(paper.get('train_s'), 1)} | {table_cell(row.get('infer_s'), 1, 3)} "
            f"| {table_cell(paper.get('infer_s'), 1)} | {row['seeds']} |"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.cost", description=__doc__.split("\n\n")[0])
    add_input_flag(parser, "--results", "folder", default=None,
                        help="a sweep's output folder: BWT and training seconds per batch from its result files, "
                             "inference seconds per test batch from its plan.json (run --plan into it)")
    add_output_flag(parser, "--output", "folder", default="results/cost", help="folder of cost.md / cost.json",
                    contents={"cost.md": "file", "cost.json": "file"})
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods")
    args = parser.parse_args(argv)
    methods = [canonical_method(m) for m in args.methods.split(",") if m.strip()]
    if not methods or any(m not in METHODS for m in methods):
        parser.error(f"--methods: expected names from {', '.join(METHODS)}, found {args.methods!r}")
    try:
        rows = cost_rows(methods, args.results)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = format_cost(rows)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "cost.md").write_text(text + "\n")
    (args.output / "cost.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(text)
    print(f"written: {args.output / 'cost.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
