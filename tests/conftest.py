"""Test-wide settings and fixtures."""

import os

import pytest
import torch

# The tests run tiny models on a 2-core machine: one intra-op thread for the whole suite avoids
# oversubscription (about 100x faster than two contended threads at these sizes). Benchmarks set
# their own thread counts.
torch.set_num_threads(1)


def _fold_rounded_apart(gram, phi, panel_rows=None, product_dtype=None):
    """``G += phi^T phi`` with the product rounded on its own before it is added: where the CPU's BLAS
    accumulates into ``G`` row by row (so one update of ``a + b`` rows equals two of ``a`` and ``b``), this
    makes the fold's rounding depend on how the rows were split, as other CPUs' BLAS does (MKL with
    AVX-512). ``FLY_MODULES_TEST_FOLD_ROUNDING=apart python -m pytest`` runs the suite so."""
    from fly_modules import _ridge

    rows = phi.to(product_dtype or gram.dtype)
    for start, stop in _ridge.panels(gram.shape[0], panel_rows or _ridge.PANEL_ROWS):
        gram[start:stop, :stop] += rows[:, start:stop].t() @ rows[:, :stop]


if os.environ.get("FLY_MODULES_TEST_FOLD_ROUNDING") == "apart":
    from fly_modules import _ridge

    _ridge.accumulate_lower_gram = _fold_rounded_apart


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the cross-ablation's command line got as far as generating data or training."""
    from benchmarks.ablation import execution, sweep_data

    def refuse(*args, **kwargs):
        raise AssertionError("data or training work started before the command line was checked")

    monkeypatch.setattr(sweep_data, "load_data", refuse)
    monkeypatch.setattr(execution, "run_training", refuse)
