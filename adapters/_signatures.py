"""Signature checks made before wiring: a routed keyword must be a named parameter of its callee.

A keyword that lands in ``**kwargs`` (or that the callee does not take) would leave the method's own
selection in place without any error; these checks refuse such a seam with a :class:`SeamError`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ._errors import GENERIC_CALL, SeamError

__all__ = ["named_parameters", "require_keyword"]


def _signature(function: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError) as error:  # builtins and some C extensions have none
        raise SeamError(f"cannot read the signature of {function!r} ({error}); use {GENERIC_CALL}") from None


def named_parameters(function: Callable[..., Any]) -> set:
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
