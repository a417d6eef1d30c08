"""Checks a module runs on a checkpoint before loading any of it (private).

``torch.nn.Module.load_state_dict`` copies tensor by tensor and reports problems at the end, so a
checkpoint that fails halfway leaves a module half-loaded. The core's modules check every entry
they and their children will read first and raise :class:`InvalidParameterError` (one line: what
the checkpoint holds, what the module expects, and the fix) before anything changes.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._validation import InvalidParameterError

__all__ = ["checkpoint_entries", "holds_any", "check_entry", "check_settings"]


def checkpoint_entries(state_dict: Mapping[str, Any], prefix: str, names: Sequence[str], *, caller: str) -> Dict[str, Tensor]:
    """The module's tensors in ``state_dict``, all of ``names``: a partial set is refused, the entries
    only make sense together."""
    missing = [prefix + name for name in names if prefix + name not in state_dict]
    if missing:
        found = sorted(prefix + name for name in names if prefix + name in state_dict)
        raise InvalidParameterError(
            f"{caller}: the checkpoint lacks {missing} (it holds {found or 'none'} of the module's entries); "
            f"load a state_dict() of the same module type"
        )
    entries = {name: state_dict[prefix + name] for name in names}
    for name, value in entries.items():
        if not isinstance(value, Tensor):
            raise InvalidParameterError(
                f"{caller}: checkpoint entry {prefix + name} must be a tensor, got {type(value).__name__}"
            )
    return entries


def holds_any(state_dict: Mapping[str, Any], prefix: str, names: Sequence[str]) -> bool:
    """Whether ``state_dict`` holds any of the module's entries (``False``: the module is not in it)."""
    return any(prefix + name in state_dict for name in names)


def check_entry(
    tensor: Tensor, key: str, shape: Tuple[Optional[int], ...], *, caller: str, integer: bool = False, fix: str = ""
) -> None:
    """``tensor`` has ``shape`` (``None``: any size) and a floating (or, with ``integer``, integer) dtype."""
    if tensor.ndim != len(shape) or any(want is not None and got != want for got, want in zip(tensor.shape, shape)):
        expected = str(tuple("*" if size is None else size for size in shape)).replace("'*'", "*")
        raise InvalidParameterError(
            f"{caller}: checkpoint entry {key} has shape {tuple(tensor.shape)} but this module expects {expected}"
            + (f"; {fix}" if fix else "")
        )
    integral = not (tensor.is_floating_point() or tensor.is_complex()) and tensor.dtype != torch.bool
    if integral != integer:
        kind = "an integer" if integer else "a floating-point"
        raise InvalidParameterError(f"{caller}: checkpoint entry {key} must have {kind} dtype, got {tensor.dtype}")


def check_settings(
    saved: Any, current: Mapping[str, Any], *, caller: str, adopted: Sequence[str] = (), fixes: Mapping[str, str]
) -> Dict[str, Any]:
    """Compare the settings a checkpoint was saved with (its extra state) with the module's.

    Every field of ``current`` must be present; fields in ``adopted`` are taken from the checkpoint,
    the others must be equal. Returns the saved settings. ``fixes[field]`` says how to load anyway.
    """
    if not isinstance(saved, dict):
        raise InvalidParameterError(f"{caller}: the checkpoint's extra state must be a dict, got {type(saved).__name__}")
    expected = set(current) | set(adopted)
    if set(saved) != expected:
        raise InvalidParameterError(
            f"{caller}: the checkpoint's extra state holds {sorted(saved)}, expected {sorted(expected)}"
        )
    for field, value in current.items():
        if saved[field] != value or type(saved[field]) is not type(value):
            raise InvalidParameterError(
                f"{caller}: the checkpoint was saved with {field}={saved[field]!r} but this module has "
                f"{field}={value!r}; {fixes[field]}"
            )
    return dict(saved)
