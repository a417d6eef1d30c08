"""Additive logit masks: 0 for the classes that may be predicted, ``-inf`` for the rest.

Masks are added to logits before the softmax (``logits + mask``), as in the paper's Eq. for the
ensemble and the reference training loss. Class indices are *exposure-ordered* (the order in which
classes first appear in the stream), so the seen classes are always a prefix.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._validation import InvalidParameterError, check_int, check_mask_dtype

__all__ = ["class_mask", "batch_seen_class_mask", "seen_class_mask"]


def class_mask(
    classes: Tensor, num_classes: int, *, dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None
) -> Tensor:
    """``(num_classes,)`` mask that is 0 at every index in ``classes`` and ``-inf`` elsewhere."""
    return _mask_of(classes, num_classes, dtype, device, name="classes", caller="class_mask")


def batch_seen_class_mask(
    labels: Tensor, num_classes: int, *, dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None
) -> Tensor:
    """Training mask of FlyPrompt and the prompt baselines: only the classes present in the batch."""
    return _mask_of(labels, num_classes, dtype, device, name="labels", caller="batch_seen_class_mask")


def _mask_of(classes: Tensor, num_classes: int, dtype: torch.dtype, device: Optional[torch.device], *, name: str,
             caller: str) -> Tensor:
    """:func:`class_mask`, its refusals naming the caller's argument ``name``."""
    num_classes = check_int(num_classes, "num_classes", caller=caller, minimum=0)
    dtype = check_mask_dtype(dtype, caller=caller)
    if not isinstance(classes, Tensor) or classes.is_floating_point() or classes.is_complex() or classes.dtype == torch.bool:
        raise InvalidParameterError(
            f"{caller}: {name} must be an integer tensor, got {getattr(classes, 'dtype', type(classes).__name__)}"
        )
    if classes.numel() and (int(classes.min()) < 0 or int(classes.max()) >= num_classes):
        raise InvalidParameterError(
            f"{caller}: {name} must lie in [0, {num_classes}), got range [{int(classes.min())}, {int(classes.max())}]"
        )
    device = classes.device if device is None else device
    mask = torch.full((num_classes,), float("-inf"), dtype=dtype, device=device)
    # long indices: a uint8 index tensor would be read as a boolean mask
    mask[classes.reshape(-1).to(device=device, dtype=torch.long)] = 0
    return mask


def seen_class_mask(
    num_seen: int, num_classes: int, *, dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None
) -> Tensor:
    """Evaluation mask: the first ``num_seen`` (exposed) classes.

    Examples::

        >>> seen_class_mask(2, 4)
        tensor([0., 0., -inf, -inf])
    """
    num_classes = check_int(num_classes, "num_classes", caller="seen_class_mask", minimum=0)
    num_seen = check_int(num_seen, "num_seen", caller="seen_class_mask", minimum=0, maximum=num_classes)
    dtype = check_mask_dtype(dtype, caller="seen_class_mask")
    mask = torch.full((num_classes,), float("-inf"), dtype=dtype, device=device)
    mask[:num_seen] = 0
    return mask
