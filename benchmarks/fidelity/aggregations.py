"""TE2's aggregation rules beside the official trainers' ``_ensemble_logits``
(``python -m benchmarks.fidelity.aggregations --flygcl DIR``).

Each official rule (``--ensemble_method``) is called as the official evaluation calls it, on the masked
member logits ``[online, EMA heads...]``, and compared with ``fly_modules.aggregate_logits`` under the rule
of ours that :data:`OFFICIAL_RULES` names. The members are generated in three cases: under a seen-class
mask (what every evaluation has), without one, and with every logit positive (the only case in which the
official ``min_entropy``'s raw-logit entropy is a number, so that its choice of member is exercised).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor

from benchmarks.core import reference_checkout as ref
from benchmarks.core.method_names import canonical_method
from benchmarks.flags import Parser, add_input_flag
from fly_modules import aggregate_logits, seen_class_mask

from .comparison import checkout_commit

__all__ = ["OFFICIAL_RULES", "TRAINERS", "AggregationRow", "member_cases", "compare_rules", "markdown_table", "main"]

#: the official ``--ensemble_method`` -> the rule of ``fly_modules.AGGREGATION_RULES`` that computes it
OFFICIAL_RULES: Dict[str, str] = {
    "mean": "mean",
    "max_prob": "max_prob",
    "min_entropy": "logit_min_entropy",
    "softmax_mean": "softmax_mean",
    "softmax_max_prob": "softmax_max",
    "softmax_min_entropy": "softmax_min_entropy",
}

#: the official trainers (``reference_checkout.CLASSES`` keys) that define ``_ensemble_logits``
TRAINERS = ("flyprompt", "dualprompt", "mvp", "hide")


@dataclass(frozen=True)
class AggregationRow:
    """One official rule of one trainer on one case of members: whether ours computes the same."""

    trainer: str
    official: str
    ours: str
    case: str
    samples: int
    predictions_equal: int
    same_non_finite: bool
    max_abs_difference: float

    @property
    def agrees(self) -> bool:
        # float32 reductions in the same order: equal but for rounding, far below this bound
        return self.predictions_equal == self.samples and self.same_non_finite and self.max_abs_difference <= 1e-5


def member_cases(samples: int = 256, members: int = 3, classes: int = 10, seed: int = 0) -> Dict[str, Tensor]:
    """Member logits ``(N, H, C)``: ``masked`` (seven seen classes, the rest ``-inf``), ``unmasked`` and
    ``positive`` (every logit in ``(0.05, 5)``)."""
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(samples, members, classes, generator=generator)
    positive = 0.05 + 4.95 * torch.rand(samples, members, classes, generator=generator)
    return {"masked": logits + seen_class_mask(7, classes), "unmasked": logits, "positive": positive}


def _compare(trainer: str, official_rule: str, case: str, official: Tensor, ours: Tensor) -> AggregationRow:
    finite = torch.isfinite(official)
    same = bool(torch.equal(finite, torch.isfinite(ours)))
    difference = (official - ours).abs()[finite & torch.isfinite(ours)]
    return AggregationRow(
        trainer=trainer, official=official_rule, ours=OFFICIAL_RULES[official_rule], case=case,
        samples=official.shape[0], predictions_equal=int((official.argmax(1) == ours.argmax(1)).sum()),
        same_non_finite=same, max_abs_difference=float(difference.max()) if difference.numel() else 0.0,
    )


def compare_rules(trainers: Dict[str, type], cases: Optional[Dict[str, Tensor]] = None) -> List[AggregationRow]:
    """Every official rule of every trainer class (``name -> class``) on every case, beside ours."""
    cases = member_cases() if cases is None else cases
    rows = []
    for name, trainer in trainers.items():
        for official_rule, ours in OFFICIAL_RULES.items():
            # the method reads only self.ensemble_method: called unbound on a holder of that attribute
            holder = types.SimpleNamespace(ensemble_method=official_rule)
            for case, members in cases.items():
                official = trainer._ensemble_logits(holder, list(members.unbind(dim=1)))
                rows.append(_compare(name, official_rule, case, official, aggregate_logits(members, ours)))
    return rows


def markdown_table(rows: Sequence[AggregationRow], commit: str) -> str:
    lines = [f"FlyGCL {commit[:7]}: each official `--ensemble_method` on generated member logits beside "
             "`fly_modules.aggregate_logits`.", "",
             "| trainer | official rule | ours | case | predictions equal | same -inf / NaN | max abs difference | agrees |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.trainer} | {r.official} | {r.ours} | {r.case} | {r.predictions_equal}/{r.samples} | "
              f"{'yes' if r.same_non_finite else 'no'} | {r.max_abs_difference:.2e} | {'yes' if r.agrees else 'NO'} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = Parser(prog="python -m benchmarks.fidelity.aggregations", description=__doc__)
    add_input_flag(parser, "--flygcl", "folder", convert=str, required=True, help="a checkout of AnAppleCore/FlyGCL (read only)")
    parser.add_argument("--methods", nargs="+", type=canonical_method, choices=TRAINERS, default=list(TRAINERS),
                        help="the official trainers whose _ensemble_logits to compare")
    args = parser.parse_args(argv)
    try:
        checkout = ref.load_checkout(args.flygcl, args.methods, flag="--flygcl")
    except (ref.CheckoutError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = compare_rules({name: checkout.trainers[name] for name in args.methods})
    print(markdown_table(rows, checkout_commit(checkout.path)))
    return 0 if all(row.agrees for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
