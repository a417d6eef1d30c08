"""kangzhiq/MISA's own code, loaded read-only from a checkout the user names: its argument parser, its
DualPrompt model and trainer, its optimizer and scheduler factories.

Nothing in the checkout is written or copied. In memory only, while its modules are imported:

* the checkout's top-level packages (``models``, ``methods``, ``utils``, ...) are imported with the
  checkout first on ``sys.path`` and removed from ``sys.modules`` afterwards (the classes keep working),
  as ``benchmarks.core.reference_checkout`` does for FlyGCL;
* the data pipeline (``datasets``, ``utils.data_loader``) and what only the full run uses
  (``pandas``, ``sklearn``, ``matplotlib``, tensorboard's writer, which the modules open on import
  and which would write a folder) are inert stand-ins;
* timm's model registry and ViT configurations are restored afterwards (the modules register
  ``vit_base_patch16_224`` over timm's own).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.machinery
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

from benchmarks.core.reference_checkout import FLYGCL, CheckoutError, timm_registry_kept

__all__ = ["FLYGCL_FILES", "MISA", "MISACheckout", "load_misa", "REQUIRED_FILES"]

MISA = "kangzhiq/MISA"  # the repository a checkout loaded here is of

REQUIRED_FILES = (
    "configuration/config.py", "models/vit.py", "models/dualprompt.py", "methods/_trainer.py",
    "methods/dualprompt.py", "utils/train_utils.py", "utils/memory.py",
)
#: files of an AnAppleCore/FlyGCL checkout that a MISA checkout lacks (FlyGCL has MISA's layout too)
FLYGCL_FILES = ("models/flyprompt.py", "methods/flyprompt.py")
_TOP_LEVEL = ("models", "methods", "utils", "datasets", "optim", "configuration")
# Imported by the trainer modules for the full run only (plots, data frames, t-SNE, logs).
_INERT = ("pandas", "sklearn", "sklearn.manifold", "matplotlib", "matplotlib.pyplot", "torch.utils.tensorboard",
          "datasets", "utils.data_loader")


@dataclass
class MISACheckout:
    """What the comparison uses of one MISA checkout."""

    path: Path
    vit: types.ModuleType           # models.vit (its VisionTransformer is the official backbone)
    model_module: types.ModuleType  # models.dualprompt (its ``timm`` is swapped while a model is built)
    model_class: type               # models.dualprompt.DualPrompt
    trainer_class: type             # methods.dualprompt.DualPrompt
    base_parser: Callable[[], Any]  # configuration.config.base_parser (reads sys.argv)
    select_optimizer: Callable[..., Any]
    select_scheduler: Callable[..., Any]
    memory_class: type              # utils.memory.Memory


class _Inert(types.ModuleType):
    """A module whose every attribute is a callable doing nothing (tensorboard's ``SummaryWriter(...)``
    and its ``add_scalar``) or a class to import; the compared code path calls none of them."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "stand-in: the fidelity comparison runs no full MISA run")
        # a spec without origin: importlib.util.find_spec (torch._dynamo's skip list) reads it
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Nothing


class _Nothing:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def load_misa(path: str) -> MISACheckout:
    """Import MISA's classes from the checkout at ``path`` (see the module docstring)."""
    root = Path(path).resolve()
    missing = [name for name in REQUIRED_FILES if not (root / name).is_file()]
    if missing:
        raise CheckoutError("--misa", path, MISA, f"missing {', '.join(missing)}")
    flygcl = [name for name in FLYGCL_FILES if (root / name).is_file()]
    if flygcl:
        raise CheckoutError("--misa", path, MISA, f"found one of {FLYGCL} ({', '.join(flygcl)}); pass it to --flygcl")
    try:
        return _import_misa(root)
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] in _TOP_LEVEL:  # a file of the checkout its own code imports
            raise CheckoutError.missing_module("--misa", path, MISA, error) from None
        raise CheckoutError("--misa", path, MISA, f"importing its code failed: {error}") from None
    except ImportError as error:  # a file missing, another repository, or a MISA version of other imports
        raise CheckoutError("--misa", path, MISA, f"importing its code failed: {error}") from None


def _import_misa(root: Path) -> MISACheckout:
    with _isolated_imports(root):
        config = importlib.import_module("configuration.config")
        vit = importlib.import_module("models.vit")
        model_module = importlib.import_module("models.dualprompt")
        trainer_module = importlib.import_module("methods.dualprompt")
        train_utils = importlib.import_module("utils.train_utils")
        memory = importlib.import_module("utils.memory")
        return MISACheckout(
            path=root, vit=vit, model_module=model_module, model_class=model_module.DualPrompt,
            trainer_class=trainer_module.DualPrompt, base_parser=config.base_parser,
            select_optimizer=train_utils.select_optimizer, select_scheduler=train_utils.select_scheduler,
            memory_class=memory.Memory,
        )


@contextlib.contextmanager
def _isolated_imports(root: Path) -> Iterator[None]:
    touched = [name for name in sys.modules if name.split(".")[0] in _TOP_LEVEL or name in _INERT]
    saved = {name: sys.modules.pop(name) for name in touched}
    sys.path.insert(0, str(root))
    for name in _INERT:
        sys.modules[name] = _Inert(name)
    try:
        with warnings.catch_warnings(), timm_registry_kept(), _timm_vit_configurations_kept():
            warnings.simplefilter("ignore")  # timm warns about each name the modules register over its own
            yield
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] in _TOP_LEVEL or n in _INERT]:
            del sys.modules[name]
        sys.modules.update(saved)


@contextlib.contextmanager
def _timm_vit_configurations_kept() -> Iterator[None]:
    """timm's ``vision_transformer.default_cfgs`` as it was (MISA's modules assign entries of it)."""
    from timm.models import vision_transformer

    configurations: Dict[str, Any] = getattr(vision_transformer, "default_cfgs", {})
    saved = copy.copy(configurations)
    try:
        yield
    finally:
        configurations.clear()
        configurations.update(saved)
