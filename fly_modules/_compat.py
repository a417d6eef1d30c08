"""The torch APIs the library uses that older releases lack, each with a fallback of the same semantics.

The library supports torch >= 1.12 (the version L2P's and DualPrompt's code pins). Three APIs it relies on
arrived in torch 2.0: ``Optimizer.register_step_post_hook``, ``register_optimizer_step_post_hook`` (every
optimizer) and forward (pre-)hooks ``with_kwargs``; torch 1.12 has no ``torch.load(weights_only=True)`` and
torch 1.13's refuses files written by torch 2; smaller gaps (stable argsort, the CPU half-precision lerp)
are bridged the same way. On a torch that has them the native API is called (nothing
changes there); otherwise one small dispatcher per object runs the hooks in registration order. The flags
below decide which path runs, so that tests can force the fallback on a recent torch. Where each fallback
differs from the native path is written in docs/compatibility.md.
"""

import inspect
import os
import pickle
import re
import types
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = [
    "TORCH_VERSION", "NATIVE_STEP_HOOKS", "NATIVE_KWARGS_HOOKS", "NATIVE_WEIGHTS_ONLY", "FALLBACK_MODULE_ATTRIBUTES",
    "step_post_hook", "global_step_post_hook", "forward_pre_hook", "forward_hook", "load_weights",
    "step_post_hooks", "hook_counts", "stable_argsort", "reinstate", "lerp_", "handle_dicts",
]

