"""The plumbing every family shares: checking a model's seams, then wiring the handle to them.

Seams are checked before anything is installed: a missing or unusable one raises :class:`SeamError`
naming what was found and the generic call. A :class:`Wiring` then creates the handle with its router
and ensemble and installs the hooks that read query features where the model computes them, inject the
routed expert as a keyword of the module whose call selects the prompts, and record which ensemble banks
a forward used, all into the handle's per-batch state (``handle.batch``); :class:`EnsembleLinear`
replaces the classifier.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from fly_modules import ClassifierNotFoundError, TemporalEnsembleHead, locate_classifier
from fly_modules._validation import InvalidParameterError, check_int

from ._handle import BatchState, Retrofit, StepCounter
from ._options import RetrofitOptions

__all__ = [
    "GENERIC_CALL", "ClassToken", "EnsembleLinear", "SeamError", "Wiring", "backbone_of", "count_experts",
    "default_query", "ensemble_scores", "find_head", "first_tensor", "merge_groups", "missing_seam",
    "named_parameters", "require_keyword", "step_counter",
]

QueryFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any]], Optional[Tensor]]
BankFromCall = Callable[[nn.Module, Tuple[Any, ...], Dict[str, Any], Any], Optional[Tensor]]
RouteValue = Callable[[Tensor, nn.Module, Tuple[Any, ...], Dict[str, Any]], Any]
UsedFromOutput = Callable[[Any], Optional[Tensor]]


# -------------------------------------------------------------------------------------------- seams
GENERIC_CALL = (
    "fly_modules.adapters.generic.retrofit(model, num_experts=..., query_module=..., route_module=..., "
    "route_kwarg=..., head_owner=..., head_name=...)"
)


class SeamError(AttributeError):
    """A model lacks a seam an adapter needs, or offers one the adapter cannot use; the message says why
    and shows the generic call."""


def missing_seam(family: str, model: Any, path: str, what: str) -> SeamError:
    present = sorted(name for name, _ in model.named_children()) if isinstance(model, nn.Module) else []
    return SeamError(
        f"fly_modules.adapters.{family}: {type(model).__name__} has no `{path}` ({what}); its submodules are "
        f"{present}.{_inner_hint(model, path)} If your code names it differently, pass the seams explicitly: "
        f"{GENERIC_CALL}"
    )


def _inner_hint(model: Any, path: str) -> str:
    """Frameworks wrap the prompted model (Mammoth ``net.model``, PILOT ``_network.backbone``): name the
    submodule that has the seam, if one does."""
    if not isinstance(model, nn.Module):
        return ""
    names = path.split("`")[0].split(".")
    for name, module in model.named_modules():
        if name and name.count(".") < 3:
            owner = module
            for part in names:
                owner = getattr(owner, part, None)
            if owner is not None:
                return f" Its submodule `{name}` has it: retrofit that one (model.{name})."
    return ""


def _signature(function: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError) as error:  # builtins and some C extensions have none
        raise SeamError(f"cannot read the signature of {function!r} ({error}); use {GENERIC_CALL}") from None


def named_parameters(function: Callable[..., Any]) -> set:
    """Parameters that can be passed by keyword (``**kwargs`` excluded)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in _signature(function).parameters.values() if p.kind in kinds}


def require_keyword(function: Callable[..., Any], keyword: str, *, family: str, callee: str, why: str = "") -> None:
    """Raise :class:`SeamError` unless ``function`` takes ``keyword`` as a named parameter."""
    if keyword in named_parameters(function):
        return
    signature = _signature(function)
    swallowed = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    found = (
        "takes it only through **kwargs, which would swallow the routed value and leave the method's own "
        "selection in place" if swallowed else "does not take it"
    )
    raise SeamError(
        f"fly_modules.adapters.{family}: the router passes `{keyword}=` to {callee}{signature}, which {found}"
        f"{'; ' + why if why else ''}. Route through a module whose forward names the argument: {GENERIC_CALL}"
    )


def find_head(owner: nn.Module, family: str = "generic") -> Tuple[nn.Module, str]:
    """``(parent, name)`` of ``owner``'s classifier as :func:`fly_modules.locate_classifier` finds it
    (``get_classifier()``, else ``head``, else ``fc``). Raises :class:`SeamError` when there is none."""
    try:
        path, _ = locate_classifier(owner)
    except ClassifierNotFoundError as error:
        raise SeamError(
            f"fly_modules.adapters.{family}: {error}; pass head_owner=... and head_name=...: {GENERIC_CALL}"
        ) from None
    parent, _, name = path.rpartition(".")
    return (owner.get_submodule(parent) if parent else owner), name


