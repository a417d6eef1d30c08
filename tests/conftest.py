"""Test-wide settings and fixtures."""

import pytest
import torch

# The tests run tiny models on a 2-core machine: one intra-op thread for the whole suite avoids
# oversubscription (about 100x faster than two contended threads at these sizes). Benchmarks set
# their own thread counts.
torch.set_num_threads(1)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the cross-ablation's command line got as far as generating data or training."""
    from benchmarks.ablation import execution, sweep_data

    def refuse(*args, **kwargs):
        raise AssertionError("data or training work started before the command line was checked")

    monkeypatch.setattr(sweep_data, "load_data", refuse)
    monkeypatch.setattr(execution, "run_training", refuse)