TORCH_VERSION: Tuple[int, int] = tuple(int(part) for part in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
#: ``FLY_MODULES_FORCE_COMPAT=1`` takes every fallback on any torch: the library's tests run on the paths
#: torch < 2 takes wherever a recent torch is installed (as torch's own TORCH_FORCE_WEIGHTS_ONLY_LOAD).
FORCED = os.environ.get("FLY_MODULES_FORCE_COMPAT", "") == "1"
NATIVE_STEP_HOOKS = hasattr(torch.optim.Optimizer, "register_step_post_hook") and not FORCED
NATIVE_KWARGS_HOOKS = TORCH_VERSION >= (2, 0) and not FORCED
NATIVE_WEIGHTS_ONLY = TORCH_VERSION >= (2, 0) and not FORCED  # 1.13 has the flag but refuses torch 2's files
NATIVE_STABLE_ARGSORT = TORCH_VERSION >= (1, 13) and not FORCED
NATIVE_LOW_PRECISION_LERP = TORCH_VERSION >= (2, 1) and not FORCED  # the CPU lerp of bfloat16 and float16

_DISPATCH = "_fly_modules_hooks"  # the instance attribute holding an object's fallback dispatcher
#: what the fallback writes into a hooked module's ``__dict__`` while one of its keyword hooks is registered
FALLBACK_MODULE_ATTRIBUTES = ("forward", _DISPATCH)


class _Handle(RemovableHandle):
    """A removable handle on a dispatcher's table; the dispatcher leaves once its tables are empty."""

    def __init__(self, hooks: "OrderedDict[int, Callable[..., Any]]", dispatcher: Any) -> None:
        super().__init__(hooks)
        self._dispatcher = dispatcher

    def remove(self) -> None:
        super().remove()
        dispatcher = getattr(self, "_dispatcher", None)  # a copied handle has none (RemovableHandle's pickling)
        if dispatcher is not None:
            dispatcher.leave_if_empty()


class _Dispatcher:
    """Replaces one object's method (an optimizer's ``step``, a module's ``forward``) by itself, as an
    instance attribute, and runs the registered hooks around the original in registration order."""

    method = ""

    def __init__(self, owner: Any) -> None:
        # The owner itself, not the original's __self__: the original may be a plain function (torch 1.x's
        # LR schedulers put a wrapper of ``optimizer.step`` on the instance).
        self.owner = owner
        self.had_own = self.method in owner.__dict__
        self.original = getattr(owner, self.method)
        # What inspects the method (the adapters read forward's parameters) sees the original's signature.
        self.__signature__ = inspect.signature(self.original)
        self.__wrapped__ = self.original
        self.before: "OrderedDict[int, Callable[..., Any]]" = OrderedDict()
        self.after: "OrderedDict[int, Callable[..., Any]]" = OrderedDict()

    @property
    def owner_dict(self) -> Dict[str, Any]:
        return vars(self.owner)

    @classmethod
    def of(cls, owner: Any) -> "_Dispatcher":
        found = owner.__dict__.get(_DISPATCH)
        if found is None or found.owner_dict.get(found.method) is not found:
            found = owner.__dict__[_DISPATCH] = cls(owner)
            owner.__dict__[cls.method] = found
        return found

    def add(self, table: "OrderedDict[int, Callable[..., Any]]", hook: Callable[..., Any]) -> RemovableHandle:
        handle = _Handle(table, self)
        table[handle.id] = hook
        return handle

    def enter(self) -> None:
        """Installs itself again when its tables were refilled after it left (a snapshot restored)."""
        if not (self.before or self.after) or self.owner_dict.get(self.method) is self:
            return
        self.had_own = self.method in self.owner_dict
        if self.had_own:
            self.original = self.owner_dict[self.method]
        self.owner_dict[_DISPATCH] = self
        self.owner_dict[self.method] = self

    def leave_if_empty(self) -> None:
        """Puts the original back once no hook is left, unless someone wrapped this dispatcher since (an
        LR scheduler of torch < 2 wraps ``optimizer.step``): then it stays, calling the original only."""
        if self.before or self.after or self.owner_dict.get(self.method) is not self:
            return
        if self.had_own:
            self.owner_dict[self.method] = self.original
        else:
            del self.owner_dict[self.method]
        self.owner_dict.pop(_DISPATCH, None)


class _StepDispatcher(_Dispatcher):
    method = "step"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self.original(*args, **kwargs)
        optimizer = self.owner
        for hook in list(self.after.values()):
            hook(optimizer, (optimizer, *args), kwargs)  # as torch 2's: the step's arguments, self first
        return result


class _ForwardDispatcher(_Dispatcher):
    method = "forward"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.owner
        for hook in list(self.before.values()):
            changed = hook(module, args, kwargs)
            if changed is not None:
                args, kwargs = _pre_hook_result(changed)
        output = self.original(*args, **kwargs)
        for hook in list(self.after.values()):
            changed = hook(module, args, kwargs, output)
            if changed is not None:
                output = changed
        return output


def _pre_hook_result(changed: Any) -> Tuple[tuple, Dict[str, Any]]:
    if not (isinstance(changed, tuple) and len(changed) == 2 and isinstance(changed[1], dict)):
        raise RuntimeError(f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), got {changed!r}"[:200])
    args = changed[0] if isinstance(changed[0], tuple) else (changed[0],)
    return args, changed[1]


def step_post_hook(optimizer: torch.optim.Optimizer, hook: Callable[..., Any]) -> RemovableHandle:
    """``optimizer.register_step_post_hook(hook)``: ``hook(optimizer, args, kwargs)`` after each step."""
    if NATIVE_STEP_HOOKS:
        return optimizer.register_step_post_hook(hook)
    dispatcher = _StepDispatcher.of(optimizer)
    return dispatcher.add(dispatcher.after, hook)


def forward_pre_hook(module: nn.Module, hook: Callable[..., Any]) -> RemovableHandle:
    """``module.register_forward_pre_hook(hook, with_kwargs=True)``: ``hook(module, args, kwargs)``."""
    if NATIVE_KWARGS_HOOKS:
        return module.register_forward_pre_hook(hook, with_kwargs=True)
    dispatcher = _ForwardDispatcher.of(module)
    return dispatcher.add(dispatcher.before, hook)


def forward_hook(module: nn.Module, hook: Callable[..., Any]) -> RemovableHandle:
    """``module.register_forward_hook(hook, with_kwargs=True)``: ``hook(module, args, kwargs, output)``."""
    if NATIVE_KWARGS_HOOKS:
        return module.register_forward_hook(hook, with_kwargs=True)
    dispatcher = _ForwardDispatcher.of(module)
    return dispatcher.add(dispatcher.after, hook)


def reinstate(handle: RemovableHandle) -> None:
    """After a hook table was refilled by hand (a snapshot restored): the fallback's dispatcher back in place."""
    dispatcher = getattr(handle, "_dispatcher", None)
    if dispatcher is not None:
        dispatcher.enter()


def handle_dicts(handle: RemovableHandle) -> List[dict]:
    """The live hook tables a handle removes its hook from. ``extra_dict_ref`` is a tuple of weak references
    from torch 2.1, a single one (or ``None``) in 2.0, and absent before."""
    extra = getattr(handle, "extra_dict_ref", None)
    extra = () if extra is None else extra if isinstance(extra, tuple) else (extra,)
    dicts = [ref() for ref in (getattr(handle, "hooks_dict_ref", None), *extra) if ref is not None]
    return [d for d in dicts if d is not None]


def step_post_hooks(optimizer: torch.optim.Optimizer) -> Dict[int, Callable[..., Any]]:
    """The optimizer's own step post hooks (a copy), whichever path registered them."""
    if NATIVE_STEP_HOOKS:
        return dict(optimizer._optimizer_step_post_hooks)
    dispatcher = optimizer.__dict__.get(_DISPATCH)
    return dict(dispatcher.after) if dispatcher is not None else {}


def hook_counts(module: nn.Module) -> Tuple[int, int]:
    """``(forward hooks, forward pre-hooks)`` of one module, the keyword ones of either path included."""
    dispatcher = module.__dict__.get(_DISPATCH)
    extra = (len(dispatcher.after), len(dispatcher.before)) if dispatcher is not None else (0, 0)
    return len(module._forward_hooks) + extra[0], len(module._forward_pre_hooks) + extra[1]


def stable_argsort(values: torch.Tensor) -> torch.Tensor:
    """``torch.argsort(values, stable=True)``; torch 1.12's argsort has no ``stable``, its sort has."""
    if NATIVE_STABLE_ARGSORT:
        return torch.argsort(values, stable=True)
    return torch.sort(values, stable=True).indices


def lerp_(target: torch.Tensor, end: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``target.lerp_(end, weight)``; torch < 2.1 has no CPU lerp for float16 (< 1.13: nor bfloat16), so
    there it is computed in float32 (as torch's later CPU kernel does inside) and rounded back."""
    low = target.dtype in (torch.bfloat16, torch.float16) and target.device.type == "cpu"
    if NATIVE_LOW_PRECISION_LERP or not low:
        return target.lerp_(end, weight)
    return target.copy_(target.float().lerp_(end.float(), weight.float()))


class _GlobalStepHooks:
    """``register_optimizer_step_post_hook`` of torch < 2: each optimizer class's ``step`` is wrapped (once,
    for good: the wrapper calls nothing once the table is empty), the classes that exist at registration by a
    walk of the subclasses, later ones at their first instance (``Optimizer._hook_for_profile``, which every
    ``Optimizer.__init__`` of torch 1.x calls)."""

    hooks: "OrderedDict[int, Callable[..., Any]]" = OrderedDict()
    _profile_hook: Optional[Callable[..., Any]] = None

    @classmethod
    def register(cls, hook: Callable[..., Any]) -> RemovableHandle:
        cls._follow_new_classes()
        pending = [torch.optim.Optimizer]
        while pending:
            klass = pending.pop()
            cls.wrap(klass)
            pending.extend(klass.__subclasses__())
        handle = _Handle(cls.hooks, None)
        cls.hooks[handle.id] = hook
        return handle

    @classmethod
    def wrap(cls, klass: type) -> None:
        step = klass.__dict__.get("step")
        if step is None or getattr(step, "_fly_modules_global", False):
            return

        def step_then_hooks(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            result = step(self, *args, **kwargs)
            for hook in list(cls.hooks.values()):  # at each wrapped class's step, as torch 2's profiler wrapper
                hook(self, (self, *args), kwargs)
            return result

        step_then_hooks._fly_modules_global = True  # type: ignore[attr-defined]
        step_then_hooks.hooked = getattr(step, "hooked", False)  # type: ignore[attr-defined]  # torch 1.x's profiler mark
        step_then_hooks.__wrapped__ = step  # type: ignore[attr-defined]
        klass.step = step_then_hooks

    @classmethod
    def _follow_new_classes(cls) -> None:
        name = "_hook_for_profile" if hasattr(torch.optim.Optimizer, "_hook_for_profile") else "_patch_step_function"
        original = getattr(torch.optim.Optimizer, name, None)  # the latter: torch 2, when tests force the fallback
        if original is None or cls._profile_hook is not None:
            return

        def hook_for_profile(self: torch.optim.Optimizer) -> None:
            original(self)
            cls.wrap(type(self))

        cls._profile_hook = hook_for_profile
        setattr(torch.optim.Optimizer, name, hook_for_profile)


def global_step_post_hook(hook: Callable[..., Any]) -> RemovableHandle:
    """``torch.optim.optimizer.register_optimizer_step_post_hook(hook)``: after every optimizer's step."""
    if NATIVE_STEP_HOOKS:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        return register_optimizer_step_post_hook(hook)
    return _GlobalStepHooks.register(hook)


def _allowed(module: str, name: str) -> bool:
    """What a state_dict's pickle may name: tensors' and parameters' rebuilders, storages, dtypes, sizes,
    devices and ordered dicts (the kinds torch 2's ``weights_only`` accepts for a state_dict)."""
    if (module, name) in _ALLOWED_GLOBALS:
        return True
    if module == "torch":
        found = getattr(torch, name, None)
        return isinstance(found, torch.dtype) or name.endswith("Storage") and isinstance(found, type)
    return False


_ALLOWED_GLOBALS = {
    ("collections", "OrderedDict"), ("torch", "Size"), ("torch", "device"), ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"), ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch._tensor", "_rebuild_from_type_v2"), ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"),
    ("builtins", "set"), ("builtins", "frozenset"),
}


class _WeightsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise pickle.UnpicklingError(f"weights-only load refuses the global {module}.{name}: "
                                         "expected tensors, numbers, strings and containers of them")
        return super().find_class(module, name)


def _weights_load(file: Any, **kwargs: Any) -> Any:
    return _WeightsUnpickler(file, **kwargs).load()


# torch.load's ``pickle_module``: torch subclasses its Unpickler, so its own find_class ends in ours.
_WEIGHTS_PICKLE = types.SimpleNamespace(Unpickler=_WeightsUnpickler, load=_weights_load, __name__="fly_weights_pickle")


def load_weights(file: Any, map_location: Any = None) -> Any:
    """``torch.load(file, map_location, weights_only=True)``; on torch < 2 the same refusal of every global
    but a state_dict's, by a restricted unpickler (1.12 has no ``weights_only``; 1.13's refuses torch 2 files)."""
    if NATIVE_WEIGHTS_ONLY:
        return torch.load(file, map_location=map_location, weights_only=True)
    # torch.load's own path is not taken: 1.13's replaces any pickle_module by pickle unless weights_only.
    from torch import serialization

    with serialization._open_file_like(file, "rb") as opened:
        if not serialization._is_zipfile(opened):
            raise pickle.UnpicklingError("weights-only loading of torch's legacy (pre-1.6) file format needs "
                                         f"torch >= 2.0; this is torch {torch.__version__}")
        with serialization._open_zipfile_reader(opened) as archive:
            return serialization._load(archive, map_location, _WEIGHTS_PICKLE, encoding="utf-8")
