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
        f"{present}.{_inner_hint(model, path)} If your code names it differently, pass the seams explicitly: "
        f"{GENERIC_CALL}"
    )


def _inner_hint(model: Any, path: str) -> str:
    """Frameworks wrap the prompted model (Mammoth ``net.model``, PILOT ``_network.backbone``): name the
    submodule that has the seam, if one does."""
    if not isinstance(model, nn.Module):
        return ""
    names = path.split("`")[0].split(".")
    for name, module in model.named_modules():
        if name and name.count(".") < 3:
            owner = module
            for part in names:
                owner = getattr(owner, part, None)
            if owner is not None:
                return f" Its submodule `{name}` has it: retrofit that one (model.{name})."
    return ""
