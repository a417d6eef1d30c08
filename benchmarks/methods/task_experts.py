"""Per-task experts of a frozen timm ViT's blocks that are not prompts: low-rank updates of the attention's
key and value projections (HiDe-LoRA) and bottleneck adapters beside the MLP (HiDe-Adapter).

Every task has its own bank of parameters (one module per task, so a task no sample used gets no
gradient, and Adam leaves a finished task alone). A pass applies one task to the whole batch (an ``int``:
only that bank enters the graph) or one task per sample (a ``(B,)`` long tensor: each sample's weights
are gathered from the stacked banks and applied with batched matrix products, no loop over samples).
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple, Union

import torch
from torch import Tensor, nn

__all__ = [
    "TaskLoRA", "TaskAdapter", "GatheredLoRA", "GatheredAdapters", "Tasks", "bank_weight", "lora_parameter_count",
    "adapter_parameter_count",
]

#: One task for the whole batch, or a ``(B,)`` long tensor of each sample's task.
Tasks = Union[int, Tensor]


def bank_weight(banks: nn.ModuleList, name: str, tasks: Tasks) -> Tensor:
    """Parameter ``name`` (laid out ``(L, ...)``, one slice per expert layer) of the banks of ``tasks``:
    ``(L, ...)`` for one task, ``(L, B, ...)`` for one task per sample."""
    if isinstance(tasks, int):
        return getattr(banks[tasks], name)
    return torch.stack([getattr(bank, name) for bank in banks], dim=1)[:, tasks]


def _row_vector(bias: Tensor) -> Tensor:
    """A bias ``(W,)`` or per-sample ``(B, W)`` as ``(1, W)`` / ``(B, 1, W)``, broadcast over the tokens."""
    return bias.unsqueeze(-2)


def _per_sample_scalar(scale: Tensor) -> Tensor:
    """A scalar ``()`` or per-sample ``(B,)`` as ``(1, 1)`` / ``(B, 1, 1)``."""
    return scale.reshape(*scale.shape, 1, 1)


class _LoRABank(nn.Module):
    """One task's LoRA: ``down`` ``(L, 2, r, D)`` (index 0 key, 1 value), ``N(0, 1/r)``; ``up`` ``(L, 2, D, r)``,
    zeros, so that a new task starts as the frozen backbone."""

    def __init__(self, layers: int, dim: int, rank: int, dd: dict) -> None:
        super().__init__()
        self.down = nn.Parameter(torch.randn(layers, 2, rank, dim, **dd) / math.sqrt(rank))
        self.up = nn.Parameter(torch.zeros(layers, 2, dim, rank, **dd))


class TaskLoRA(nn.Module):
    """Per-task LoRA on the key and value projections of the blocks ``layers``.

    A sample of task t gets ``qkv(h) + [0, dK, dV]`` with ``dK = (h down_K^T) up_K^T * alpha / rank`` (and
    ``dV`` alike) in every listed block, ``h`` the block's ``norm1`` output.

    Args:
        layers: block indices carrying LoRA (sorted).
        num_tasks: T banks, all allocated up front.
        dim: D, the token width; rank: r; alpha: the update's scale is ``alpha / rank``.
        dd: device and dtype of the parameters.
    """

    def __init__(self, layers: Sequence[int], num_tasks: int, dim: int, rank: int, alpha: float, dd: dict) -> None:
        super().__init__()
        self.layers: Tuple[int, ...] = tuple(layers)
        self.rank, self.alpha, self.scale = int(rank), float(alpha), float(alpha) / int(rank)
        self.banks = nn.ModuleList(_LoRABank(len(self.layers), dim, self.rank, dd) for _ in range(num_tasks))

    def gathered(self, tasks: Tasks) -> "GatheredLoRA":
        """The weights of ``tasks`` (one for the batch, or each sample's), ready for the blocks."""
        return GatheredLoRA(bank_weight(self.banks, "down", tasks), bank_weight(self.banks, "up", tasks), self.scale)

    def extra_repr(self) -> str:
        return f"layers={self.layers}, tasks={len(self.banks)}, rank={self.rank}, alpha={self.alpha}"


class _AdapterBank(nn.Module):
    """One task's adapters (``L`` layers): ``down_weight`` ``(L, W, D)`` uniform in ``±1/sqrt(D)`` (the default
    ``nn.Linear`` bound), ``up_weight`` ``(L, D, W)`` zeros, biases zeros, ``scale`` ``(L,)`` ones."""

    def __init__(self, layers: int, dim: int, width: int, dd: dict) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(dim)
        self.down_weight = nn.Parameter(torch.empty(layers, width, dim, **dd).uniform_(-bound, bound))
        self.down_bias = nn.Parameter(torch.zeros(layers, width, **dd))
        self.up_weight = nn.Parameter(torch.zeros(layers, dim, width, **dd))
        self.up_bias = nn.Parameter(torch.zeros(layers, dim, **dd))
        self.scale = nn.Parameter(torch.ones(layers, **dd))


class TaskAdapter(nn.Module):
    """Per-task bottleneck adapters beside the MLP of the blocks ``layers``.

    A sample of task t gets ``x + adapter(x) + mlp branch`` after the attention's residual, with
    ``adapter(x) = (relu(x down^T + b_down) up^T + b_up) * scale``.

    Args:
        layers: block indices carrying an adapter (sorted).
        num_tasks: T banks, all allocated up front.
        dim: D; width: W, the bottleneck.
        dd: device and dtype of the parameters.
    """

    _NAMES = ("down_weight", "down_bias", "up_weight", "up_bias", "scale")

    def __init__(self, layers: Sequence[int], num_tasks: int, dim: int, width: int, dd: dict) -> None:
        super().__init__()
        self.layers: Tuple[int, ...] = tuple(layers)
        self.width = int(width)
        self.banks = nn.ModuleList(_AdapterBank(len(self.layers), dim, self.width, dd) for _ in range(num_tasks))

    def gathered(self, tasks: Tasks) -> "GatheredAdapters":
        """The weights of ``tasks`` (one for the batch, or each sample's), ready for the blocks."""
        return GatheredAdapters(*(bank_weight(self.banks, name, tasks) for name in self._NAMES))

    def extra_repr(self) -> str:
        return f"layers={self.layers}, tasks={len(self.banks)}, width={self.width}"


class GatheredLoRA:
    """``TaskLoRA``'s weights for one pass: ``down`` ``(L, 2, r, D)`` and ``up`` ``(L, 2, D, r)``, or with a
    sample axis after ``L`` (one task per sample)."""

    def __init__(self, down: Tensor, up: Tensor, scale: float) -> None:
        self.down, self.up, self.scale = down, up, scale

    def qkv_delta(self, slot: int, h: Tensor) -> Tensor:
        """The ``(B, N, 3 * D)`` addition to the ``qkv`` output of the ``slot``-th LoRA block (``h``: ``norm1``'s)."""
        down, up = self.down[slot], self.up[slot]  # (2, r, D) / (2, D, r), or (B, 2, ...) per sample
        key = (h @ down.select(-3, 0).transpose(-1, -2)) @ up.select(-3, 0).transpose(-1, -2) * self.scale
        value = (h @ down.select(-3, 1).transpose(-1, -2)) @ up.select(-3, 1).transpose(-1, -2) * self.scale
        return torch.cat([torch.zeros_like(key), key, value], dim=-1)


class GatheredAdapters:
    """``TaskAdapter``'s weights for one pass, each ``(L, ...)`` or with a sample axis after ``L``."""

    def __init__(self, down_weight: Tensor, down_bias: Tensor, up_weight: Tensor, up_bias: Tensor,
                 scale: Tensor) -> None:
        self.down_weight, self.down_bias, self.up_weight, self.up_bias = down_weight, down_bias, up_weight, up_bias
        self.scale = scale

    def output(self, slot: int, x: Tensor) -> Tensor:
        """The ``(B, N, D)`` output of the ``slot``-th adapter block's adapter."""
        hidden = torch.relu(x @ self.down_weight[slot].transpose(-1, -2) + _row_vector(self.down_bias[slot]))
        up = hidden @ self.up_weight[slot].transpose(-1, -2) + _row_vector(self.up_bias[slot])
        return up * _per_sample_scalar(self.scale[slot])


def lora_parameter_count(layers: int, tasks: int, dim: int, rank: int) -> int:
    """Parameters of ``TaskLoRA``: per layer and task, key and value, ``down`` ``r x D`` and ``up`` ``D x r``."""
    return layers * tasks * 2 * 2 * rank * dim


def adapter_parameter_count(layers: int, tasks: int, dim: int, width: int) -> int:
    """Parameters of ``TaskAdapter``: per layer and task, ``Linear(D, W)``, ``Linear(W, D)`` and a scale."""
    return layers * tasks * ((dim + 1) * width + (width + 1) * dim + 1)
