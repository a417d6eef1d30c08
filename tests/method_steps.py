"""One training step of a reference method (``benchmarks.methods``), as a training loop takes it."""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor


def train_step(method, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor) -> Tuple[object, Tensor]:
    """Forward in training mode, the method's loss, an optimizer step, then ``on_optimizer_step``;
    returns the forward's output and the loss."""
    method.train()
    output = method(x)
    loss = method.loss(output, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    method.on_optimizer_step(output)
    return output, loss
