"""Where the router's query features come from: a module's output, a call's first tensor, or the
prompt-free class token the retrofit computes itself, alone or sharing the pass with the model's own
reader of that token."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

__all__ = ["ClassToken", "SharedPass", "class_token", "default_query", "first_tensor"]


def default_query(output: Any) -> Tensor:
    """The query features of a module output: the tensor itself, or ``output["pre_logits"]``."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("pre_logits"), Tensor):
        return output["pre_logits"]
    raise TypeError(
        f"the query module returned a {type(output).__name__}; pass query_from_output=... mapping its output "
        "to the (B, D) query features"
    )


def first_tensor(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tensor]:
    """The call's first tensor argument (positional first, then keyword), ``None`` if there is none."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            return value
    return None


class ClassToken(nn.Module):
    """The prompt-free final-norm class token of ``backbone.forward_features`` (what FlyGCL's RP gate
    collects). Held by the retrofit only, never a child of the model: its ``state_dict`` is unchanged."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.__dict__["backbone"] = backbone  # not a submodule: the model holds it

    def forward(self, images: Tensor) -> Tensor:
        return class_token(self.backbone.forward_features(images))


def class_token(features: Any) -> Tensor:
    """The class token of a ``forward_features`` output: ``(B, N, D)`` (or a tuple starting with it) -> ``(B, D)``."""
    if isinstance(features, (tuple, list)):
        features = features[0]
    return features[:, 0]


def _autocast(device_type: str) -> Tuple[bool, torch.dtype]:
    """Whether autocast is on for ``device_type``, and its dtype."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    if device_type == "cpu":
        return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


class SharedPass:
    """The prompt-free pass ``backbone.forward_features(images)`` run once for two readers: the model's own
    (a gate that reads the frozen class token) and the router. Whichever asks first runs the pass and, when
    told the other follows, keeps it; the other takes it if it asks for the very same input tensor,
    unchanged, with the pass's output and the backbone's weights unchanged, in the same backbone mode and
    autocast state, neither recording an autograd graph: the pass it would have run itself. Any other call
    runs its own pass. A take drops what was kept, matching or not: a kept pass lives from one reader's call
    to the next call.

    Held by the retrofit only (no module of the model holds it): ``features`` is the backbone's own
    ``forward_features``, taken before the retrofit replaces that attribute. The kept pass lives on
    ``record`` (its ``kept`` attribute; default this object), so that a snapshot of the record covers it.
    """

    def __init__(self, backbone: nn.Module, record: Any = None) -> None:
        self.backbone = backbone
        self.features: Callable[[Tensor], Any] = backbone.forward_features
        self.record = self if record is None else record
        self.record.kept = None

    def context(self, images: Tensor) -> Tuple[Any, ...]:
        """What the pass's result depends on besides the input tensor itself: its contents (version), the
        backbone's weights (their objects and versions) and mode, autocast, and whether it records a graph."""
        tensors = [*self.backbone.parameters(), *self.backbone.buffers()]
        graph = torch.is_grad_enabled() and (images.requires_grad or any(t.requires_grad for t in tensors))
        weights = tuple((id(t), t._version) for t in tensors)
        return images._version, weights, bool(self.backbone.training), _autocast(images.device.type), graph

    def take(self, images: Tensor) -> Any:
        """The kept pass if it is this call's, else ``None``; nothing is kept afterwards."""
        kept, self.record.kept = self.record.kept, None
        if kept is None:
            return None
        held, context, output, version = kept
        if held is images and class_token(output)._version == version and not context[-1] \
                and context == self.context(images):
            return output
        return None

    def run(self, images: Tensor, *, keep: bool) -> Any:
        """``forward_features(images)``: the kept pass if it is this call's, else a new one (kept when ``keep``)."""
        output = self.take(images)
        if output is None:
            output = self.features(images)
            if keep:
                self.record.kept = (images, self.context(images), output, class_token(output)._version)
        return output

    def clear(self) -> None:
        self.record.kept = None
