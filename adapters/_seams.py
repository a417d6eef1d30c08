"""Seam checks: what a family reads on a model before anything is installed, and the one-line
:class:`SeamError` naming what was found, what was expected and the generic call."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Set, Tuple

from torch import nn

from fly_modules import ClassifierNotFoundError, locate_classifier
from fly_modules._validation import InvalidParameterError, check_int

from ._handle import StepCounter

__all__ = [
    "GENERIC_CALL", "SeamError", "backbone_of", "count_experts", "find_head", "head_options", "missing_seam",
    "named_parameters",
    "require_keyword", "step_counter",
]

GENERIC_CALL = (
    "fly_modules.adapters.generic.retrofit(model, num_experts=..., query_module=..., route_module=..., "
    "route_kwarg=..., head_owner=..., head_name=...)"
)


class SeamError(TypeError):
    """A model lacks a seam an adapter needs, or offers one the adapter cannot use; the message says why
    and shows the generic call.

    A ``TypeError`` (the model is not of the kind the family reads, as for ``ClassifierNotFoundError``),
    never an ``AttributeError``: that one is swallowed by ``nn.Module.__getattr__`` when raised inside a
    property, and by ``hasattr`` and ``getattr(obj, name, default)``.
    """


def missing_seam(model: Any, path: str, what: str, *, family: str) -> SeamError:
    """The error for a model without ``path`` (``what`` it should be), naming its submodules."""
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
            found: Any = module
            for part in names:
                found = getattr(found, part, None)
            if found is not None:
                return f" Its submodule `{name}` has it: retrofit that one (model.{name})."
    return ""


def _signature(function: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError) as error:  # builtins and some C extensions have none
        raise SeamError(f"cannot read the signature of {function!r} ({error}); use {GENERIC_CALL}") from None


def named_parameters(function: Callable[..., Any]) -> Set[str]:
    """Parameters that can be passed by keyword (``**kwargs`` excluded)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in _signature(function).parameters.values() if p.kind in kinds}


def require_keyword(function: Callable[..., Any], keyword: str, *, family: str, callee: str, why: str = "") -> None:
    """Raise :class:`SeamError` unless ``function`` takes ``keyword`` as a named parameter."""
    if keyword in named_parameters(function):
        return
    signature = _signature(function)
    swallowed = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    found = (
        "takes it only through **kwargs, which would swallow the routed value and leave the method's own "
        "selection in place" if swallowed else "does not take it"
    )
    raise SeamError(
        f"fly_modules.adapters.{family}: the router passes `{keyword}=` to {callee}{signature}, which {found}"
        f"{'; ' + why if why else ''}. Route through a module whose forward names the argument: {GENERIC_CALL}"
    )


def find_head(model: nn.Module, family: str = "generic") -> Tuple[nn.Module, str]:
    """``(parent, name)`` of ``model``'s classifier as :func:`fly_modules.locate_classifier` finds it
    (``get_classifier()``, else ``head``, else ``fc``). Raises :class:`SeamError` when there is none."""
    try:
        path, _ = locate_classifier(model)
    except ClassifierNotFoundError as error:
        raise SeamError(f"fly_modules.adapters.{family}: {error}; {head_options(family)}") from None
    parent, _, name = path.rpartition(".")
    return (model.get_submodule(parent) if parent else model), name


def head_options(family: str) -> str:
    """How to name the classifier, in the options ``family`` accepts (only ``generic`` takes ``head_owner``)."""
    router_only = "retrofit with ensemble=False (the router needs no classifier)"
    if family == "generic":
        return f"pass head_owner=... and head_name=..., or {router_only}"
    return f"{router_only}, or name the classifier with {GENERIC_CALL}"


def count_experts(num_experts: Optional[int], default: Any, what: str, *, family: str) -> int:
    """``num_experts`` if given, else ``default`` (what the model declares), as an int >= 1; an error
    asking for ``num_experts`` (the number of ``what``) when neither is there."""
    caller = f"fly_modules.adapters.{family}"
    value = num_experts if num_experts is not None else default
    if value is None:
        raise InvalidParameterError(f"{caller}: pass num_experts (the number of {what})")
    return check_int(value, "num_experts", caller=caller, minimum=1)


def backbone_of(model: nn.Module, what: str, *, family: str, forward_features: bool = False) -> nn.Module:
    """``model.backbone`` (with a ``forward_features`` method when asked), else a :class:`SeamError`."""
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        raise missing_seam(model, "backbone", what, family=family)
    if forward_features and not callable(getattr(backbone, "forward_features", None)):
        raise missing_seam(model, "backbone.forward_features", what, family=family)
    return backbone


def step_counter(model: nn.Module) -> Optional[StepCounter]:
    """FlyGCL's ``task_count`` (advanced by ``process_task_count()``, which also prepares the step), else
    MISA's ``task_id`` (its loop increments it; set directly); ``None`` when the model has neither."""
    if callable(getattr(model, "process_task_count", None)) and isinstance(getattr(model, "task_count", None), int):
        def process(expert: int) -> None:
            while int(model.task_count) < expert:
                model.process_task_count()

        return StepCounter(model, "task_count", process)
    if isinstance(getattr(model, "task_id", None), int):
        return StepCounter(model, "task_id", lambda expert: setattr(model, "task_id", int(expert)))
    return None
