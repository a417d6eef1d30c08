"""The cost study's parameter counts: as the official code counts them."""

import pytest
import torch
from torch import nn

pytest.importorskip("timm")

from benchmarks.studies.cost import count_parameters, format_cost, method_parameters  # noqa: E402


def test_parameters_and_buffers_are_counted_apart():
    model = nn.Linear(10, 3)
    model.bias.requires_grad_(False)
    model.register_buffer("statistics", torch.zeros(4, 5))
    assert count_parameters(model) == {"total": 33e-6, "trainable": 30e-6, "buffers": 20e-6}


def test_l2p_at_the_papers_configuration_has_the_papers_count():
    counts = method_parameters("l2p")
    assert (round(counts["total"], 2), round(counts["trainable"], 2)) == (86.01, 0.22)
    row = {"method": "l2p", **counts, "BWT": None, "train_s": None, "seeds": 0,
           "paper": {"total": 86.01, "trainable": 0.22, "BWT": 0.10, "train_s": 5.57}}
    assert "| l2p | 86.01 | 86.01 | 0.22 | 0.22 |" in format_cost([row])
