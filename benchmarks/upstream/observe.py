"""Watching what a model did without changing it: its outputs, the prompt rows it used, a forced route."""

from __future__ import annotations

import contextlib
from typing import Any, List, Union

import torch


@contextlib.contextmanager
def capture_outputs(module: torch.nn.Module):
    """Record every output of ``module`` (a forward hook registered and removed here)."""
    outputs: List[Any] = []
    handle = module.register_forward_hook(lambda mod, args, output: outputs.append(output))
    try:
        yield outputs
    finally:
        handle.remove()


def match_rows(selected: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """Index of the pool row each selected row equals exactly (-1 if none). selected (B, ...), pool (P, ...)."""
    if selected.ndim == pool.ndim - 1:  # the upstream x[idx].squeeze() of a one-sample batch
        selected = selected.unsqueeze(0)
    selected = selected.detach().reshape(selected.shape[0], -1)
    pool = pool.detach().reshape(pool.shape[0], -1)
    equal = (selected.unsqueeze(1) == pool.unsqueeze(0)).all(-1)
    return torch.where(equal.any(1), equal.float().argmax(1), torch.full_like(equal[:, 0], -1, dtype=torch.long))


@contextlib.contextmanager
def forced_route(handle: Any, expert: Union[int, torch.Tensor]):
    """Make the router answer ``expert`` for every sample, or ``expert[b]`` for sample ``b`` when it is a
    ``(B,)`` tensor (an instance attribute shadowing ``route``)."""
    router = handle.router

    def route(features: torch.Tensor) -> torch.Tensor:
        if isinstance(expert, torch.Tensor):
            if expert.shape != (features.shape[0],):
                raise RuntimeError(f"{expert.numel()} forced experts for a routed call of {features.shape[0]} samples")
            return expert.to(device=features.device, dtype=torch.long)
        return torch.full((features.shape[0],), int(expert), dtype=torch.long, device=features.device)

    router.route = route
    try:
        yield
    finally:
        if "route" in vars(router):
            del router.route


class PromptFuncCapture:
    """Records the E-prompt argument of ``model.prompt_func`` (an instance attribute in the online
    codebases) during a call, to tell which pool row each sample used."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.seen: List[torch.Tensor] = []

    def __enter__(self):
        self.original = self.model.prompt_func

        def prompt_func(x, g_prompt, e_prompt, **kwargs):
            self.seen.append(e_prompt.detach())
            return self.original(x, g_prompt, e_prompt, **kwargs)

        self.model.prompt_func = prompt_func
        return self

    def __exit__(self, *exc):
        self.model.prompt_func = self.original


@contextlib.contextmanager
def backward_losses():
    """Record the value of every scalar loss back-propagated inside the block (for loops that keep no loss)."""
    losses: List[float] = []
    original = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        if self.dim() == 0:
            losses.append(float(self.detach()))
        return original(self, *args, **kwargs)

    torch.Tensor.backward = backward
    try:
        yield losses
    finally:
        torch.Tensor.backward = original
