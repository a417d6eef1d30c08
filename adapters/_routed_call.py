"""How a routed value reaches a call: bound to the callee's signature as Python binds the call's own
arguments, so that it replaces the argument however the codebase passes it (positionally or by keyword),
and never lands beside it as a duplicate keyword; and which callables can be routed (a module's forward or
a named method of a module, never a bound method handed over as a module)."""

from __future__ import annotations

import inspect
import types
from typing import Any, Callable, Dict, Optional, Tuple

from torch import Tensor, nn

from ._record import Record
from ._seams import SeamError

__all__ = ["QueryFromCall", "QueryWhen", "RouteValue", "RoutedArgument", "RoutedCall", "route_target"]

#: ``query_from_call(module, args, kwargs)``: router features read from a routed call itself
QueryFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any]], Optional[Tensor]]
#: ``route_value(experts, module, args, kwargs)``: the value a routed call gets
RouteValue = Callable[[Tensor, nn.Module, Tuple[Any, ...], Dict[str, Any]], Any]
#: ``query_when(args, kwargs)``: whether a call of the query module is the router's query
QueryWhen = Callable[[Tuple[Any, ...], Dict[str, Any]], bool]

_NAMED = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class RoutedArgument:
    """The parameter ``name`` of ``function`` (or, where the signature has none of that name, its ``**kwargs``)
    and how a call's arguments carry a value for it."""

    def __init__(self, function: Callable[..., Any], name: str) -> None:
        self.signature = inspect.signature(function)
        self.name = name
        parameters = self.signature.parameters.values()
        parameter = self.signature.parameters.get(name)
        self.named = parameter is not None and parameter.kind in _NAMED
        self.positional_only = self.named and parameter.kind is inspect.Parameter.POSITIONAL_ONLY
        self.var_keyword = next((p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        positional = [p.name for p in parameters if p.kind in _NAMED[:2]]
        self.position = positional.index(name) if self.named and name in positional else None

    def bind(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], value: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """``(args, kwargs)`` of the same call with the argument replaced by ``value`` where the call passes it
        (its position, or its keyword), else added by keyword. A call the signature cannot bind is returned
        unchanged: Python then raises its own error."""
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError:
            return args, kwargs
        position = self.position
        if position is not None and position < len(args):
            return (*args[:position], value, *args[position + 1:]), kwargs
        if self.positional_only:  # not passed: reached through the (default) arguments before it
            bound.apply_defaults()
            bound.arguments[self.name] = value
            return bound.args, bound.kwargs
        if not self.named and self.var_keyword is None:
            return args, kwargs
        return args, {**kwargs, self.name: value}


def route_target(module: Any, method: Optional[str], *, caller: str) -> Tuple[nn.Module, Optional[str]]:
    """``(module, method)`` of a routed call, checked before anything is installed: ``method`` ``None`` (or
    ``"forward"``) routes ``module``'s forward through a pre-hook; a method name routes that method of the
    module, patched on the instance. A bound method passed as the module, or anything that is not a module,
    is refused in one line naming the options to use."""
    if isinstance(module, types.MethodType) and isinstance(module.__self__, nn.Module):
        owner, name = module.__self__, module.__func__.__name__
        raise SeamError(
            f"{caller}: route_module is the method {type(owner).__name__}.{name}, not a module; pass "
            f"route_module=<the {type(owner).__name__}>, route_method={name!r} (the method is routed on that instance)"
        )
    if not isinstance(module, nn.Module):
        raise SeamError(
            f"{caller}: route_module must be an nn.Module (with route_method=... naming one of its methods), "
            f"got {type(module).__name__}"
        )
    if method is None or method == "forward":
        return module, None
    found = getattr(module, method, None) if isinstance(method, str) else None
    if isinstance(found, nn.Module):
        raise SeamError(
            f"{caller}: route_method={method!r} names a submodule of {type(module).__name__}; pass "
            f"route_module=<that submodule> and no route_method to route its forward"
        )
    if not isinstance(found, types.MethodType):
        what = "a method" if isinstance(method, str) else "the name of a method"
        raise SeamError(
            f"{caller}: route_method must be {what} of {type(module).__name__}, got {method!r}; pass the name of the "
            "method whose argument selects the prompts (route_method='interface')"
        )
    return module, method


class RoutedCall:
    """The routing of one callee at inference: reads the query (from the call, if asked, else the forward's
    recorded one), routes it once per forward, and binds the routed value to the call's arguments. Its
    :meth:`before` is a forward pre-hook; :meth:`call` replaces a routed method."""

    def __init__(self, record: Record, argument: RoutedArgument, value: Optional[RouteValue],
                 query_from_call: Optional[QueryFromCall], banks_follow_routing: bool,
                 after: Optional[Callable[[nn.Module, Tuple[Any, ...], Any], None]]) -> None:
        self.record, self.argument, self.value, self.after = record, argument, value, after
        self.query_from_call, self.banks_follow_routing = query_from_call, banks_follow_routing

    def query(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tensor]:
        """The routed call's router features; ``None`` when this call is not routed (training, or not fitted)."""
        record = self.record
        if self.query_from_call is not None:
            query = self.query_from_call(module, args, kwargs)
            if query is None:
                raise RuntimeError(
                    f"{record.caller}: no query features in the call of "
                    f"{type(module).__name__}; pass query_module=... to read them elsewhere"
                )
            if record.training:
                record.seen(query=query)
                return None
            return query
        if record.training:
            return None
        if not record.routing_active():
            record.eval_query = None
            return None
        first = args[0] if args and isinstance(args[0], Tensor) else None
        return record.forward_query(None if first is None or first.ndim == 0 else first.shape[0])

    def forced_without_query(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tensor]:
        """The forced experts of a call made inside ``handle.forcing(...)`` before any query was recorded (the
        batch size: the call's first tensor argument); ``None`` otherwise (:meth:`Record.route_forced_unqueried`)."""
        if self.query_from_call is not None or self.record.forced is None:
            return None
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, Tensor) and a.ndim > 0), None)
        device = first.device if first is not None else self.record.handle.router.device
        return self.record.route_forced_unqueried(None if first is None else first.shape[0], device)

    def before(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        record = self.record
        record.injected = None
        if record.handle.router is None:
            return None
        experts = self.forced_without_query(args, kwargs)
        if experts is None:
            query = self.query(module, args, kwargs)
            experts = None if query is None else record.route_forward(query)
        if experts is None:
            return None
        if self.banks_follow_routing:
            record.eval_banks = experts
        record.injected = experts
        value = experts if self.value is None else self.value(experts, module, args, kwargs)
        return self.argument.bind(args, kwargs, value)

    def returned(self, module: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
        """A routed module's forward returned: called outside the model's forward, it was the whole forward
        (its query is forgotten); inside it, the model's forward forgets the query when it returns."""
        if not self.record.in_forward:
            self.record.end_forward()

    def call(self, module: nn.Module, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``method`` (the module's own, bound) called with the routed value bound to its arguments; a routed
        method called outside the model's forward is its own forward: its query is forgotten afterwards."""
        routed = self.before(module, args, kwargs)
        if routed is not None:
            args, kwargs = routed
        try:
            output = method(*args, **kwargs)
        finally:
            self.returned(module, args, None)
        if self.after is not None:
            self.after(module, args, output)
        return output
