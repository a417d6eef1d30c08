"""The family registry: ``@register_family("dualprompt", "misa")`` declares which method names a wiring
function serves, and the dispatch every retrofit goes through (option checks, the seam contract, undo
of a failed install)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, List, Mapping, Tuple

from torch import nn

from fly_modules._validation import InvalidParameterError, check_choice

from ._handle import Retrofit
from ._install import MARKER
from ._options import RetrofitOptions

__all__ = ["Family", "SEAM_CONTRACT", "install", "list_families", "register_family"]

#: What a model implementing the seam contract of ``benchmarks.methods`` has (handled by ``reference``).
SEAM_CONTRACT = (
    "compute_query", "select", "bank_of", "banks_of_expert", "transform_logits", "get_classifier",
    "on_expert_start", "num_experts", "num_banks", "predict",
)

Wire = Callable[..., Retrofit]


@dataclasses.dataclass(frozen=True)
class Family:
    """One adapter family: the method names it serves and its wiring ``wire(model, options, **options)``.

    ``seam_contract``: a model implementing the seam contract of ``benchmarks.methods`` is wired by the
    ``reference`` family instead (the family's own options other than ``num_experts`` are then refused).
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
    wire: Wire = family.wire
    arguments = dict(family_options)
    if family.seam_contract and _implements_seam_contract(model):
        wire, arguments = _FAMILIES["reference"].wire, _seam_contract_options(method, model, arguments)
    return _undo_on_failure(wire, model, options, arguments)


def _implements_seam_contract(model: Any) -> bool:
    return all(hasattr(model, name) for name in SEAM_CONTRACT)


def _seam_contract_options(method: str, model: Any, arguments: Dict[str, Any]) -> Dict[str, Any]:
    """A seam-contract model takes no upstream option; ``num_experts`` must agree with its own."""
    num_experts = arguments.pop("num_experts", None)
    if num_experts is not None and int(num_experts) != int(model.num_experts):
        raise InvalidParameterError(
            f"fly_modules.adapters.{method}: num_experts={num_experts} disagrees with the method's "
            f"num_experts={model.num_experts}"
        )
    given = sorted(name for name, value in arguments.items() if value is not None)
    if given:
        raise InvalidParameterError(
            f"fly_modules.adapters.{method}: {type(model).__name__} implements the fly-modules seam contract "
            f"(handled by the reference adapter); the options {given} apply to upstream codebases only"
        )
    return {}


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

