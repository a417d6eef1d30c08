"""The options every family shares, validated once, and the router and ensemble they build.

A new common option is one field here plus its keyword in :func:`fly_modules.adapters.retrofit`'s
signature (a test keeps the two equal); no family module changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Literal, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from fly_modules import AnalyticRouter, SampleBudgetSchedule, SessionSchedule, TemporalEnsembleHead
from fly_modules._validation import InvalidParameterError, check_choice, check_shared

__all__ = ["RetrofitOptions", "Schedule"]

Schedule = Union[SampleBudgetSchedule, SessionSchedule, None]
_OWNER = "fly_modules.adapters.retrofit"
#: the options the router and the ensemble check by the same rules
_SHARED = ("expansion_dim", "ridge", "seed", "decays", "aggregate")


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
    """

    router: bool = True
    ensemble: bool = True
    optimizer: Union[torch.optim.Optimizer, str, None] = None
    schedule: Schedule = None
    expansion_dim: int = 10_000
    ridge: Union[float, Literal["auto"]] = 1e4
    seed: int = 0
    decays: Tuple[float, ...] = (0.9, 0.99)
    aggregate: str = "softmax_max"
    correct_assembly: bool = False

    def __post_init__(self) -> None:
        check_choice(self.router, "router", (True, False), caller=_OWNER)
        check_choice(self.ensemble, "ensemble", (True, False), caller=_OWNER)
        if not (self.optimizer is None or self.optimizer == "auto" or isinstance(self.optimizer, torch.optim.Optimizer)):
            raise InvalidParameterError(
                f"{_OWNER}: optimizer must be a torch.optim.Optimizer, 'auto' or None, got {self.optimizer!r}"
            )
        if self.schedule is not None and not isinstance(self.schedule, (SampleBudgetSchedule, SessionSchedule)):
            raise InvalidParameterError(
                f"{_OWNER}: schedule must be a SampleBudgetSchedule, a SessionSchedule or None, "
                f"got {type(self.schedule).__name__}"
            )
        for name in _SHARED:  # the router's and the ensemble's rules (fly_modules._validation.SHARED_PARAMETERS)
            object.__setattr__(self, name, check_shared(getattr(self, name), name, caller=_OWNER))
        check_choice(self.correct_assembly, "correct_assembly", (True, False), caller=_OWNER)

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
