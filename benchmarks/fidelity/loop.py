"""``python -m benchmarks.fidelity.loop``: the official trainer's own online loop (FlyGCL's ``main.py``:
its stream, evaluation points and summary metrics) against the cross-ablation's runner, method by
method, on the fidelity setting (docs/verification.md)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import List, Optional, Sequence, Tuple

import torch

from benchmarks.core import reference_checkout as ref
from benchmarks.core.method_names import canonical_method
from benchmarks.core.results import write_text_atomic
from benchmarks.flags import Parser, add_common_flag, add_input_flag, add_output_flag

from .loop_comparison import LOOP_METHODS, LOOP_SETUPS, LoopRow, compare_loop
from .official_loop import missing_loop_files
from .pairs import PAIRS
from .setting import Setting

__all__ = ["main", "markdown_table", "parse_args", "load_loop_checkout", "run_loops", "loop_record"]

_COLUMNS = (
    "method", "official trainer (commit)", "stream (batches)", "evaluation points (anytime + session ends)",
    "accuracies: largest difference", "A_auc ours / official", "A_last ours / official", "A_avg ours / official",
    "F_last ours - official (float32 per-class)", "BWT ours - official (float32 per-class)",
    "trained tensors: relative difference",
)


def _percent(row: LoopRow, ours: str, official: str) -> str:
    return f"{100 * row.our_metrics[ours]:.2f} / {100 * row.official_metrics[official]:.2f}"


def _difference(row: LoopRow, ours: str, official: str) -> str:
    plain = row.our_metrics[ours] - row.official_metrics[official]
    rounded = row.our_float32[ours] - row.official_metrics[official]
    return f"{plain:.1e} ({rounded:.1e})"


def _cells(row: LoopRow) -> List[str]:
    anytime = sum(point.kind == "anytime" for point in row.official_points)
    ends = len(row.official_points) - anytime
    points = f"{anytime} + {ends}, " + ("equal" if row.points_equal else f"differ (ours {len(row.our_points)})")
    return [
        row.method, f"{row.official} ({row.commit[:7]})", f"{row.stream} ({row.batches})", points,
        f"{row.accuracy_difference:.1e}", _percent(row, "A_auc", "A_auc"), _percent(row, "A_last", "A_last"),
        _percent(row, "A_avg", "A_avg"), _difference(row, "F_last", "F_last"), _difference(row, "BWT", "BWT_last"),
        f"{row.weights_relative:.1e}",
    ]


def markdown_table(rows: Sequence[LoopRow]) -> str:
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(prog="python -m benchmarks.fidelity.loop", description=__doc__)
    add_input_flag(parser, "--flygcl", "folder", convert=str, required=True, help="a checkout of AnAppleCore/FlyGCL (read only)")
    parser.add_argument("--methods", nargs="+", type=canonical_method, choices=LOOP_METHODS, default=list(LOOP_METHODS))
    add_output_flag(parser, "--json", "file", default=None,
                    help="write the rows, every evaluation included, to this JSON file")
    add_output_flag(parser, "--markdown", "file", default=None, help="write the table to this Markdown file")
    add_common_flag(parser, "threads", default=1, help="torch threads")
    return parser.parse_args(argv)


def load_loop_checkout(flygcl: str, methods: Sequence[str]) -> ref.Checkout:
    """The FlyGCL checkout at ``flygcl`` with the official models of ``methods`` and its loop's files; raises
    :class:`~benchmarks.core.reference_checkout.CheckoutError` / ``ValueError`` for one that cannot run the loop."""
    checkout = ref.load_checkout(flygcl, sorted({PAIRS[name].official for name in methods}), flag="--flygcl")
    if missing := missing_loop_files(checkout.path):
        raise ref.CheckoutError("--flygcl", flygcl, ref.FLYGCL, f"missing {', '.join(missing)}")
    return checkout


def run_loops(checkout: ref.Checkout, methods: Sequence[str]) -> Tuple[Setting, List[LoopRow]]:
    """Each of ``methods`` through the checkout's official loop and through the runner; a row each (printed as
    it ends)."""
    setting = Setting()
    rows: List[LoopRow] = []
    for name in methods:
        rows.append(compare_loop(checkout, PAIRS[name], setting, LOOP_SETUPS[name]))
        print(markdown_table(rows[-1:]).splitlines()[-1], flush=True)
    return setting, rows


def loop_record(setting: Setting, rows: Sequence[LoopRow]) -> dict:
    """The JSON record of a comparison: its setting and every row, every evaluation included."""
    return {"setting": vars(setting) | {"shape": setting.shape}, "rows": [row.to_dict() for row in rows]}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # The official trainers use torch.cuda.amp, which current torch flags on every call.
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.cuda\.amp")
    try:
        checkout = load_loop_checkout(args.flygcl, args.methods)
    except (ref.CheckoutError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    setting, rows = run_loops(checkout, args.methods)
    table = markdown_table(rows)
    print(table)
    if args.json is not None:
        write_text_atomic(args.json, json.dumps(loop_record(setting, rows), indent=2) + "\n")
    if args.markdown is not None:
        write_text_atomic(args.markdown, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
