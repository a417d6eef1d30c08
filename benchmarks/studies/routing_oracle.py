"""Routing accuracy and the oracle (the paper's Fig. 2b and 2c), read from a sweep's run files: no training.

Fig. 2b: each method's own selection accuracy at the end of the stream, as the paper counts it (right when
the selected expert is one of those that trained the sample's class: the ``any`` version of
docs/diagnostics.md), beside REAR's on the same training ("RP", random projection) and chance. Fig. 2c:
A_last with the test-time oracle giving the true expert (``oracle``; FlyPrompt, whose head is its ensemble:
``oracle_both``) beside the method as published (``baseline``; FlyPrompt: ``full``). The paper prints no
number for either figure (they are images), so the table has no paper column.

    python -m benchmarks.studies.routing_oracle --results DIR [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from benchmarks.flags import Parser, add_input_flag, add_output_flag

from ..core.errors import UsageError
from ..core.files import save_figure
from ..core.method_names import METHOD_NAMES, METHOD_ORDER
from ..core.results import load_results
from .study_figures import pyplot_or_none
from .study_tables import seed_mean, table_cell

__all__ = ["STUDY_METHODS", "STUDY_VARIANTS", "ROUTING_VERSION", "routing_rows", "format_routing", "write_routing",
           "main"]

#: the methods with explicit expert routing the paper's figure shows
STUDY_METHODS = ("dualprompt", "mvp", "misa", "flyprompt")
#: REAR's routing is in every record of a routable method (it is trained beside it): no routed variant needed
STUDY_VARIANTS = ("baseline", "oracle", "oracle_both")
#: the paper's rule: a selection is right when the expert trained the class (docs/diagnostics.md, ``any``)
ROUTING_VERSION = "any"
#: (published, oracle) variant of a method: FlyPrompt's head is its ensemble
_PAIRS = {"flyprompt": ("full", "oracle_both")}


def _finite(value: Optional[float]) -> Optional[float]:
    return None if value is None or math.isnan(value) else value


def _routing(records: Sequence[Dict[str, Any]], who: str) -> Optional[float]:
    values = [((r.get("diagnostics") or {}).get("routing") or {}).get(who, {}).get(ROUTING_VERSION, {}).get("last")
              for r in records]
    return seed_mean([_finite(v) for v in values])


def routes(method: str) -> bool:
    """Whether ``method`` selects an expert per sample (not so: SD-LoRA, every expert for every sample; the
    linear probe and the RanPACs, one expert): only those have a routing accuracy to draw."""
    from ..methods import list_methods, method_class

    return method in list_methods() and not method_class(method).router_refusal


def routing_rows(results: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (dataset, method that :func:`routes`) that has its published variant: routing accuracies
    (own, REAR, chance) and A_last as published and under the oracle, seed means (fractions); the paper's
    method order."""
    runs: Dict[tuple, List[Dict[str, Any]]] = {}
    for result in results:
        spec = result["spec"]
        runs.setdefault((spec["dataset"], spec["method"], spec["variant"]), []).append(result)
    rows = []
    for dataset in dict.fromkeys(key[0] for key in runs):
        methods = [key[1] for key in runs if key[0] == dataset and routes(key[1])]
        for method in sorted(set(methods), key=lambda m: (METHOD_ORDER.get(m, len(METHOD_ORDER)), m)):
            published, oracle = _PAIRS.get(method, ("baseline", "oracle"))
            records = runs.get((dataset, method, published), [])
            if not records:
                continue
            oracles = runs.get((dataset, method, oracle), [])
            rows.append({
                "dataset": dataset, "method": method, "name": METHOD_NAMES.get(method, method), "seeds": len(records),
                "published_variant": published, "oracle_variant": oracle, "oracle_seeds": len(oracles),
                "routing_own": _routing(records, "own"), "routing_rear": _routing(records, "rear"),
                "routing_chance": _routing(records, "chance"),
                "A_last": seed_mean([r["metrics"]["A_last"] for r in records]),
                "A_last_oracle": seed_mean([r["metrics"]["A_last"] for r in oracles]),
            })
    return rows


