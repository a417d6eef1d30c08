"""What every router of the routing study shares: it reads the random expanded features
``phi(h) = relu(h R^T)`` of the analytic router (computed once per batch by
:class:`benchmarks.studies.router_set.RouterSet`) and answers for the experts that have samples.

Interface: ``update(phi, experts)`` (forward-only statistics, or one online step for the MLP),
``route(phi)``, ``state_dict`` / ``load_state_dict``, and ``merge_`` where the statistics add up
across processes (``mergeable``).
"""

from __future__ import annotations

from typing import Any, Dict, Union

import torch
from torch import Tensor

__all__ = ["ExpandedRouter", "expert_ids"]


def expert_ids(experts: Union[int, Tensor], rows: int, num_experts: int, caller: str) -> Tensor:
    """``(rows,)`` long expert ids from one id or a tensor, checked against ``num_experts``."""
    ids = torch.full((rows,), int(experts), dtype=torch.long) if isinstance(experts, int) else experts.long()
    if ids.shape != (rows,):
        raise ValueError(f"{caller}.update: expected {rows} expert ids, got shape {tuple(ids.shape)}")
    if rows and (int(ids.min()) < 0 or int(ids.max()) >= num_experts):
        raise ValueError(f"{caller}.update: expert ids must lie in [0, {num_experts}); got "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    return ids


class ExpandedRouter:
    """Base of the study's routers: per-expert sample counts and the masking of untrained experts.

    Args:
        features: width of the expanded features.
        num_experts: experts the router chooses among (all created up front).
        device: where the statistics live.
    """

    mergeable = True
    name = "router"

    def __init__(self, features: int, num_experts: int, device: Union[str, torch.device] = "cpu") -> None:
        if features < 1 or num_experts < 1:
            raise ValueError(f"{type(self).__name__}: features and num_experts must be >= 1, got {features}, "
                             f"{num_experts}")
        self.features, self.num_experts, self.device = int(features), int(num_experts), torch.device(device)
        self.counts = torch.zeros(self.num_experts, dtype=torch.long, device=self.device)

    @torch.no_grad()
    def update(self, phi: Tensor, experts: Union[int, Tensor]) -> None:
        """Add a batch ``(N, features)`` of expanded features, each with its expert."""
        if phi.ndim != 2 or phi.shape[1] != self.features:
            raise ValueError(f"{type(self).__name__}.update: expected features of shape (N, {self.features}), "
                             f"got {tuple(phi.shape)}")
        ids = expert_ids(experts, phi.shape[0], self.num_experts, type(self).__name__).to(self.device)
        if phi.shape[0] == 0:
            return
        self.counts += torch.bincount(ids, minlength=self.num_experts)
        self._update(phi.to(self.device), ids)

    @torch.no_grad()
    def route(self, phi: Tensor) -> Tensor:
        """``(N,)`` the best-scoring expert of each sample among those with samples."""
        if not bool((self.counts > 0).any()):
            raise RuntimeError(f"{type(self).__name__}.route: no expert has a sample yet; call update() first")
        scores = self.scores(phi.to(self.device))
        return scores.masked_fill(self.counts == 0, float("-inf")).argmax(dim=1)

    def merge_(self, other: "ExpandedRouter") -> "ExpandedRouter":
        """Add ``other``'s statistics (another process's samples) to these."""
        if not self.mergeable:
            raise NotImplementedError(f"{type(self).__name__} depends on the order of its samples: its statistics "
                                      f"do not merge; feed every process the gathered batch instead")
        if type(other) is not type(self) or (other.features, other.num_experts) != (self.features, self.num_experts):
            raise ValueError(f"{type(self).__name__}.merge_: expected a {type(self).__name__} of "
                             f"{self.features} features and {self.num_experts} experts")
        self._merge(other)
        self.counts += other.counts.to(self.device)
        return self

    def state_dict(self) -> Dict[str, Any]:
        return {"counts": self.counts.clone(), **{k: v.clone() for k, v in self._tensors().items()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for name, tensor in {"counts": self.counts, **self._tensors()}.items():
            if state[name].shape != tensor.shape:
                raise ValueError(f"{type(self).__name__}.load_state_dict: {name} has shape "
                                 f"{tuple(state[name].shape)}, expected {tuple(tensor.shape)}")
            tensor.copy_(state[name])

    # -------------------------------------------------------------- what each algorithm defines
    def scores(self, phi: Tensor) -> Tensor:
        """``(N, num_experts)`` routing scores (higher is better)."""
        raise NotImplementedError

    def _update(self, phi: Tensor, ids: Tensor) -> None:
        raise NotImplementedError

    def _merge(self, other: "ExpandedRouter") -> None:
        raise NotImplementedError

    def _tensors(self) -> Dict[str, Tensor]:
        """The statistics besides ``counts``, by name (saved, loaded, updated in place)."""
        raise NotImplementedError
