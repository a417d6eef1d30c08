"""Putting the user's objects back exactly: what a retrofit installs, and snapshots for probes and ``verify()``.

Which retrofit a model carries is held here, beside the model, never in it. An :class:`Installation`
registers hooks and swaps instance attributes; :meth:`Installation.remove` undoes them, :meth:`Installation.leftovers` lists what a removal failed to restore, and
:meth:`Installation.snapshot` lets ``verify()`` run the real removal and then put everything back. A
:class:`Snapshot` holds the tensors, stores, attributes and gradients of some modules and objects, for
the probes and checks that must leave everything as they found them.
"""

from __future__ import annotations

import copy
import functools
import random
import types
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy
import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from fly_modules import _compat

__all__ = [
    "Installation", "RandomState", "Snapshot", "forget_retrofit", "register_retrofit", "registered_retrofit", "shared",
]


class _LiveRetrofits:
    """Which retrofit each model carries, held beside the models (weakly: neither is kept alive), so that
    nothing is written into the user's model: its ``__dict__``, deep copies, pickles and ``state_dict`` hold
    exactly its own attributes. Keyed by identity, not by ``hash``/``==``, which a model may override."""

    def __init__(self) -> None:
        self._entries: Dict[int, Tuple["weakref.ref[nn.Module]", "weakref.ref[Any]"]] = {}

    def add(self, model: nn.Module, handle: Any) -> None:
        self._entries[id(model)] = (weakref.ref(model, functools.partial(self._collected, id(model))), weakref.ref(handle))

    def _collected(self, key: int, ref: "weakref.ref[nn.Module]") -> None:
        if key in self._entries and self._entries[key][0] is ref:
            del self._entries[key]

    def get(self, model: nn.Module) -> Any:
        entry = self._entries.get(id(model))
        return entry[1]() if entry is not None and entry[0]() is model else None

    def discard(self, model: nn.Module, handle: Any) -> None:
        if self.get(model) is handle:
            del self._entries[id(model)]


_LIVE = _LiveRetrofits()
#: The retrofit registered for a model, removed or not (``None``: none); recording one; forgetting it.
registered_retrofit, register_retrofit, forget_retrofit = _LIVE.get, _LIVE.add, _LIVE.discard


def shared(value: Any) -> Any:
    """``value``, or a plain function calling it when it is a method bound to an object that is not a module.

    A deep copy of a model copies its hooks and instance attributes; a copied bound method would copy its
    object (a family, its handle, the tensors a forward left there), while a function is shared by the copy.
    """
    if not isinstance(value, types.MethodType) or isinstance(value.__self__, nn.Module):
        return value
    method = value

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    return call


def _guarded(value: Callable[..., Any], installation: "Installation", original: Optional[Callable[..., Any]]) -> Any:
    """``value`` as a plain function (:func:`shared`) that, once ``installation`` is removed, runs ``original``
    instead (``None``: does nothing, a hook). The one place where a removed retrofit steps aside: a deep copy
    of the model made while it was installed keeps its hooks and wrappers."""
    function = shared(value)

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if installation.removed:
            return None if original is None else original(*args, **kwargs)
        return function(*args, **kwargs)

    return call


def _holder(obj: Any, name: str) -> Optional[dict]:
    """The dict of ``obj`` that stores ``name`` now: ``_parameters``, ``_buffers``, ``_modules`` of a
    module, or the instance ``__dict__``; ``None`` when only the class (or nothing) defines it."""
    if isinstance(obj, nn.Module):
        for store in (obj._parameters, obj._buffers, obj._modules):
            if name in store:
                return store
    return vars(obj) if name in vars(obj) else None


def _put_back(obj: Any, name: str, store: Optional[dict], value: Any, order: List[str]) -> None:
    """Make ``store[name]`` hold ``value`` (``store`` ``None``: no instance attribute), at its place in
    ``order`` (the store's keys when it held it): ``_modules`` order is ``state_dict()`` order."""
    current = _holder(obj, name)
    if current is store and store is not None:
        store[name] = value
        return
    if current is not None:
        del current[name]
    if store is not None:
        store[name] = value
        items = dict(store)
        store.clear()
        store.update((key, items[key]) for key in [*(k for k in order if k in items), *(k for k in items if k not in order)])


class _Swap:
    """One replaced attribute: where the old value lived, the old value, the value put in."""

    def __init__(self, obj: Any, name: str, value: Any) -> None:
        self.obj, self.name, self.value = obj, name, value
        self.store = _holder(obj, name)
        self.old = self.store[name] if self.store is not None else None
        self.order = list(self.store) if self.store is not None else []

    def undo(self) -> None:
        _put_back(self.obj, self.name, self.store, self.old, self.order)

    def leftover(self) -> Optional[str]:
        current = _holder(self.obj, self.name)
        where = f"{type(self.obj).__name__}.{self.name}"
        if self.store is None:
            return None if current is None else f"{where} still holds an instance attribute the retrofit set"
        if current is not self.store or current[self.name] is not self.old:
            return f"{where} is not the original object"
        return None


