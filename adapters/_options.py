"""The options every family shares, validated once, and the router and ensemble they build.

A new common option is one field here with its rule in ``_parameter_constraints`` plus its keyword in
:func:`fly_modules.adapters.retrofit`'s signature (a test keeps the two equal); no family module changes.
The options the router and the ensemble share take their rule and default from the library's table
(``fly_modules._validation.SHARED_PARAMETERS``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, Literal, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from fly_modules import AnalyticRouter, SampleBudgetSchedule, SessionSchedule, TemporalEnsembleHead
from fly_modules._validation import (
    Constraint,
    InvalidParameterError,
    OneOf,
    shared_constraints,
    shared_default,
    validate_parameters,
)

__all__ = ["RetrofitOptions", "Schedule"]

Schedule = Union[SampleBudgetSchedule, SessionSchedule, None]
_OWNER = "fly_modules.adapters.retrofit"


class _Optimizer(Constraint):
    def convert(self, value: Any, name: str) -> Any:
        if value is None or (isinstance(value, str) and value == "auto") or isinstance(value, torch.optim.Optimizer):
            return value
        raise InvalidParameterError(f"{name} must be a torch.optim.Optimizer, 'auto' or None, got {value!r}")


class _Schedule(Constraint):
    def convert(self, value: Any, name: str) -> Any:
        if value is None or isinstance(value, (SampleBudgetSchedule, SessionSchedule)):
            return value
        raise InvalidParameterError(
            f"{name} must be a SampleBudgetSchedule, a SessionSchedule or None, got {type(value).__name__}")


class _Distributed(Constraint):
    def convert(self, value: Any, name: str) -> Any:
        group_type = getattr(dist, "ProcessGroup", None) if dist.is_available() else None
        if (isinstance(value, str) and value == "auto") or value is False or \
                (group_type is not None and isinstance(value, group_type)):
            return value
        raise InvalidParameterError(
            f"{name} must be 'auto', False (this process trains alone) or a torch.distributed process group, "
            f"got {value!r}")


_SWITCH = OneOf((True, False))


@dataclasses.dataclass(frozen=True)
class RetrofitOptions:
    """What to add and how (the paper's settings by default).

    Attributes:
        router, ensemble: add the analytic router / the temporal ensemble (both ``False``: only the
            schedule is driven, the model is untouched).
        optimizer: the EMA copies move after each of its steps, and after those of an optimizer that
            later takes over the classifier (a loop that re-creates it); ``"auto"``: after each step of
            any optimizer that trains the classifier (frameworks that build it internally); ``None``:
            call ``handle.update_ensemble()`` after each step yourself.
        schedule: ``SampleBudgetSchedule`` (driven by ``end_batch``), ``SessionSchedule``
            (``start_session``) or ``None`` (experts start only through ``handle.start_expert``).
        expansion_dim, ridge, seed: the router's (paper: 10,000, 1e4; ``expansion_dim=0``: no expansion,
            ridge regression on the query features themselves).
        decays, aggregate: the ensemble's (paper: (0.9, 0.99), ``"softmax_max"``).
        correct_assembly: correct an upstream prompt assembly that mixes the samples of a batch (the
            JH-LEE prefix E-prompt lineage), for every variant, ``router=False`` included; without it,
            ``router=True`` on such a model raises ``SeamError`` and ``router=False`` leaves it as it is.
        train_in_eval: a forward with autograd recording is a training forward whatever the model's mode (a
            loop that calls ``model.eval()`` before its training steps; inference then runs under
            ``torch.no_grad()`` or ``torch.inference_mode()``); without it the model's mode decides, and a
            backward through an eval-mode output raises.
        distributed: the processes of a data-parallel run that train one method together: ``"auto"``, all
            of them when ``torch.distributed`` is initialised with more than one (else none); ``False``, this
            process trains alone; or a process group. Every process's router then holds every process's rows
            and the schedule counts the global batch (docs/adapters.md, "Several processes and mixed precision").
    """

    router: bool = True
    ensemble: bool = True
    optimizer: Union[torch.optim.Optimizer, str, None] = None
    schedule: Schedule = None
    expansion_dim: int = shared_default("expansion_dim")
    ridge: Union[float, Literal["auto"]] = shared_default("ridge")
    seed: int = shared_default("seed")
    decays: Tuple[float, ...] = shared_default("decays")
    aggregate: str = shared_default("aggregate")
    correct_assembly: bool = False
    train_in_eval: bool = False
    distributed: Any = "auto"

    #: the rules of the options, in the order they are checked (the shared ones from the library's table)
    _parameter_constraints: ClassVar[Dict[str, Constraint]] = {
        "router": _SWITCH, "ensemble": _SWITCH, "optimizer": _Optimizer(), "schedule": _Schedule(),
        **shared_constraints("expansion_dim", "ridge", "seed", "decays", "aggregate"),
        "correct_assembly": _SWITCH, "train_in_eval": _SWITCH, "distributed": _Distributed(),
    }

    def __post_init__(self) -> None:
        values = {name: getattr(self, name) for name in self._parameter_constraints}
        for name, value in validate_parameters(self._parameter_constraints, values, caller=_OWNER).items():
            object.__setattr__(self, name, value)

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def split(cls, arguments: Mapping[str, Any]) -> Tuple["RetrofitOptions", Dict[str, Any]]:
        """``(options, rest)``: the common options found in ``arguments`` and everything else."""
        names = cls.names()
        options = cls(**{name: value for name, value in arguments.items() if name in names})
        return options, {name: value for name, value in arguments.items() if name not in names}

    def build_router(self, in_features: int, num_experts: int, device: Optional[torch.device]) -> Optional[AnalyticRouter]:
        if not self.router:
            return None
        return AnalyticRouter(
            int(in_features), int(num_experts), expansion_dim=self.expansion_dim, ridge=self.ridge, seed=self.seed,
            device=device,
        )

    def build_ensemble(self, classifier: nn.Module, num_banks: int) -> Optional[TemporalEnsembleHead]:
        if not self.ensemble:
            return None
        return TemporalEnsembleHead(classifier, int(num_banks), decays=self.decays, aggregate=self.aggregate)
