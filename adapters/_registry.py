"""The family registry: ``@register_family`` declares which method names a family serves, and the
dispatch every retrofit goes through (a live retrofit refused first, option checks, the refusal of
seam-contract models by the families that recognise upstream code, undo of a failed install).

A family is an :class:`~fly_modules.adapters.AdapterFamily` subclass, registered by ``@register_family`` on
the class: its ``names``, ``seam_contract`` and the keyword-only parameters of its ``recognise``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, List, Mapping, Tuple, Type

from torch import nn

from fly_modules._validation import InvalidParameterError, check_choice
from fly_modules.distributed import refuse_parallel_wrapper

from ._family import AdapterFamily
from ._handle import Retrofit, already_retrofitted, live_retrofit
from ._options import RetrofitOptions
from ._restore import registered_retrofit
from .contract import missing_seams

__all__ = ["Family", "canonical_method", "install", "list_families", "method_names", "register_family", "spelling_key"]


@dataclasses.dataclass(frozen=True)
class Family:
    """One registered family: the method names it serves, its class and the names of its own options.

    ``seam_contract``: the family recognises upstream code, so a model implementing
    :class:`~fly_modules.adapters.SeamContract` is refused with a pointer to the ``reference`` family,
    which drives the declared seams (``False``: the family wires whatever model it is given).
    """

    names: Tuple[str, ...]
    cls: Type[AdapterFamily]
    options: Tuple[str, ...]
    seam_contract: bool
    module: str
    doc: str


_FAMILIES: Dict[str, Family] = {}


def spelling_key(name: str) -> str:
    """The one rule of method spellings: case, ``-`` and ``_`` do not matter (``"coda-prompt"``,
    ``"CODA_Prompt"`` and ``"codaprompt"`` are one method); the benchmarks read method names by it too."""
    return name.lower().replace("-", "").replace("_", "")


def list_families() -> List[str]:
    """Method names ``retrofit`` accepts (each also in any spelling :func:`spelling_key` folds to it)."""
    return sorted(_FAMILIES)


def method_names() -> Dict[str, Tuple[str, ...]]:
    """The table of method names: each canonical name (what a handle reports as its ``family``) and its
    registered aliases; any spelling :func:`spelling_key` folds to one of them is that method
    (``"coda-prompt"`` is ``"coda_prompt"``). ``"misa"`` and ``"dualprompt"`` are two methods of one family."""
    table: Dict[str, Tuple[str, ...]] = {}
    for family in dict.fromkeys(_FAMILIES.values()):
        for name in family.names:
            canonical = next(n for n in family.names if spelling_key(n) == spelling_key(name))
            table.setdefault(canonical, ())
            if name != canonical:
                table[canonical] += (name,)
    return dict(sorted(table.items()))


def canonical_method(method: Any, *, caller: str = "fly_modules.adapters.retrofit") -> str:
    """The canonical name (:func:`method_names`) that ``method`` spells, else :class:`InvalidParameterError`
    listing the names."""
    if isinstance(method, str):
        found = [name for name in method_names() if spelling_key(name) == spelling_key(method)]
        if found:
            return found[0]
    return check_choice(method, "method", list_families(), caller=caller)


def register_family(cls: type) -> Callable[..., Retrofit]:
    """``@register_family`` on an :class:`~fly_modules.adapters.AdapterFamily` subclass registers it under its
    ``names``; returns its public ``retrofit(model, *, <common options>, <family options>)``, documented by the
    class docstring."""
    if not isinstance(cls, type) or not issubclass(cls, AdapterFamily) or not cls.names \
            or not all(isinstance(n, str) for n in cls.names):
        raise InvalidParameterError(
            f"register_family: {getattr(cls, '__qualname__', cls)!r} must be an AdapterFamily subclass with "
            "names = ('<method>', ...)"
        )
    parameters = _family_parameters(cls.recognise, 1,
                                    f"{cls.__qualname__}.recognise must take (self, *, <family options>)")
    family = Family(tuple(cls.names), cls, tuple(p.name for p in parameters), cls.seam_contract,
                    cls.__module__, inspect.getdoc(cls) or "")
    return _register(family, parameters)


def _family_parameters(function: Callable[..., Any], leading: int, expected: str) -> List[inspect.Parameter]:
    """The keyword-only parameters after the ``leading`` positional ones; any other kind is refused."""
    parameters = list(inspect.signature(function).parameters.values())[leading:]
    if any(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in parameters):
        raise InvalidParameterError(f"register_family: {expected}")
    return parameters


def _register(family: Family, parameters: List[inspect.Parameter]) -> Callable[..., Retrofit]:
    taken = {spelling_key(name) for name in _FAMILIES}
    clash = sorted(name for name in family.names if spelling_key(name) in taken)
    if clash:
        raise InvalidParameterError(f"register_family: {clash} are already registered")
    for name in family.names:
        _FAMILIES[name] = family
    return _public(family, parameters)


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
    retrofit.__module__ = family.module
    retrofit.__doc__ = (
        f"Retrofit a model of the {', '.join(family.names)} family (common options: "
        f"see RetrofitOptions).\n\n{family.doc}"
    )
    return retrofit


def install(method: str, model: nn.Module, options: RetrofitOptions, family_options: Mapping[str, Any]) -> Retrofit:
    """Refuse a live retrofit, check the family options, then wire ``model``; a failed wiring is undone
    before the error propagates."""
    # A registered name is kept as given (the handle's `family`, which its checkpoints carry); another spelling
    # becomes its canonical name.
    method = method if isinstance(method, str) and method in _FAMILIES else canonical_method(method)
    _refuse_a_non_module(model)
    refuse_parallel_wrapper(model, "fly_modules.adapters.retrofit")
    previous = live_retrofit(model)
    if previous is not None:  # before any seam check: the seams now show the first retrofit's wrappers
        raise already_retrofitted(model, previous)
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
    return _undo_on_failure(family.cls, method, model, options, dict(family_options))


def _refuse_a_non_module(model: Any) -> None:
    """A trainer holding the network (PyCIL's and LAMDA-PILOT's ``learner._network``) is not the model: name
    the attributes of it that are modules."""
    if isinstance(model, nn.Module):
        return
    held = sorted(name for name, value in vars(model).items() if isinstance(value, nn.Module)) \
        if hasattr(model, "__dict__") else []
    kind = type(model).__name__
    hint = (f"; pass {kind.lower()}.{held[0]}" + (f" (its modules: {', '.join(held)})" if len(held) > 1 else "")
            if held else "; pass the network itself")
    raise InvalidParameterError(f"fly_modules.adapters.retrofit: expected an nn.Module, got a {kind}{hint}")


def _undo_on_failure(cls: Type[AdapterFamily], method: str, model: nn.Module, options: RetrofitOptions,
                     arguments: Dict[str, Any]) -> Retrofit:
    before = registered_retrofit(model)
    try:
        return cls.retrofit(model, options, arguments, method=method)
    except BaseException:
        handle = registered_retrofit(model)
        if handle is not None and handle is not before:
            handle.remove()
        raise