class Installation:
    """Hooks and attribute swaps of one retrofit, in the order made."""

    def __init__(self) -> None:
        self._hooks: List[Tuple[RemovableHandle, str]] = []
        self._swaps: List[_Swap] = []
        self._undo: List[Callable[[], None]] = []
        self._modules: "weakref.WeakValueDictionary[int, nn.Module]" = weakref.WeakValueDictionary()
        self.removed = False

    # -------------------------------------------------------------------------------------- install
    def forward_hook(self, module: nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False) -> None:
        hook = _guarded(hook, self, None)
        handle = _compat.forward_hook(module, hook) if with_kwargs else module.register_forward_hook(hook)
        self._keep(handle, f"forward hook on {type(module).__name__}", module)

    def forward_pre_hook(self, module: nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False) -> None:
        hook = _guarded(hook, self, None)
        handle = _compat.forward_pre_hook(module, hook) if with_kwargs else module.register_forward_pre_hook(hook)
        self._keep(handle, f"forward pre-hook on {type(module).__name__}", module)

    def step_post_hook(self, optimizer: torch.optim.Optimizer, hook: Callable[..., Any]) -> RemovableHandle:
        handle = _compat.step_post_hook(optimizer, hook)
        self._keep(handle, f"step hook on {type(optimizer).__name__}", None)
        return handle

    def global_step_post_hook(self, hook: Callable[..., Any]) -> None:
        """A hook run after every optimizer's step (``torch.optim.optimizer.register_optimizer_step_post_hook``)."""
        self._keep(_compat.global_step_post_hook(hook), "step hook on every optimizer", None)

    def set_attribute(self, obj: Any, name: str, value: Any) -> None:
        """``setattr`` on an instance, undone by :meth:`remove` into the very dict that held the old
        value (a module's ``_modules``/``_parameters``/``_buffers`` or ``__dict__``), or deleted so
        that the class attribute shows through again. A method of a helper object is installed as a
        function calling it (:func:`shared`); a replaced method runs the original once the installation is
        removed."""
        if callable(value) and not isinstance(value, nn.Module):
            value = _guarded(value, self, getattr(obj, name, None))
        swap = _Swap(obj, name, value)
        setattr(obj, name, value)
        self._swaps.append(swap)
        if isinstance(obj, nn.Module):
            self._modules[id(obj)] = obj

    def guarded(self, value: Callable[..., Any], original: Optional[Callable[..., Any]]) -> Callable[..., Any]:
        """``value`` as a function that runs ``original`` instead (``None``: answers ``None``) once this
        installation is removed (what every hook and replaced method goes through; a module that outlives
        the removal in a deep copy of the model, such as an ensembled head, calls its scorer through it)."""
        return _guarded(value, self, original)

    def add_undo(self, action: Callable[[], None]) -> None:
        self._undo.append(action)

    def _keep(self, handle: RemovableHandle, what: str, module: Optional[nn.Module]) -> None:
        self._hooks.append((handle, what))
        if module is not None:
            self._modules[id(module)] = module

    @property
    def modules(self) -> List[nn.Module]:
        """Modules that carry a hook or a swapped attribute of this retrofit."""
        return list(self._modules.values())

    def has_hook(self, handle: RemovableHandle) -> bool:
        return any(handle.id in d for d in _compat.handle_dicts(handle))

    # --------------------------------------------------------------------------------------- remove
    def remove(self) -> None:
        """Remove every hook and restore every attribute, newest first (idempotent)."""
        if self.removed:
            return
        for handle, _ in self._hooks:
            handle.remove()
        for action in reversed([*(swap.undo for swap in self._swaps), *self._undo]):
            action()
        self.removed = True

    def counts(self) -> tuple:
        """``(hooks, swapped attributes)`` this installation made."""
        return len(self._hooks), len(self._swaps)

    def leftovers(self) -> List[str]:
        """After :meth:`remove`: what is still installed or not restored (empty when all is undone)."""
        left = [what + " is still installed" for handle, what in self._hooks if self.has_hook(handle)]
        return left + [text for text in (swap.leftover() for swap in self._swaps) if text is not None]

    def snapshot(self, extra: Tuple[Tuple[Any, str], ...] = ()) -> Callable[[], None]:
        """A restorer putting every hook dict, swapped attribute and ``extra`` attribute back as now."""
        dicts: Dict[int, Tuple[dict, dict]] = {}
        for handle, _ in self._hooks:
            for hooks in _compat.handle_dicts(handle):
                dicts.setdefault(id(hooks), (hooks, hooks.copy()))
        places = [(swap.obj, swap.name) for swap in self._swaps] + list(extra)
        values = [(obj, name, _holder(obj, name)) for obj, name in places]
        values = [(obj, name, store, None if store is None else store[name], list(store or ()))
                  for obj, name, store in values]
        removed = self.removed

        def restore() -> None:
            for hooks, saved in dicts.values():
                hooks.clear()
                hooks.update(saved)
            for handle, _ in self._hooks:
                _compat.reinstate(handle)
            for obj, name, store, value, order in reversed(values):
                _put_back(obj, name, store, value, order)
            self.removed = removed

        return restore


