"""Exact snapshots of modules and plain objects (tensors, module stores, attributes, gradients), for
the adapters' probes and ``verify()``, which must leave everything as they found it."""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterable

import torch
from torch import Tensor, nn

__all__ = ["Snapshot"]

# A fresh module's own bookkeeping (hook dicts, ...); every other instance attribute is user state.
_INTERNAL = frozenset(vars(nn.Module())) - {"training"}


class _Value:
    """An attribute value put back by identity, its contents too when it is a tensor or a container."""

    def __init__(self, value: Any) -> None:
        self.value = value
        tracked = isinstance(value, Tensor) and not value.is_inference()
        self.version = value._version if tracked else None
        self.data = value.detach().clone() if isinstance(value, Tensor) else (
            copy.copy(value) if isinstance(value, (list, dict, set)) else None
        )

    def restore(self) -> Any:
        value = self.value
        if self.version is not None and value._version != self.version:
            with torch.no_grad():
                value.copy_(self.data)
        elif isinstance(value, list):
            value[:] = self.data
        elif isinstance(value, (dict, set)):
            value.clear()
            value.update(self.data)
        return value


class Snapshot:
    """Tensors, stores and plain attributes of some modules (with their submodules) and objects, and the
    parameters' gradients, which are set to ``None`` until :meth:`restore` with ``final=True``."""

    def __init__(self, modules: Iterable[nn.Module], objects: Iterable[Any]) -> None:
        unique: Dict[int, nn.Module] = {}
        for module in modules:
            for sub in module.modules():
                unique.setdefault(id(sub), sub)
        self.modules = list(unique.values())
        self.stores = [(store, dict(store)) for m in self.modules for store in (m._parameters, m._buffers, m._modules)]
        tensors = {id(t): t for m in self.modules for t in (*m._parameters.values(), *m._buffers.values()) if t is not None}
        self.tensors = [_Value(t) for t in tensors.values()]
        self.attributes = [(obj, self._attributes(obj)) for obj in [*self.modules, *objects] if obj is not None]
        self.grads = [(p, p.grad) for p in tensors.values() if isinstance(p, nn.Parameter)]
        for parameter, _ in self.grads:
            parameter.grad = None

    @staticmethod
    def _attributes(obj: Any) -> Dict[str, _Value]:
        internal = _INTERNAL if isinstance(obj, nn.Module) else frozenset()
        return {name: _Value(value) for name, value in vars(obj).items() if name not in internal}

    def restore(self, *, final: bool = False) -> None:
        for store, saved in self.stores:
            store.clear()
            store.update(saved)
        for value in self.tensors:
            value.restore()
        for obj, saved in self.attributes:
            internal = _INTERNAL if isinstance(obj, nn.Module) else frozenset()
            live = vars(obj)
            for name in [n for n in live if n not in internal and n not in saved]:
                del live[name]
            for name, value in saved.items():
                live[name] = value.restore()
        for parameter, grad in self.grads:
            parameter.grad = grad if final else None
