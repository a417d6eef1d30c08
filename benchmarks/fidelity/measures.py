"""Side-by-side measures: tensor differences of corresponding states, and agreement of decisions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Tuple

import torch
from torch import Tensor

__all__ = ["TensorDifference", "agreement", "base_name", "copy_tensors", "tensor", "tensor_differences", "worst"]


def base_name(name: str) -> str:
    """The state entry a name reads: ``"e_prompt.prompt#1"`` and ``"banks.0.down[2,1]"`` read
    ``e_prompt.prompt`` and ``banks.0.down``."""
    return name.split("#", 1)[0].split("[", 1)[0]


def tensor(state: Mapping[str, Tensor], name: str) -> Tensor:
    """``state[name]``; for ``"entry#k"`` the view ``state[entry][:, k]`` (one tensor of ours holding
    two of theirs along its second axis, HiDe-Prompt's prefix keys and values); for ``"entry[i,j]"`` the
    view ``state[entry][i, j]``, a component ``a:b`` a slice (one tensor of ours stacking one of theirs
    per block, the expert banks)."""
    if name.endswith("]"):
        entry, index = name[:-1].split("[", 1)
        return state[entry][tuple(_index(component) for component in index.split(","))]
    if "#" not in name:
        return state[name]
    entry, index = name.split("#", 1)
    return state[entry][:, int(index)]


def _index(component: str) -> "int | slice":
    if ":" not in component:
        return int(component)
    start, stop = component.split(":")
    return slice(int(start), int(stop))


@dataclass(frozen=True)
class TensorDifference:
    """``max_abs``: the largest element-wise difference; ``relative``: ``max_abs`` over the official
    tensor's largest magnitude (the scale of the tensor, not of one element)."""

    official: str
    ours: str
    max_abs: float
    relative: float


def tensor_differences(
    official: Mapping[str, Tensor], ours: Mapping[str, Tensor], names: Iterable[Tuple[str, str]]
) -> List[TensorDifference]:
    """One :class:`TensorDifference` per ``(official name, our name)`` pair."""
    differences = []
    for official_name, our_name in names:
        a, b = tensor(official, official_name).detach().double(), tensor(ours, our_name).detach().double()
        if a.shape != b.shape:
            raise ValueError(
                f"official {official_name} has shape {tuple(a.shape)} but ours {our_name} {tuple(b.shape)}; "
                "the pair's layout differs"
            )
        max_abs = float((a - b).abs().max()) if a.numel() else 0.0
        scale = float(a.abs().max()) if a.numel() else 0.0
        differences.append(TensorDifference(official_name, our_name, max_abs, max_abs / scale if scale else max_abs))
    return differences


def worst(differences: List[TensorDifference]) -> TensorDifference:
    return max(differences, key=lambda difference: difference.relative)


@torch.no_grad()
def copy_tensors(source: Mapping[str, Tensor], target: Mapping[str, Tensor], names: Dict[str, str]) -> None:
    """``target[names[k]] = source[k]`` in place (dtype of the target)."""
    for source_name, target_name in names.items():
        tensor(target, target_name).copy_(tensor(source, source_name))


def agreement(a: Tensor, b: Tensor) -> float:
    """Fraction of rows (samples) on which ``a`` and ``b`` are equal (all columns of a row)."""
    if a.shape != b.shape:
        raise ValueError(f"cannot compare decisions of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    equal = (a == b).reshape(a.shape[0], -1).all(dim=1) if a.numel() else a.new_ones(0, dtype=torch.bool)
    return float(equal.double().mean()) if equal.numel() else 1.0
