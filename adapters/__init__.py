"""Retrofits of the router and the ensemble into existing prompt-CL codebases (``fly_modules.adapters``).

Installed from the repository's top-level ``adapters/`` folder as the subpackage
``fly_modules.adapters``; like the core it depends on torch only and duck-types the user's classes.

``retrofit(model, method="dualprompt", router=True, ensemble=True, optimizer=opt, schedule=...)``
dispatches to the module of the method's family (``l2p``; ``dualprompt`` for DualPrompt and MISA;
``mvp``; ``hide`` for HiDe-Prompt and NoRGa; ``generic`` with explicit seams; ``reference`` for the
seam contract of ``benchmarks.methods``). Each family module hands models that implement the seam
contract to ``reference``, recognises the upstream codebases it supports by their attribute names, and
raises a :class:`SeamError` naming what is missing otherwise.
The Avalanche plugin (``fly_modules.adapters.avalanche``) is imported only when asked for.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, List

from torch import nn

from ._core import Retrofit as Retrofit
from ._core import SeamError as SeamError

__all__ = ["Retrofit", "SeamError", "retrofit", "list_families"]

# method name -> family module
_FAMILIES: Dict[str, str] = {
    "reference": "reference",
    "generic": "generic",
    "l2p": "l2p",
    "dualprompt": "dualprompt",
    "misa": "dualprompt",
    "mvp": "mvp",
    "hide": "hide",
    "norga": "hide",
}


def list_families() -> List[str]:
    """Method names ``retrofit`` accepts."""
    return sorted(_FAMILIES)


def retrofit(model: nn.Module, method: str, **kwargs: Any) -> Retrofit:
    """Retrofit ``model`` with the adapter of ``method``'s family; ``kwargs`` go to that adapter."""
    try:
        family = _FAMILIES[method]
    except KeyError:
        raise KeyError(f"unknown method {method!r}; known: {', '.join(list_families())}") from None
    return importlib.import_module(f"{__name__}.{family}").retrofit(model, **kwargs)


def __getattr__(name: str) -> Any:
    # PEP 562: `fly_modules.adapters.avalanche` (and the family modules) load on first access only,
    # so importing fly_modules never imports Avalanche.
    if name == "avalanche" or name in set(_FAMILIES.values()):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
