"""How far two float64 ridge solutions of one system may differ: rounding, not digits.

Two backward-stable solves of ``(G + ridge I) x = Q`` (another solver, fold order, torch or CPU) agree to
about ``cond * eps64`` relative to ``max |x|``; elementwise digits of small entries depend on the rounding.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["assert_same_solution"]


def assert_same_solution(actual, expected, gram, ridge: float) -> None:
    """``max |actual - expected| <= 2 cond(G + ridge I) eps64 max |expected|`` (cond exact, by eigvalsh)."""
    actual, expected, gram = (np.asarray(torch.as_tensor(t).double()) for t in (actual, expected, gram))
    eigenvalues = np.linalg.eigvalsh(gram + ridge * np.eye(gram.shape[0]))
    bound = 2 * eigenvalues.max() / eigenvalues.min() * np.finfo(np.float64).eps * np.abs(expected).max()
    gap = np.abs(actual - expected).max()
    assert gap <= bound, f"solutions differ by {gap:.3g}, beyond float64 rounding of the system ({bound:.3g})"
