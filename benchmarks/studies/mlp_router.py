"""An MLP router trained online: two layers (``hidden`` = 512, the width of HiDe-Prompt's task-identity
head) from the expanded features to the experts, one Adam step of cross-entropy per batch with the
batch's expert as target, over the experts that have samples."""

from __future__ import annotations

import copy
from typing import Any, Dict

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .expanded_router import ExpandedRouter

__all__ = ["MLPRouter"]


class MLPRouter(ExpandedRouter):
    """Two-layer MLP router, float32, initialised from its own seed (the global generator is untouched).

    Its weights depend on the order of the batches: not mergeable (a data-parallel run feeds every
    process the gathered batch, so that all hold the same MLP).
    """

    name = "mlp"
    mergeable = False

    def __init__(self, features: int, num_experts: int, device="cpu", *, hidden: int = 512, lr: float = 1e-3,
                 seed: int = 0) -> None:
        super().__init__(features, num_experts, device)
        generator = torch.Generator().manual_seed(int(seed))
        # skip_init: nn.Linear's own initialisation would draw from the global generator, which the run's
        # training draws from; the same uniform bounds are drawn here from the router's generator.
        first, second = (nn.utils.skip_init(nn.Linear, a, b) for a, b in ((features, hidden), (hidden, num_experts)))
        self.network = nn.Sequential(first, nn.ReLU(), second)
        with torch.no_grad():
            for layer in (first, second):
                bound = layer.in_features ** -0.5
                layer.weight.copy_(torch.rand(layer.weight.shape, generator=generator) * 2 * bound - bound)
                layer.bias.copy_(torch.rand(layer.bias.shape, generator=generator) * 2 * bound - bound)
        self.network.to(self.device)
        self.optimizer = torch.optim.Adam(self.network.parameters(), lr=lr)

    def scores(self, phi: Tensor) -> Tensor:
        with torch.no_grad():
            return self.network(phi.float())

    def _update(self, phi: Tensor, ids: Tensor) -> None:
        with torch.enable_grad():
            logits = self.network(phi.float()).masked_fill(self.counts == 0, float("-inf"))
            loss = F.cross_entropy(logits, ids)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()

    def state_dict(self) -> Dict[str, Any]:
        return {"counts": self.counts.clone(), "network": {k: v.clone() for k, v in self.network.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.counts.copy_(state["counts"])
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # no tensor shared with the source
