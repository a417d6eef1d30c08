"""``python -m benchmarks.fidelity.misa_fam --misa PATH``: the forgetting-aware update of MISA's prompt
adaptation (``benchmarks.methods.misa_adaptation.ForgettingAwareStep``) side by side with ``optim/fam.py`` of a
kangzhiq/MISA checkout (its ``FAM`` around Adam, ``first_step`` after the held-out batch's backward,
``second_step`` after the training batch's), on a small network from the same initial weights and batches
(docs/methods.md, "MISA's pretrained prompts on the proxy"). Prints the largest parameter difference;
exit status 1 when it is not 0."""

from __future__ import annotations

import importlib.util
import sys
from functools import partial
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from benchmarks.core.reference_checkout import CheckoutError
from benchmarks.fidelity.misa_checkout import MISA
from benchmarks.flags import Parser, add_flag, add_input_flag
from benchmarks.methods.misa_adaptation import ForgettingAwareStep
from fly_modules._validation import Integer

__all__ = ["load_fam", "largest_difference", "main"]


def load_fam(checkout: Path) -> type:
    """The checkout's ``optim.fam.FAM`` class, imported from its file (it imports torch only)."""
    path = Path(checkout) / "optim" / "fam.py"
    if not path.is_file():
        raise CheckoutError("--misa", checkout, MISA, "missing optim/fam.py")
    spec = importlib.util.spec_from_file_location("_misa_optim_fam", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FAM


def _network() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _loss(network: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(network(x), y)


def largest_difference(fam_class: type, *, updates: int = 20, lr: float = 5e-3, rho: float = 0.1) -> float:
    """Largest absolute parameter difference after ``updates`` updates of each side."""
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(6, 8, generator=generator), torch.randint(0, 4, (6,), generator=generator))
               for _ in range(2 * updates)]
    official, ours = _network(), _network()
    fam = fam_class(official.parameters(), torch.optim.Adam, rho=rho, lr=lr, weight_decay=0)
    step = ForgettingAwareStep(list(ours.parameters()), torch.optim.Adam(ours.parameters(), lr=lr, weight_decay=0),
                               rho=rho)
    for (held_x, held_y), (x, y) in zip(batches[::2], batches[1::2]):
        F.cross_entropy(official(held_x), held_y).backward()
        fam.first_step(zero_grad=True)
        F.cross_entropy(official(x), y).backward()
        fam.second_step(zero_grad=True)
        step.step(partial(_loss, ours, held_x, held_y), partial(_loss, ours, x, y))
    return max(float((a - b).detach().abs().max()) for a, b in zip(official.parameters(), ours.parameters()))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    add_input_flag(parser, "--misa", "folder", required=True, help="a checkout of kangzhiq/MISA (read only)")
    add_flag(parser, "--updates", Integer(minimum=1), default=20, help="forgetting-aware updates compared")
    args = parser.parse_args(argv)
    try:
        fam_class = load_fam(args.misa)
    except CheckoutError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    difference = largest_difference(fam_class, updates=args.updates)
    print(f"forgetting-aware update against {args.misa / 'optim' / 'fam.py'}: {args.updates} updates, "
          f"largest parameter difference {difference:.1e}")
    return 0 if difference == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
