"""``python -m benchmarks.fidelity``: every reference method trained side by side with the official code."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import List, Optional, Sequence

import torch

from benchmarks.core import reference_checkout as ref
from benchmarks.core.method_names import canonical_method
from benchmarks.core.results import write_text_atomic
from benchmarks.flags import Parser, add_common_flag, add_input_flag, add_output_flag

from .comparison import compare_method
from .loop import load_loop_checkout, loop_record, run_loops
from .loop import markdown_table as loop_table
from .loop_comparison import LOOP_METHODS
from .misa_checkout import load_misa
from .misa_comparison import MISA_ROWS, compare_misa, misa_setting
from .pairs import PAIRS
from .row import FidelityRow, markdown_table
from .setting import Setting

__all__ = ["main", "parse_args"]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = Parser(prog="python -m benchmarks.fidelity", description=__doc__)
    add_input_flag(parser, "--flygcl", "folder", convert=str, help="a checkout of AnAppleCore/FlyGCL (read only)")
    add_input_flag(parser, "--misa", "folder", convert=str, help="a checkout of kangzhiq/MISA (read only): the misa rows against its own code")
    parser.add_argument("--misa-vit", choices=("base-16px", "micro"), default="base-16px",
                        help="the MISA rows' backbone (default ViT-B/16 on 16 x 16 images, the shipped prompts' width)")
    parser.add_argument("--methods", nargs="+", type=canonical_method, choices=sorted(PAIRS), default=list(PAIRS))
    parser.add_argument("--loop", action="store_true",
                        help="also run FlyGCL's own online loop against the runner for the methods it covers "
                             "(python -m benchmarks.fidelity.loop): its table after the side-by-side one")
    add_output_flag(parser, "--json", "file", default=None, help="write the rows to this JSON file")
    add_output_flag(parser, "--markdown", "file", default=None, help="write the table to this Markdown file")
    add_common_flag(parser, "threads", default=1, help="torch threads")
    parser.add_argument("--fused-attention", action="store_true",
                        help="keep timm's fused attention kernel on our side (by default both sides' backbones "
                             "compute attention the same way)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # The official trainers use torch.cuda.amp.autocast, which current torch flags on every call.
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.cuda\.amp")
    pairs = [PAIRS[name] for name in args.methods] if args.flygcl else []
    try:
        if args.flygcl is None and args.misa is None:
            raise ValueError("nothing to compare: name a checkout with --flygcl, --misa or both")
        if args.loop and args.flygcl is None:
            raise ValueError("--loop runs FlyGCL's loop: name its checkout with --flygcl")
        checkout = ref.load_checkout(args.flygcl, sorted({p.official for p in pairs}), flag="--flygcl") if pairs else None
        misa = load_misa(args.misa) if args.misa else None
        looped = [name for name in args.methods if name in LOOP_METHODS] if args.loop else []
        loop_checkout = load_loop_checkout(args.flygcl, looped) if looped else None
    except (ref.CheckoutError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    setting = Setting(explicit_attention=not args.fused_attention)
    rows: List[FidelityRow] = []
    for pair in pairs:
        rows.append(compare_method(checkout, pair, setting))
        print(markdown_table(rows[-1:]).splitlines()[-1], flush=True)
    settings = {"setting": vars(setting) | {"shape": setting.shape}} if pairs else {}
    if misa is not None:
        misa_options = misa_setting(misa, vit=args.misa_vit, explicit_attention=not args.fused_attention)
        for row in MISA_ROWS.values():
            rows.append(compare_misa(misa, row, misa_options))
            print(markdown_table(rows[-1:]).splitlines()[-1], flush=True)
        # the checkout's own folder, not this machine's path to it
        shipped = "<--misa>/pretrained_prompt" if misa_options.misa_prompts else None
        settings["misa_setting"] = vars(misa_options) | {"shape": misa_options.shape, "misa_prompts": shipped}
    table = markdown_table(rows)
    if loop_checkout is not None:
        loop_setting, loop_rows = run_loops(loop_checkout, looped)
        settings["loop"] = loop_record(loop_setting, loop_rows)
        table += "\nThe official online loop against the runner:\n\n" + loop_table(loop_rows)
    print(table)
    if args.json is not None:
        record = {**settings, "rows": [row.to_dict() for row in rows]}
        write_text_atomic(args.json, json.dumps(record, indent=2) + "\n")
    if args.markdown is not None:
        write_text_atomic(args.markdown, table)
    return 0
