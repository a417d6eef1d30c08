"""The family registry: ``@register_family("dualprompt", "misa")`` declares which method names a wiring
function serves, and the dispatch every retrofit goes through (option checks, the refusal of seam-contract
models by the families that recognise upstream code, undo of a failed install)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, List, Mapping, Tuple

from torch import nn

from fly_modules._validation import InvalidParameterError, check_choice

from ._handle import Retrofit
from ._options import RetrofitOptions
from ._restore import MARKER
from .contract import missing_seams

__all__ = ["Family", "install", "list_families", "register_family"]

Wire = Callable[..., Retrofit]


@dataclasses.dataclass(frozen=True)
class Family:
    """One adapter family: the method names it serves and its wiring ``wire(model, options, **options)``.

    ``seam_contract``: the family recognises upstream code, so a model implementing
    :class:`~fly_modules.adapters.SeamContract` is refused with a pointer to the ``reference`` family,
    which drives the declared seams (``False``: the family wires whatever model it is given).
    """

    names: Tuple[str, ...]
    wire: Wire
    options: Tuple[str, ...]
    seam_contract: bool


_FAMILIES: Dict[str, Family] = {}


def list_families() -> List[str]:
    """Method names ``retrofit`` accepts."""
    return sorted(_FAMILIES)


def register_family(*names: str, seam_contract: bool = True) -> Callable[[Wire], Callable[..., Retrofit]]:
    """Register ``wire(model, options, *, <family options>) -> Retrofit`` under ``names``.

    Returns the family's public ``retrofit(model, *, <common options>, <family options>)``.
    """
    if not names:
        raise InvalidParameterError("register_family: give at least one method name")

    def decorate(wire: Wire) -> Callable[..., Retrofit]:
        parameters = list(inspect.signature(wire).parameters.values())[2:]
        if any(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in parameters):
            raise InvalidParameterError(
                f"register_family: {wire.__qualname__} must take (model, options, *, <family options>)"
            )
        clash = sorted(set(names) & set(_FAMILIES))
        if clash:
            raise InvalidParameterError(f"register_family: {clash} are already registered")
        family = Family(tuple(names), wire, tuple(p.name for p in parameters), seam_contract)
        for name in names:
            _FAMILIES[name] = family
        return _public(family, parameters)

    return decorate


def _public(family: Family, family_parameters: List[inspect.Parameter]) -> Callable[..., Retrofit]:
    """``retrofit(model, **arguments)`` of one family, its signature the common options then the family's."""
    name = family.names[0]

    def retrofit(model: nn.Module, **arguments: Any) -> Retrofit:
        options, rest = RetrofitOptions.split(arguments)
        return install(name, model, options, rest)

    common = [
        inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default, annotation=field.type)
        for field in dataclasses.fields(RetrofitOptions)
    ]
    model = inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    retrofit.__signature__ = inspect.Signature([model, *common, *family_parameters])  # type: ignore[attr-defined]
    retrofit.__module__ = family.wire.__module__
    retrofit.__doc__ = (
        f"Retrofit a model of the {', '.join(family.names)} family (common options: "
        f"see RetrofitOptions).\n\n{inspect.getdoc(family.wire) or ''}"
    )
    return retrofit


def install(method: str, model: nn.Module, options: RetrofitOptions, family_options: Mapping[str, Any]) -> Retrofit:
    """Check the family options, then wire ``model``; a failed wiring is undone before the error propagates."""
    check_choice(method, "method", list_families(), owner="fly_modules.adapters.retrofit")
    family = _FAMILIES[method]
    unknown = sorted(set(family_options) - set(family.options))
    if unknown:
        raise InvalidParameterError(
            f"fly_modules.adapters.retrofit: {unknown} are not options of method {method!r}; its own options are "
            f"{list(family.options)}, the common ones {list(RetrofitOptions.names())}"
        )
    if family.seam_contract and not missing_seams(model):
        # Recognising upstream attributes on a model that declares its seams would wire the wrong ones.
        raise InvalidParameterError(
            f"fly_modules.adapters.retrofit: {type(model).__name__} implements fly_modules.adapters.SeamContract, "
            f"which the reference family drives; method {method!r} wires upstream codebases. Use method='reference'"
        )
    return _undo_on_failure(family.wire, model, options, dict(family_options))


def _undo_on_failure(wire: Wire, model: nn.Module, options: RetrofitOptions, arguments: Dict[str, Any]) -> Retrofit:
    before = getattr(model, MARKER, None)
    try:
        return wire(model, options, **arguments)
    except BaseException:
        after = getattr(model, MARKER, None)
        handle = after() if after is not None and after is not before else None
        if handle is not None:
            handle.remove()
        raise