def count_experts(num_experts: Optional[int], default: Any, family: str, what: str) -> int:
    """``num_experts`` if given, else ``default`` (what the model declares), as an int >= 1; an error
    asking for ``num_experts`` (the number of ``what``) when neither is there."""
    owner = f"fly_modules.adapters.{family}"
    value = num_experts if num_experts is not None else default
    if value is None:
        raise InvalidParameterError(f"{owner}: pass num_experts (the number of {what})")
    return check_int(value, "num_experts", owner=owner, minimum=1)


def backbone_of(model: nn.Module, family: str, what: str, *, forward_features: bool = False) -> nn.Module:
    """``model.backbone`` (with a ``forward_features`` method when asked), else a :class:`SeamError`."""
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        raise missing_seam(family, model, "backbone", what)
    if forward_features and not callable(getattr(backbone, "forward_features", None)):
        raise missing_seam(family, model, "backbone.forward_features", what)
    return backbone


def step_counter(model: nn.Module) -> Optional[StepCounter]:
    """FlyGCL's ``task_count`` (advanced by ``process_task_count()``, which also prepares the step), else
    MISA's ``task_id`` (its loop increments it; set directly); ``None`` when the model has neither."""
    if callable(getattr(model, "process_task_count", None)) and isinstance(getattr(model, "task_count", None), int):
        def process(expert: int) -> None:
            while int(model.task_count) < expert:
                model.process_task_count()

        return StepCounter(model, "task_count", process)
    if isinstance(getattr(model, "task_id", None), int):
        return StepCounter(model, "task_id", lambda expert: setattr(model, "task_id", int(expert)))
    return None


# ----------------------------------------------------------------------------------------- the head
def ensemble_scores(
    ensemble: TemporalEnsembleHead,
    features: Tensor,
    banks: Union[int, Tensor],
    logit_mask: Optional[Tensor] = None,
    transform: Optional[Callable[[Tensor], Tensor]] = None,
) -> Tensor:
    """Ensemble of ``[online, copies of each sample's bank]`` in the retrofit output convention.

    ``transform`` maps the member logits ``(B, H, C)`` (a method's per-sample class mask); the
    ``logit_mask`` is added next, then the members are aggregated. Softmax rules return the log of
    the aggregated probabilities, the other rules the aggregated logits.
    """
    members = ensemble.member_logits(features, banks)
    if transform is not None:
        members = transform(members)
    if logit_mask is not None:
        mask = logit_mask.to(members.device)
        members = members + (mask.unsqueeze(1) if mask.ndim == 2 else mask)
    scores = ensemble.aggregate_members(members)
    return scores.log() if ensemble.aggregate.startswith("softmax") else scores


