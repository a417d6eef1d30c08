"""Importing upstream code from a checkout, with in-memory fixes only (nothing in the checkout is written).

Third-party packages an upstream module imports but the checked path never uses may be replaced by
inert stand-ins (named in the harness's output); a stand-in raises as soon as anything instantiates it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import io
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Callable, List, Sequence

import torch


class _StubMeta(type):
    """Attributes of a stand-in are stand-in classes: subclassing them at import time works."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubMeta(f"{cls.__name__}.{name}", (_StubBase,), {})


class _StubBase(metaclass=_StubMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"stand-in {type(self).__name__} was used: install the real package")


class StubModule(types.ModuleType):
    """Stand-in for a third-party module the upstream code imports but the checked path never uses."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubMeta(f"{self.__name__}.{name}", (_StubBase,), {})


def install_stub(name: str) -> StubModule:
    """Register a stand-in package ``name`` (and its parents) in ``sys.modules``."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            stub = StubModule(sub)
            stub.__path__ = []
            stub.__spec__ = importlib.machinery.ModuleSpec(sub, None, is_package=True)
            sys.modules[sub] = stub
    return sys.modules[name]


def import_upstream(checkout: Path, modules: Sequence[str], allowed_stubs: Sequence[str] = ()) -> List[str]:
    """Import ``modules`` with ``checkout`` first on ``sys.path``; a missing third-party package named in
    ``allowed_stubs`` becomes a stand-in. Returns the stand-ins made."""
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    stubbed: List[str] = []
    for name in modules:
        for _ in range(20):
            loaded = set(sys.modules)
            try:
                importlib.import_module(name)
                break
            except ModuleNotFoundError as error:
                missing = error.name or ""
                if missing.split(".")[0] not in allowed_stubs:
                    raise
                for partial in set(sys.modules) - loaded:  # a failed import leaves half-run checkout modules
                    if str(getattr(sys.modules[partial], "__file__", None) or "").startswith(str(checkout)):
                        del sys.modules[partial]
                install_stub(missing)
                stubbed.append(missing)
    return stubbed


def load_edited_module(fullname: str, path: Path, edit: Callable[[List[str]], List[str]]) -> types.ModuleType:
    """Execute ``path`` as module ``fullname`` after ``edit`` changed its lines in memory.

    ``edit`` must keep the line count, so tracebacks keep pointing at the checkout's line numbers.
    """
    lines = path.read_text().splitlines(keepends=True)
    edited = edit(list(lines))
    if len(edited) != len(lines):
        raise RuntimeError(f"{path}: an in-memory edit must keep the line count ({len(lines)} -> {len(edited)})")
    module = types.ModuleType(fullname)
    module.__file__ = str(path)
    module.__package__ = fullname.rpartition(".")[0]
    module.__spec__ = importlib.util.spec_from_loader(fullname, loader=None, origin=str(path))
    sys.modules[fullname] = module
    exec(compile("".join(edited), str(path), "exec"), module.__dict__)  # noqa: S102 - checkout file, edited in memory
    return module


def isolated_cwd() -> str:
    """Work in a fresh temporary folder: some upstream modules write files (tensorboard/, logs/) on import."""
    import atexit
    import shutil

    folder = tempfile.mkdtemp(prefix="fly_upstream_")
    os.chdir(folder)
    atexit.register(shutil.rmtree, folder, True)
    return folder


@contextlib.contextmanager
def quiet(enabled: bool = True):
    """Silence the upstream code's own printing."""
    if not enabled:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def no_cuda_sync() -> None:
    """Task loops call torch.cuda.synchronize() per batch; on a CPU-only machine there is nothing to wait for."""
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *args, **kwargs: None


def replay_loader_off(*modules: types.ModuleType) -> None:
    """The online trainers build a replay ``DataLoader`` (4 worker processes) every batch, read only when
    the replay memory holds samples. With the memory kept empty, an empty list stands in for it."""
    for module in modules:
        module.DataLoader = lambda *args, **kwargs: []