# ---------------------------------------------------------------------------------------- snapshots
# A fresh module's own bookkeeping (hook dicts, ...); every other instance attribute is user state.
_INTERNAL = frozenset(vars(nn.Module())) - {"training"}


def _library_object(value: Any) -> bool:
    """A plain object of this library (a router's pending rows, a record, a schedule): snapshotted field
    by field, recursively; any other object is put back by identity (its contents when a container)."""
    return (hasattr(value, "__dict__") and not isinstance(value, (nn.Module, Tensor, type, types.ModuleType))
            and type(value).__module__.split(".")[0] == "fly_modules")


class _Value:
    """An attribute value put back by identity, its contents too when it is a tensor, a container or a
    plain object of this library (``memo``: such objects already captured, so that cycles end)."""

    def __init__(self, value: Any, memo: Dict[int, "_Fields"]) -> None:
        self.value = value
        tracked = isinstance(value, Tensor) and not value.is_inference()
        self.version = value._version if tracked else None
        self.data = value.detach().clone() if isinstance(value, Tensor) else (
            copy.copy(value) if isinstance(value, (list, dict, set)) else None
        )
        self.fields = _Fields.of(value, memo) if _library_object(value) and id(value) not in memo else None

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
        if self.fields is not None:
            self.fields.restore()
        return value


class _Fields:
    """The instance attributes of one object (a module's, less its own bookkeeping)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.internal = _INTERNAL if isinstance(obj, nn.Module) else frozenset()
        self.saved: Dict[str, _Value] = {}

    @classmethod
    def of(cls, obj: Any, memo: Dict[int, "_Fields"]) -> "_Fields":
        fields = memo[id(obj)] = cls(obj)
        fields.saved = {name: _Value(value, memo) for name, value in vars(obj).items() if name not in fields.internal}
        return fields

    def restore(self) -> None:
        live = vars(self.obj)
        for name in [n for n in live if n not in self.internal and n not in self.saved]:
            del live[name]
        for name, value in self.saved.items():
            live[name] = value.restore()


class RandomState:
    """Every global random number generator: torch's CPU one, each initialised CUDA device's, numpy's and
    Python's ``random``; :meth:`restore` puts them back as they were at construction."""

    def __init__(self) -> None:
        self.cpu = torch.random.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.numpy = numpy.random.get_state()
        self.python = random.getstate()

    def restore(self) -> None:
        torch.random.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        numpy.random.set_state(self.numpy)
        random.setstate(self.python)


class Snapshot:
    """Tensors, stores and attributes of some modules (with their submodules) and objects (this library's
    plain objects among them field by field), the global random number generators, and the parameters'
    gradients, which are set to ``None`` until :meth:`restore` with ``final=True``.

    :attr:`unrestorable` names what cannot be put back (inference-mode tensors: they cannot be written
    outside inference mode); a caller that must restore everything refuses when it is not empty.
    """

    def __init__(self, modules: Iterable[nn.Module], objects: Iterable[Any]) -> None:
        unique: Dict[int, nn.Module] = {}
        for module in modules:
            for sub in module.modules():
                unique.setdefault(id(sub), sub)
        self.modules = list(unique.values())
        self.stores = [(store, dict(store)) for m in self.modules for store in (m._parameters, m._buffers, m._modules)]
        tensors = {id(t): t for m in self.modules for t in (*m._parameters.values(), *m._buffers.values()) if t is not None}
        memo: Dict[int, _Fields] = {}
        self.tensors = [_Value(t, memo) for t in tensors.values()]
        self.attributes = [_Fields.of(obj, memo) for obj in [*self.modules, *objects]
                           if obj is not None and id(obj) not in memo]
        self.unrestorable = sorted({f"{type(m).__name__}.{name}" for m in self.modules
                                    for name, t in (*m._parameters.items(), *m._buffers.items())
                                    if t is not None and t.is_inference()})
        self.random = RandomState()
        # a method's own start may freeze parameters (an earlier task's classifier): put the flags back too
        self.requires_grad = [(t, t.requires_grad) for t in tensors.values() if t.is_leaf]
        self.grads = [(p, p.grad) for p in tensors.values() if isinstance(p, nn.Parameter)]
        for parameter, _ in self.grads:
            parameter.grad = None

    def restore(self, *, final: bool = False) -> None:
        for store, saved in self.stores:
            store.clear()
            store.update(saved)
        for value in self.tensors:
            value.restore()
        for fields in self.attributes:
            fields.restore()
        self.random.restore()
        for tensor, flag in self.requires_grad:
            if tensor.requires_grad != flag:
                tensor.requires_grad_(flag)
        for parameter, grad in self.grads:
            parameter.grad = grad if final else None
