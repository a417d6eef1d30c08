"""Retrofits of the router and the ensemble into existing prompt-CL codebases (``fly_modules.adapters``).

Installed from the repository's top-level ``adapters/`` folder; depends on torch only and duck-types
the user's classes. ``retrofit(model, method=...)`` dispatches to the family registered for
``method``; ``handle.verify(batch)`` checks the result on the user's own model. The Avalanche plugin
(``fly_modules.adapters.avalanche``) is imported only when asked for. See ``docs/adapters.md``.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal, Sequence, Union

import torch
from torch import nn

from fly_modules import SampleBudgetSchedule as SampleBudgetSchedule
from fly_modules import SessionSchedule as SessionSchedule
from fly_modules._validation import shared_default

from ._family import AdapterFamily as AdapterFamily
from ._family import Plan as Plan
from ._groups import expert_slot_mask as expert_slot_mask
from ._handle import Retrofit as Retrofit
from ._head import EnsembleLinear as EnsembleLinear
from ._layout import Layout as Layout
from ._log import DiagnosticsLog as DiagnosticsLog
from ._options import RetrofitOptions as RetrofitOptions
from ._options import Schedule
from ._record import Record as Record
from ._registry import canonical_method, install, list_families, method_names, spelling_key
from ._registry import register_family as register_family
from ._seams import SeamError as SeamError
from ._verify import UnrestorableStateError as UnrestorableStateError
from ._verify import VerifyReport as VerifyReport
from .contract import SeamContract as SeamContract

# The families register themselves on import.
from . import coda, dualprompt, generic, hide, l2p, mvp, reference, sdlora, sprompt  # noqa: E402, F401  isort: skip

__all__ = [
    "AdapterFamily", "DiagnosticsLog", "EnsembleLinear", "Layout", "Plan", "Record", "Retrofit", "RetrofitOptions", "SampleBudgetSchedule", "SeamContract", "SeamError", "SessionSchedule", "UnrestorableStateError", "VerifyReport", "canonical_method", "expert_slot_mask", "list_families", "method_names",
    "register_family", "retrofit", "spelling_key",
]


def retrofit(
    model: nn.Module,
    method: str,
    *,
    router: bool = True,
    ensemble: bool = True,
    optimizer: Union[torch.optim.Optimizer, str, None] = None,
    schedule: Schedule = None,
    expansion_dim: int = shared_default("expansion_dim"),
    ridge: Union[float, Literal["auto"]] = shared_default("ridge"),
    seed: int = shared_default("seed"),
    decays: Sequence[float] = shared_default("decays"),
    aggregate: str = shared_default("aggregate"),
    correct_assembly: bool = False,
    train_in_eval: bool = False,
    distributed: Any = "auto",
    **family_options: Any,
) -> Retrofit:
    """Add the analytic router and/or the temporal ensemble to ``model`` with the adapter of ``method``.

    Args:
        model: the user's model (its ``training`` flag tells training from inference; with
            ``train_in_eval=True``, whether autograd is recording does).
        method: a name of :func:`list_families` (``"l2p"``, ``"dualprompt"``, ``"misa"``, ``"mvp"``,
            ``"hide"``, ``"norga"``, ``"sprompt"``, ``"coda_prompt"``, ``"sdlora"``, ``"generic"``, ``"reference"``), in any spelling
            :func:`spelling_key` folds to one (``"coda-prompt"``; :func:`method_names` is the table). A model
            implementing :class:`SeamContract` goes to ``"reference"``: the families that recognise upstream code
            refuse it.
        router, ensemble, optimizer, schedule, expansion_dim, ridge, seed, decays, aggregate,
            correct_assembly, train_in_eval, distributed: the options every family shares (:class:`RetrofitOptions`).
        **family_options: the family's own (``num_experts``, ``original_model``, ...; see
            ``docs/adapters.md`` or ``help(fly_modules.adapters.<family>.retrofit)``).

    Returns:
        the :class:`Retrofit` handle (``end_batch``, ``start_session``, ``start_expert``,
        ``set_logit_mask``, ``verify``, ``state_dict``, ``remove``; ``record``: what its hooks recorded).
    """
    common = {name: value for name, value in locals().items() if name in RetrofitOptions.names()}
    return install(method, model, RetrofitOptions(**common), family_options)


def __getattr__(name: str) -> Any:
    # PEP 562: `fly_modules.adapters.avalanche` loads on first access only, so importing fly_modules
    # never imports Avalanche.
    if name == "avalanche":
        return importlib.import_module(f"{__name__}.avalanche")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