class EnsembleLinear(nn.Linear):
    """Stand-in for a retrofitted classifier: the online head in training, the ensemble at inference.

    It registers the online head's own ``weight`` and ``bias`` (the same ``Parameter`` objects), so an
    optimizer built before or after the retrofit trains them and the owner's ``state_dict`` keys are
    unchanged. The online head itself is kept as ``online`` (not a child module).

    Args:
        online: the original ``nn.Linear``.
        scorer: ``scorer(x)`` computes the inference output; ``None`` returns the online logits.
        is_training: tells training from inference (default: this module's ``training`` flag). The
            adapters pass the retrofitted model's flag: some codebases put the module that owns the
            classifier in eval mode inside every forward (MVP calls ``backbone.eval()``).
    """

    def __init__(
        self,
        online: nn.Linear,
        scorer: Optional[Callable[[Tensor], Tensor]],
        is_training: Optional[Callable[[], bool]] = None,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = online.in_features, online.out_features
        self.weight = online.weight
        if online.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = online.bias
        self.training = online.training
        self.__dict__["online"] = online
        self.__dict__["scorer"] = scorer
        self.__dict__["is_training"] = is_training

    def forward(self, x: Tensor) -> Tensor:
        training = self.training if self.is_training is None else self.is_training()
        if training or self.scorer is None:
            return self.online(x)
        return self.scorer(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, online={type(self.online).__name__}"


# ----------------------------------------------------------------------------------- query features
def default_query(output: Any) -> Tensor:
    """The query features of a module output: the tensor itself, or ``output["pre_logits"]``."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("pre_logits"), Tensor):
        return output["pre_logits"]
    raise TypeError(
        f"the query module returned a {type(output).__name__}; pass query_from_output=... mapping its output "
        "to the (B, D) query features"
    )


def first_tensor(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tensor]:
    """The call's first tensor argument (positional first, then keyword), ``None`` if there is none."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            return value
    return None


class ClassToken(nn.Module):
    """The prompt-free final-norm class token of ``backbone.forward_features`` (what FlyGCL's RP gate
    collects). Held by the retrofit only, never a child of the model: its ``state_dict`` is unchanged."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.__dict__["backbone"] = backbone  # not a submodule: the model owns it

    def forward(self, images: Tensor) -> Tensor:
        features = self.backbone.forward_features(images)
        if isinstance(features, (tuple, list)):
            features = features[0]
        return features[:, 0]


def merge_groups(parts: List[Any], rows: List[Tensor]) -> Any:
    """Put per-group outputs (tensors, tuples, lists, dicts of them) back in batch order.

    ``rows[g]`` holds the batch positions of group ``g``. A tensor whose first dimension is not its
    group's size is taken as a squeezed batch dimension of a one-sample group (``x[idx].squeeze()``
    in the upstream code); anything that is not a tensor is taken from the last group.
    """
    first = parts[0]
    if isinstance(first, Tensor):
        shaped = []
        for part, index in zip(parts, rows):
            if part.ndim == 0 or part.shape[0] != index.numel():
                if index.numel() != 1:
                    raise ValueError(
                        f"cannot merge a per-group output of shape {tuple(part.shape)} for a group of {index.numel()} samples"
                    )
                part = part.unsqueeze(0)
            shaped.append(part)
        order = torch.cat(rows).to(first.device)
        return torch.cat(shaped)[torch.argsort(order)]
    if isinstance(first, (tuple, list)):
        merged = [merge_groups([p[i] for p in parts], rows) for i in range(len(first))]
        return type(first)(merged) if isinstance(first, list) else tuple(merged)
    if isinstance(first, dict):
        return {key: merge_groups([p[key] for p in parts], rows) for key in first}
    return parts[-1]


# ------------------------------------------------------------------------------------------- wiring
class Wiring:
    """The hook installers of one retrofit; what the hooks record goes to ``handle.batch``.

    Attributes:
        handle: the :class:`Retrofit` returned to the user.
        family: the family name, for messages.
    """

    def __init__(self, handle: Retrofit, family: str) -> None:
        self.handle = handle
        self.family = family

    @classmethod
    def create(
        cls,
        model: nn.Module,
        family: str,
        options: RetrofitOptions,
        *,
        classifier: nn.Module,
        num_experts: int,
        num_banks: int,
        banks_of_expert: Callable[[int], Sequence[int]],
        start_expert: Optional[Callable[[int], None]] = None,
        counter: Optional[StepCounter] = None,
        router_dim: Optional[int] = None,
    ) -> "Wiring":
        """The handle with its router (``router_dim`` features, ``num_experts`` outputs) and ensemble
        (``num_banks`` banks around ``classifier``), the optimizer hook attached; no model hook yet.

        The method's expert start is the user's ``start_expert`` if given, else moving the method's step
        ``counter`` (whose value is then the current expert), else nothing.
        """
        owner = f"fly_modules.adapters.{family}"
        num_experts = check_int(num_experts, "num_experts", owner=owner, minimum=1)
        if not isinstance(classifier, nn.Linear):
            raise SeamError(
                f"{owner}: the classifier must be an nn.Linear, found {type(classifier).__name__}; pass "
                f"head_owner=... and head_name=... naming the nn.Linear: {GENERIC_CALL}"
            )
        dim = check_int(router_dim, "router_dim", owner=owner, minimum=1) if router_dim is not None \
            else classifier.in_features
        current = counter.read() if counter is not None else 0

        def start(expert: int) -> None:
            if start_expert is not None:
                start_expert(expert)
            elif counter is not None:
                counter.advance(expert)

        handle = Retrofit(
            model,
            family=family,
            router=options.build_router(dim, num_experts, classifier.weight.device),
            ensemble=options.build_ensemble(classifier, num_banks),
            schedule=options.schedule,
            start_method_expert=start,
            banks_of_expert=banks_of_expert,
            current_expert=current,
            num_experts=num_experts,
            step_counter=counter,
        )
        if handle.ensemble is not None:
            banks = list(banks_of_expert(current))
            if banks:
                handle.ensemble.active_expert = int(banks[-1])
            handle.attach_optimizer(options.optimizer)
        return cls(handle, family)

    # ---------------------------------------------------------------------------------- batch state
    @property
    def active(self) -> bool:
        return not self.handle.removed

    @property
    def batch(self) -> BatchState:
        """The handle's per-batch state, which the hooks fill and the head and ``end_batch`` read."""
        return self.handle.batch

    def query_seen(self, features: Tensor) -> None:
        """Query features of a forward: router statistics in training, routing at inference."""
        if self.handle.router is None:
            return
        if self.handle.training:
            self.handle.record_query(features)
        else:
            self.batch.eval_query = features.detach()

    def batch_seen(self, size: int) -> None:
        """A training forward of ``size`` samples (the default batch size of ``end_batch``)."""
        if self.handle.training:
            self.handle.record_batch_size(size)

    def banks_seen(self, banks: Optional[Tensor]) -> None:
        """Ensemble banks of a forward: moved after the optimizer step (training), ensembled (inference)."""
        if banks is None or self.handle.ensemble is None:
            return
        if self.handle.training:
            self.handle.record_trained_banks(banks.reshape(-1).long())
        else:
            self.batch.eval_banks = banks.detach().reshape(-1).long()

    def pop_query(self, size: Optional[int]) -> Tensor:
        """Router features of the current inference forward (``size``: the routed call's samples, checked)."""
        query, self.batch.eval_query = self.batch.eval_query, None
        if query is None:
            raise RuntimeError(
                f"fly_modules.adapters.{self.family}: the router is on but no query features were recorded before "
                f"the routing module ran at inference ({self.handle.query_source} did not run first in this forward); "
                "run it before the model (or pass the query through the route module's call)"
            )
        if size is not None and query.shape[0] != size:
            raise RuntimeError(
                f"fly_modules.adapters.{self.family}: the recorded query features hold {query.shape[0]} samples but "
                f"the routed call has {size}; run the query module on the same batch right before the model"
            )
        return query

    def pop_banks(self, size: int) -> Union[int, Tensor]:
        """Banks of the current inference forward; the active bank when none were recorded."""
        banks, self.batch.eval_banks = self.batch.eval_banks, None
        if banks is None or banks.shape[0] != size:
            banks = int(self.handle.ensemble.active_expert)
        self.handle.observed["banks"] = banks
        return banks

    def route(self, features: Tensor) -> Optional[Tensor]:
        """Routed expert ids at inference, ``None`` when the router is off, not fitted or removed."""
        if self.handle.training or not self.handle.routing_active():
            return None
        return self.handle.route(features).to(features.device)

    # ------------------------------------------------------------------------------------- installs
    def swap_head(
        self, owner: nn.Module, name: str, scorer: Optional[Callable[[Tensor], Tensor]] = None,
        is_training: Optional[Callable[[], bool]] = None,
    ) -> EnsembleLinear:
        """Replace ``owner.name`` by an :class:`EnsembleLinear` (undone by ``remove()``).

        The default scorer ensembles the banks the forward recorded with ``handle.logit_mask``;
        ``is_training`` (default: the model's mode) tells when the online head answers instead.
        """
        ensemble = self.handle.ensemble
        if scorer is None:
            def scorer(x: Tensor) -> Tensor:
                return ensemble_scores(ensemble, x, self.pop_banks(x.shape[0]), self.handle.logit_mask)
        wrapper = EnsembleLinear(ensemble.online, scorer, is_training or (lambda: self.handle.training))
        self.handle.install.set_attribute(owner, name, wrapper)
        return wrapper

    def query_class_token(self, model: nn.Module, backbone: nn.Module) -> None:
        """Router features: the prompt-free class token of ``backbone``, run by the retrofit on the model's
        input when the loop did not run it (the query of S-Prompts and CODA-Prompt)."""
        token = ClassToken(backbone)
        self.handle.query_source = "the prompt-free class token of model.backbone.forward_features (run by the retrofit)"
        self.run_query_when_missing(model, token)  # registered first: its pre-hook runs before a routing one
        self.hook_query_module(token, lambda features: features)

    def hook_query_module(self, module: nn.Module, query_from_output: Callable[[Any], Tensor]) -> None:
        def record(mod: nn.Module, args: Any, output: Any) -> None:
            if self.active:
                self.query_seen(query_from_output(output))

        self.handle.install.forward_hook(module, record)

    def run_query_when_missing(self, model: nn.Module, query_module: nn.Module) -> None:
        """Run ``query_module`` on ``model``'s input, under ``no_grad``, when a forward of ``model`` needs a
        query nobody recorded: the first training forward of a stream batch, or a routed inference call
        whose loop did not run it first. A loop that runs it itself pays nothing."""
        handle = self.handle

        def before(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
            if not self.active or handle.router is None:
                return
            missing = handle.batch.query is None if handle.training else (
                handle.routing_active() and self.batch.eval_query is None
            )
            images = first_tensor(args, kwargs)
            if missing and images is not None:
                with torch.no_grad():
                    query_module(images)

        handle.install.forward_pre_hook(model, before, with_kwargs=True)

    def hook_route_module(
        self,
        module: nn.Module,
        *,
        route_kwarg: Optional[str],
        route_value: Optional[RouteValue],
        query_from_call: Optional[QueryFromCall],
        banks_follow_routing: bool,
        used_from_output: Optional[UsedFromOutput] = None,
    ) -> None:
        """Pre-hook on the route module: reads the query from the call (if given) and injects the route.

        ``used_from_output`` maps the module's output to the experts it actually used: the first routed
        call is checked against them (:meth:`Retrofit.note_routed`).
        """
        handle = self.handle
        callee = f"{type(module).__name__}.forward"
        if route_kwarg is not None:
            require_keyword(module.forward, route_kwarg, family=self.family, callee=callee)

        def before(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
            self.batch.injected = None
            if not self.active or handle.router is None:
                return None
            if query_from_call is not None:
                query = query_from_call(mod, args, kwargs)
                if query is None:
                    raise RuntimeError(
                        f"fly_modules.adapters.{self.family}: no query features in the call of "
                        f"{type(mod).__name__}; pass query_module=... to read them elsewhere"
                    )
                if handle.training:
                    handle.record_query(query)
                    return None
            elif handle.training:
                return None
            elif not handle.routing_active():
                self.batch.eval_query = None
                return None
            else:
                first = args[0] if args and isinstance(args[0], Tensor) else None
                query = self.pop_query(None if first is None else first.shape[0])
            experts = self.route(query)
            if experts is None or route_kwarg is None:
                return None
            if banks_follow_routing:
                self.batch.eval_banks = experts
            self.batch.injected = experts
            handle.observed["routed"] = experts
            value = experts if route_value is None else route_value(experts, mod, args, kwargs)
            return args, {**kwargs, route_kwarg: value}

        handle.install.forward_pre_hook(module, before, with_kwargs=True)
        if used_from_output is not None:
            def after(mod: nn.Module, args: Any, output: Any) -> None:
                injected, self.batch.injected = self.batch.injected, None
                if injected is not None and self.active and handle.wants_observation:
                    handle.note_routed(injected, used_from_output(output), callee)

            handle.install.forward_hook(module, after)

    def hook_batch_size(self, module: nn.Module) -> None:
        """Record the size of ``module``'s training calls (first tensor argument) for ``end_batch``."""
        def before(mod: nn.Module, args: Tuple[Any, ...]) -> None:
            if self.active and args and isinstance(args[0], Tensor) and args[0].ndim > 0:
                self.batch_seen(args[0].shape[0])

        self.handle.install.forward_pre_hook(module, before)

    def hook_banks(self, module: nn.Module, bank_from_call: BankFromCall) -> None:
        def after(mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> None:
            if self.active:
                first = args[0] if args and isinstance(args[0], Tensor) else None
                if first is not None and first.ndim > 0:
                    self.batch_seen(first.shape[0])
                self.banks_seen(bank_from_call(mod, args, kwargs, output))

        self.handle.install.forward_hook(module, after, with_kwargs=True)
