"""``python -m benchmarks.fidelity``: every reference method trained side by side with the official code."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from benchmarks.speed import reference_checkout as ref

from .comparison import compare_method
from .pairs import PAIRS
from .row import FidelityRow, markdown_table
from .setting import Setting

__all__ = ["main", "parse_args"]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__)
    parser.add_argument("--flygcl", required=True, help="a checkout of AnAppleCore/FlyGCL (read only)")
    parser.add_argument("--methods", nargs="+", choices=sorted(PAIRS), default=list(PAIRS))
    parser.add_argument("--json", type=Path, help="write the rows to this JSON file")
    parser.add_argument("--markdown", type=Path, help="write the table to this Markdown file")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--fused-attention", action="store_true",
                        help="keep timm's fused attention kernel on our side (by default both sides' backbones "
                             "compute attention the same way)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # The official trainers use torch.cuda.amp.autocast, which current torch flags on every call.
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.cuda\.amp")
    pairs = [PAIRS[name] for name in args.methods]
    try:
        checkout = ref.load_checkout(args.flygcl, sorted({pair.official for pair in pairs}))
    except (FileNotFoundError, ValueError) as error:
        print(f"python -m benchmarks.fidelity: {error}", file=sys.stderr)
        return 2
    setting = Setting(explicit_attention=not args.fused_attention)
    rows: List[FidelityRow] = []
    for pair in pairs:
        rows.append(compare_method(checkout, pair, setting))
        print(markdown_table(rows[-1:]).splitlines()[-1], flush=True)
    table = markdown_table(rows)
    print(table)
    if args.json is not None:
        record = {"setting": vars(setting) | {"shape": setting.shape}, "rows": [row.to_dict() for row in rows]}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(table)
    return 0
