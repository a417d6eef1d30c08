"""One harness in its own process: ``python -m benchmarks.upstream.child NAME --checkout DIR --json FILE``.

Run by ``cli.py`` (one process per harness, so one repository's top-level ``models`` / ``utils``
packages never meet another's). Writes the harness's rows and metadata to ``--json``; the upstream
code's own printing is hidden unless ``--verbose``.
"""

from __future__ import annotations

import importlib
import json
import sys
import warnings
from typing import Optional, Sequence

from benchmarks.core.results import write_text_atomic
from benchmarks.flags import Parser, add_common_flag, add_input_flag, add_output_flag


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name")
    add_input_flag(parser, "--checkout", "folder", required=True, help="the checkout the harness runs on")
    add_output_flag(parser, "--json", "file", default=None, required=True, help="where the rows go")
    add_common_flag(parser, "threads", default=1)
    add_common_flag(parser, "seed", default=0)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    sys.dont_write_bytecode = True  # never leave __pycache__ folders in the checkout
    warnings.filterwarnings("ignore")  # the upstream code on a recent torch / timm: deprecation noise only

    import torch

    torch.set_num_threads(args.threads)
    from benchmarks.upstream.checks import Settings
    from benchmarks.upstream.loading import isolated_cwd, no_cuda_sync
    from benchmarks.upstream.registry import checkout_commit

    harness = importlib.import_module(f"benchmarks.upstream.harnesses.{args.name}")
    checkout = args.checkout.resolve()
    commit = checkout_commit(checkout)
    isolated_cwd()
    no_cuda_sync()
    report = harness.run(checkout, Settings(seed=args.seed, verbose=args.verbose))
    result = report.to_dict()
    result["meta"] = dict(upstream_commit=commit, **result["meta"])
    write_text_atomic(args.json, json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