def format_routing(rows: Sequence[Dict[str, Any]]) -> str:
    """Markdown, percent: Fig. 2b's routing accuracies and Fig. 2c's A_last with the oracle."""
    lines = ["Routing accuracy (%) at the end of the stream: the selected expert trained the sample's class (the "
             "paper's rule). RP: REAR on the same training. A_last (%) as published and with the test-time oracle "
             "(FlyPrompt: full and oracle_both). Means over seeds.", "",
             "| dataset | method | seeds | own selection | RP (REAR) | chance | A_last | A_last, oracle | oracle gain |",
             "|" + "---|" * 9]
    for r in rows:
        gain = None if r["A_last_oracle"] is None else r["A_last_oracle"] - r["A_last"]
        lines.append(f"| {r['dataset']} | {r['name']} | {r['seeds']} | {table_cell(r['routing_own'])} | "
                     f"{table_cell(r['routing_rear'])} | {table_cell(r['routing_chance'])} | {table_cell(r['A_last'])} | "
                     f"{table_cell(r['A_last_oracle'])} | {table_cell(gain)} |")
    return "\n".join(lines)


def _grouped_bars(axis: Any, rows: Sequence[Dict[str, Any]], series: Sequence[tuple], ylabel: str) -> None:
    """One group of bars per (dataset, method); one bar per (key, label) of ``series``, in percent."""
    x = np.arange(len(rows))
    width = 0.8 / len(series)
    for i, (key, label) in enumerate(series):
        values = [np.nan if r[key] is None else 100 * r[key] for r in rows]
        axis.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label)
    axis.set_xticks(x, [f"{r['name']}\n{r['dataset']}" for r in rows], fontsize=7)
    axis.set_ylabel(ylabel)
    axis.legend(fontsize=7)


def plot_routing(output: Path, rows: Sequence[Dict[str, Any]]) -> Optional[Path]:
    """``study_routing.png``: (b) routing accuracy, own and RP; (c) A_last as published and with the oracle."""
    if not rows:
        return None
    plt = pyplot_or_none("study_routing.png")
    if plt is None:
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(rows)), 3.8))
    _grouped_bars(left, rows, (("routing_own", "own selection"), ("routing_rear", "+ RP (REAR)"),
                               ("routing_chance", "chance")), "routing accuracy (%)")
    left.set_title("(b) prompt router accuracy", fontsize=9)
    _grouped_bars(right, rows, (("A_last", "as published"), ("A_last_oracle", "oracle router")), "A_last (%)")
    right.set_title("(c) accuracy with oracle router", fontsize=9)
    figure.tight_layout()
    path = output / "study_routing.png"
    save_figure(figure, path)
    plt.close(figure)
    return path


def write_routing(output: Path, results: Iterable[Dict[str, Any]]) -> str:
    """Write ``study_routing.md``, ``.json`` and ``.png`` into ``output``; returns the markdown."""
    rows = routing_rows(results)
    text = format_routing(rows)
    output.mkdir(parents=True, exist_ok=True)
    (output / "study_routing.md").write_text(text + "\n")
    (output / "study_routing.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot_routing(output, rows)
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.routing_oracle",
                                     description=__doc__.split("\n\n")[0])
    add_input_flag(parser, "--results", "folder", required=True, help="a sweep's output folder (its runs/)")
    output = add_output_flag(parser, "--output", "folder", default=None, help="where to write (default: --results)",
                             contents={f"study_routing.{suffix}": "file" for suffix in ("md", "json", "png")})
    args = parser.parse_args(argv)
    if not (args.results / "runs").is_dir():
        parser.error(f"--results: {args.results} has no runs/ folder (the output folder of a sweep)")
    if args.output is None:  # written into --results: the output rule, for that folder too
        try:
            output.type(str(args.results))
        except argparse.ArgumentTypeError as error:
            parser.error(f"--results (where --output defaults to): {error}")
    try:
        results = load_results(args.results)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(write_routing(args.output or args.results, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
