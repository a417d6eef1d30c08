"""Where the router's query features come from: a module's output, a call's first tensor, or the
prompt-free class token the retrofit computes itself."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from torch import Tensor, nn

__all__ = ["ClassToken", "default_query", "first_tensor"]


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
        features = self.backbone.forward_features(images)
        if isinstance(features, (tuple, list)):
            features = features[0]
        return features[:, 0]
