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
    from benchmarks.ablation import cli

    def refuse(*args, **kwargs):
        raise AssertionError("data or training work started before the command line was checked")

    monkeypatch.setattr(cli, "load_data", refuse)
    monkeypatch.setattr(cli, "run_training", refuse)
