"""Argument checks, and the table of the parameters every layer shares (:data:`SHARED_PARAMETERS`).

Every check raises before any state is touched, so a rejected call leaves the statistics as they
were. Messages say what was found and what was expected (scikit-learn's convention).

Each class declares the rules of its arguments once, in ``_parameter_constraints`` (scikit-learn's
idea), built from the table's entries (:func:`shared_constraints`) and checked in that order by
:func:`validate_parameters`. The table also holds each shared parameter's default: every signature
reads it with :func:`shared_default`, so the paper's settings are written here only.

Private, but supported for ``benchmarks/``: the benchmarks check their own arguments with
:func:`check_int` and the rules here, and every flag of their commands is checked by a rule
(``benchmarks/flags.py``), so that a flag refuses exactly what the library refuses, with the same
message. Nothing else of the core's private modules is theirs to import (``tests/test_layers.py``).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Collection, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "InvalidParameterError", "NotFittedError", "Constraint", "Integer", "Real", "OneOf", "Ridge", "Decays",
    "PositiveReals", "NoneOr", "Parameter", "REQUIRED", "AGGREGATION_RULES", "SHARED_PARAMETERS", "shared_default",
    "shared_constraints", "validate_parameters", "check_shared", "check_int", "check_float", "check_choice",
    "check_features", "check_expert_ids", "check_logit_mask", "check_member_logits", "check_mask_dtype",
    "finite_peak",
]


class InvalidParameterError(ValueError, TypeError):
    """An argument has the wrong type or value; the message names the caller, the parameter, what is
    allowed and what was given.

    Subclasses both ``ValueError`` and ``TypeError`` (scikit-learn's convention): a wrong value and a
    wrong type are one kind of mistake, caught as either.
    """


class Constraint:
    """A rule for the values of one parameter.

    :meth:`convert` returns the value as the library keeps it, or raises :class:`InvalidParameterError`
    whose message says, without the caller, what was expected and what was found ("ridge must be ...,
    got -1.0"); :meth:`check` prefixes the caller. The command line shows the same message for its flag.
    """

    def convert(self, value: Any, name: str) -> Any:
        raise NotImplementedError

    def check(self, value: Any, name: str, *, caller: str) -> Any:
        try:
            return self.convert(value, name)
        except InvalidParameterError as error:
            raise InvalidParameterError(f"{caller}: {error}") from None


def _bounds(low: Optional[float], high: Optional[float], *, closed: bool) -> str:
    """`` in [low, high]``, `` >= low``, `` <= high`` (``closed``; ints as they are), or `` in (low, high)``,
    `` > low``, `` < high`` (numbers as ``:g``); empty without bounds."""
    text = str if closed else (lambda number: f"{number:g}")
    if low is not None and high is not None:
        return f" in [{low}, {high}]" if closed else f" in ({text(low)}, {text(high)})"
    if low is not None:
        return f" {'>=' if closed else '>'} {text(low)}"
    if high is not None:
        return f" {'<=' if closed else '<'} {text(high)}"
    return ""


@dataclass(frozen=True)
class Integer(Constraint):
    """A Python int in ``[minimum, maximum]`` (either bound optional): anything with ``__index__`` (numpy
    and 0-d integer tensors included) except ``bool``."""

    minimum: Optional[int] = None
    maximum: Optional[int] = None

    def convert(self, value: Any, name: str) -> int:
        low, high = self.minimum, self.maximum
        bound = _bounds(low, high, closed=True)
        if isinstance(value, bool) or (isinstance(value, Tensor) and value.dtype == torch.bool):
            raise InvalidParameterError(f"{name} must be an int{bound}, got {value!r}")
        try:
            number = operator.index(value)
        except TypeError:
            raise InvalidParameterError(f"{name} must be an int{bound}, got {type(value).__name__} {value!r}") from None
        if (low is not None and number < low) or (high is not None and number > high):
            raise InvalidParameterError(f"{name} must be an int{bound}, got {number}")
        return number


@dataclass(frozen=True)
class Real(Constraint):
    """A finite Python float strictly between ``above`` and ``below``, and within ``[minimum, maximum]``
    (every bound optional): real numbers (numpy scalars and 0-d tensors included) except ``bool``."""

    above: Optional[float] = None
    below: Optional[float] = None
    minimum: Optional[float] = None
    maximum: Optional[float] = None

    def _bound(self) -> str:
        """`` in (a, b]``, `` > a``, `` <= b``...: each side's closed bound if given, else its open one."""
        low = ("[", ">=", self.minimum) if self.minimum is not None else ("(", ">", self.above)
        high = ("]", "<=", self.maximum) if self.maximum is not None else (")", "<", self.below)
        if low[2] is not None and high[2] is not None:
            return f" in {low[0]}{low[2]:g}, {high[2]:g}{high[0]}"
        side = low if low[2] is not None else high
        return f" {side[1]} {side[2]:g}" if side[2] is not None else ""

    def convert(self, value: Any, name: str) -> float:
        above, below = self.above, self.below
        bound = self._bound()
        expected = f"{name} must be finite{' and' if bound else ''}{bound}"
        if isinstance(value, bool) or (isinstance(value, Tensor) and (value.dtype == torch.bool or value.numel() != 1)):
            raise InvalidParameterError(f"{expected}, got {value!r}")
        if not isinstance(value, (numbers.Real, Tensor)):
            raise InvalidParameterError(f"{expected}, got {type(value).__name__} {value!r}")
        number = float(value)
        if (not math.isfinite(number) or (above is not None and number <= above) or (below is not None and number >= below)
                or (self.minimum is not None and number < self.minimum) or (self.maximum is not None and number > self.maximum)):
            raise InvalidParameterError(f"{expected}, got {number!r}")
        return number


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of ``choices`` (same type and equal: ``True`` is not ``1``)."""

    choices: Tuple[Any, ...]

    def convert(self, value: Any, name: str) -> Any:
        if not isinstance(value, Tensor) and any(type(value) is type(c) and value == c for c in self.choices):
            return value
        raise InvalidParameterError(f"{name} must be one of {tuple(self.choices)}, got {value!r}")


@dataclass(frozen=True)
class Ridge(Constraint):
    """``"auto"`` or a finite number > 0 (``G + ridge I`` must be positive definite)."""

    def convert(self, value: Any, name: str) -> Union[float, str]:
        if isinstance(value, str) and value == "auto":
            return value
        try:
            return Real(above=0).convert(value, name)
        except InvalidParameterError:
            raise InvalidParameterError(f"{name} must be a finite number > 0 or 'auto', got {value!r}") from None


@dataclass(frozen=True)
class Decays(Constraint):
    """A non-empty sequence of distinct numbers in ``(0, 1)``, as a tuple of floats."""

    def convert(self, value: Any, name: str) -> Tuple[float, ...]:
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or (isinstance(value, Tensor) and not value.ndim):
            raise InvalidParameterError(f"{name} must be a non-empty sequence of distinct numbers in (0, 1), got {value!r}")
        decays = tuple(Real(above=0, below=1).convert(d, f"{name}[{i}]") for i, d in enumerate(value))
        if not decays:
            raise InvalidParameterError(f"{name} must hold at least one value, got an empty sequence")
        if len(set(decays)) != len(decays):
            raise InvalidParameterError(f"{name} must be distinct, got {decays}")
        return decays


@dataclass(frozen=True)
class PositiveReals(Constraint):
    """A non-empty sequence of finite numbers > 0, as a list of floats (a grid of ridges)."""

    def convert(self, value: Any, name: str) -> List[float]:
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or (isinstance(value, Tensor) and not value.ndim):
            raise InvalidParameterError(f"{name} must be a non-empty sequence of finite numbers > 0, got {value!r}")
        values = [Real(above=0).convert(v, f"{name}[{i}]") for i, v in enumerate(value)]
        if not values:
            raise InvalidParameterError(f"{name} must hold at least one value, got an empty sequence")
        return values


@dataclass(frozen=True)
class NoneOr(Constraint):
    """``None`` (kept as it is) or a value of ``rule`` (with ``rule``'s message)."""

    rule: Constraint

    def convert(self, value: Any, name: str) -> Any:
        return None if value is None else self.rule.convert(value, name)


class _Required:
    """The default of a parameter that has none in common (each class picks its own)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Parameter(Constraint):
    """An entry of :data:`SHARED_PARAMETERS`: the rule, the default every layer uses (the paper's) and
    what the value means (the help of its command-line flag). Checks as its rule does."""

    rule: Constraint
    default: Any = REQUIRED
    help: str = ""

    def convert(self, value: Any, name: str) -> Any:
        return self.rule.convert(value, name)


#: How the ensemble's members are combined (``fly_modules.aggregate_logits``; the paper's is ``softmax_max``).
#: ``logit_min_entropy`` is the official code's ``min_entropy`` (docs/ensemble.md).
AGGREGATION_RULES = ("mean", "max_prob", "min_entropy", "softmax_mean", "softmax_max", "softmax_min_entropy",
                     "logit_min_entropy")

#: The parameters that the router, the ensemble, ``fly_modules.adapters.RetrofitOptions`` and the
#: benchmarks' command line share, each rule and default written once: a value means the same in every
#: layer, and every signature's default is read from here (the paper's settings). ``expansion_dim=0``
#: means no expansion (ridge regression on the features themselves).
SHARED_PARAMETERS: Dict[str, Parameter] = {
    "num_experts": Parameter(Integer(minimum=0), help="experts (steps, tasks or prompt groups)"),
    "expansion_dim": Parameter(Integer(minimum=0), 10_000,
                               "router random-expansion width M (0: no expansion, ridge regression on the features)"),
    "ridge": Parameter(Ridge(), 1e4, "router ridge lambda > 0, or 'auto' (generalised cross-validation)"),
    "seed": Parameter(Integer(), 0, "seed of the random draws"),
    "decays": Parameter(Decays(), (0.9, 0.99), "comma-separated EMA decays of the ensemble, distinct, in (0, 1)"),
    "aggregate": Parameter(OneOf(AGGREGATION_RULES), "softmax_max",
                           "ensemble aggregation rule, one of " + ", ".join(AGGREGATION_RULES)),
}


def shared_default(name: str) -> Any:
    """The default of the shared parameter ``name`` (what every signature and flag defaults to)."""
    default = SHARED_PARAMETERS[name].default
    if default is REQUIRED:
        raise KeyError(f"the shared parameter {name!r} has no common default")
    return default


def shared_constraints(*names: str, **own: Constraint) -> Dict[str, Constraint]:
    """A class's ``_parameter_constraints``: the shared entries ``names`` and its ``own`` rules, in the
    order given (shared first), the order :func:`validate_parameters` checks them in."""
    return {**{name: SHARED_PARAMETERS[name] for name in names}, **own}


def validate_parameters(constraints: Dict[str, Constraint], values: Dict[str, Any], *, caller: str) -> Dict[str, Any]:
    """Every value of ``values`` converted by its rule in ``constraints`` (the first refused raises
    :class:`InvalidParameterError` naming ``caller``), in the order of ``constraints``."""
    return {name: rule.check(values[name], name, caller=caller) for name, rule in constraints.items()}


def check_shared(value: Any, name: str, *, caller: str) -> Any:
    """``value`` of the shared parameter ``name`` as :data:`SHARED_PARAMETERS` converts it."""
    return SHARED_PARAMETERS[name].check(value, name, caller=caller)


def check_int(
    value: Any, name: str, *, caller: str, minimum: Optional[int] = None, maximum: Optional[int] = None
) -> int:
    """``value`` as a Python int in ``[minimum, maximum]`` (:class:`Integer`)."""
    return Integer(minimum, maximum).check(value, name, caller=caller)


def check_float(
    value: Any, name: str, *, caller: str, above: Optional[float] = None, below: Optional[float] = None
) -> float:
    """``value`` as a finite Python float strictly between ``above`` and ``below`` (:class:`Real`)."""
    return Real(above, below).check(value, name, caller=caller)


def check_choice(value: Any, name: str, choices: Collection[Any], *, caller: str) -> Any:
    """``value`` if it is one of ``choices`` (:class:`OneOf`)."""
    return OneOf(tuple(choices)).check(value, name, caller=caller)


class NotFittedError(ValueError):
    """Raised when a router or ensemble is used before it has the state it needs.

    A ``ValueError`` and, unlike scikit-learn's, not an ``AttributeError``: raised inside a property
    (``AnalyticRouter.weight``), an ``AttributeError`` is swallowed by ``nn.Module.__getattr__``,
    ``hasattr`` and ``getattr(obj, name, default)``, which then report a different, missing attribute.
    """


def check_features(
    features: Tensor,
    in_features: int,
    *,
    caller: str,
    device: torch.device,
    allow_empty: bool = False,
    check_finite: bool = True,
) -> Tensor:
    """Validate a ``(N, in_features)`` floating-point batch on ``device`` (non-empty unless allowed).

    Everything but finiteness is read from the tensor's metadata; ``check_finite=False`` skips the
    one check that needs the values (a host synchronisation on an accelerator).
    """
    if not isinstance(features, Tensor):
        raise InvalidParameterError(f"{caller}: features must be a torch.Tensor, got {type(features).__name__}")
    if features.ndim != 2:
        hint = " (a single sample needs features.unsqueeze(0))" if features.ndim == 1 else ""
        raise InvalidParameterError(
            f"{caller}: features must have shape (N, {in_features}), got a {features.ndim}-d tensor "
            f"of shape {tuple(features.shape)}{hint}"
        )
    if not features.is_floating_point():
        raise InvalidParameterError(
            f"{caller}: features must be floating point, got dtype {features.dtype} "
            f"(convert with features.float())"
        )
    if features.shape[1] != in_features:
        raise InvalidParameterError(
            f"{caller}: features have {features.shape[1]} columns but the module was built with "
            f"in_features={in_features}"
        )
    if features.shape[0] == 0 and not allow_empty:
        raise InvalidParameterError(f"{caller}: features hold an empty batch (shape {tuple(features.shape)})")
    if features.device != device:
        raise InvalidParameterError(
            f"{caller}: features are on {features.device} but the module's state is on {device}; "
            f"move one of them (module.to({features.device}) or features.to({device}))"
        )
    if check_finite and not bool(torch.isfinite(features).all()):
        raise _not_finite(features, caller)
    return features


def finite_peak(features: Tensor, *, caller: str) -> float:
    """``max |features|`` (one reduction, one host read); raises when the features are not all finite."""
    peak = float(features.abs().amax()) if features.numel() else 0.0
    if not math.isfinite(peak):
        raise _not_finite(features, caller)
    return peak


def _not_finite(features: Tensor, caller: str) -> InvalidParameterError:
    n_nan = int(torch.isnan(features).sum())
    n_inf = int(torch.isinf(features).sum())
    return InvalidParameterError(f"{caller}: features contain {n_nan} NaN and {n_inf} infinite values")


def check_expert_ids(
    expert_ids: Union[int, Tensor],
    batch_size: int,
    num_experts: int,
    *,
    caller: str,
    device: torch.device,
    check_range: bool = True,
) -> Tensor:
    """Turn one id for the batch or one id per sample into a validated ``(N,)`` long tensor.

    ``check_range=False`` skips the range check of an id *tensor* (it reads the values: a host
    synchronisation on an accelerator); a Python int is always checked.
    """
    if not isinstance(expert_ids, Tensor):
        expert = check_int(expert_ids, "expert id", caller=caller)
        _check_expert_range(expert, expert, num_experts, caller)
        return torch.full((batch_size,), expert, dtype=torch.long, device=device)
    if expert_ids.is_floating_point() or expert_ids.is_complex() or expert_ids.dtype == torch.bool:
        raise InvalidParameterError(f"{caller}: expert ids must be integers, got dtype {expert_ids.dtype}")
    if expert_ids.ndim == 0:
        ids = expert_ids.to(device=device, dtype=torch.long).expand(batch_size)
    elif expert_ids.ndim == 1:
        if expert_ids.shape[0] != batch_size:
            raise InvalidParameterError(
                f"{caller}: got {expert_ids.shape[0]} expert ids for a batch of {batch_size} samples"
            )
        ids = expert_ids.to(device=device, dtype=torch.long)
    else:
        raise InvalidParameterError(
            f"{caller}: expert ids must be a scalar or have shape ({batch_size},), got shape {tuple(expert_ids.shape)}"
        )
    if check_range and ids.numel():
        _check_expert_range(int(ids.min()), int(ids.max()), num_experts, caller)
    return ids


def _check_expert_range(low: int, high: int, num_experts: int, caller: str) -> None:
    if low < 0:
        raise InvalidParameterError(f"{caller}: expert ids must be non-negative, got {low}")
    if high >= num_experts:
        raise InvalidParameterError(
            f"{caller}: expert id {high} does not exist (num_experts={num_experts}); create it first with add_expert()"
        )


def check_logit_mask(mask: Any, batch_size: int, num_classes: int, *, caller: str, device: torch.device) -> Tensor:
    """Validate an additive logit mask, ``(num_classes,)`` or ``(batch_size, num_classes)`` floating point
    (0 where a class may be predicted, ``-inf`` elsewhere), and return it on ``device`` (metadata only)."""
    shapes = f"({num_classes},) or ({batch_size}, {num_classes})"
    if not isinstance(mask, Tensor):
        raise InvalidParameterError(f"{caller}: logit_mask must be a torch.Tensor of shape {shapes}, got "
                                    f"{type(mask).__name__}")
    if tuple(mask.shape) not in ((num_classes,), (batch_size, num_classes)):
        raise InvalidParameterError(
            f"{caller}: logit_mask must have shape {shapes} (one entry per class of the head's {num_classes}), got "
            f"shape {tuple(mask.shape)}"
        )
    if not mask.is_floating_point():
        raise InvalidParameterError(
            f"{caller}: logit_mask must be an additive floating-point mask (0 where a class may be predicted, -inf "
            f"elsewhere), got dtype {mask.dtype}; build it with fly_modules.class_mask or seen_class_mask"
        )
    return mask.to(device)


def check_member_logits(member_logits: Any, *, caller: str) -> Tensor:
    """Validate the members' logits ``(N, H, C)``, floating point, with at least one member."""
    shape = tuple(getattr(member_logits, "shape", ()))
    if not isinstance(member_logits, Tensor) or member_logits.ndim != 3 or shape[1] == 0:
        raise InvalidParameterError(
            f"{caller}: member_logits must be a tensor of shape (N, H, C) with H >= 1 members, got "
            f"{type(member_logits).__name__ if not isinstance(member_logits, Tensor) else f'shape {shape}'}"
        )
    if not member_logits.is_floating_point():
        raise InvalidParameterError(f"{caller}: member_logits must be floating point, got dtype {member_logits.dtype}")
    return member_logits


def check_mask_dtype(dtype: Any, *, caller: str) -> torch.dtype:
    """A mask's dtype: floating point, the only kind that holds ``-inf``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidParameterError(f"{caller}: dtype must be a floating-point torch.dtype (the mask holds -inf), "
                                    f"got {dtype}")
    return dtype
