"""The adapters' error for a model that does not offer a seam, and the hint every such error ends with."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["GENERIC_CALL", "SeamError", "missing_seam"]

GENERIC_CALL = (
    "fly_modules.adapters.generic.retrofit(model, num_experts=..., query_module=..., route_module=..., "
    "route_kwarg=..., head_owner=..., head_name=...)"
)


class SeamError(AttributeError):
    """A model lacks a seam an adapter needs, or offers one the adapter cannot use; the message says why
    and shows the generic call."""


def missing_seam(family: str, model: Any, path: str, what: str) -> SeamError:
    present = sorted(name for name, _ in model.named_children()) if isinstance(model, nn.Module) else []
    return SeamError(
        f"fly_modules.adapters.{family}: {type(model).__name__} has no `{path}` ({what}); its submodules are "
        f"{present}. If your code names it differently, pass the seams explicitly: {GENERIC_CALL}"
    )
