"""The upstream prompt pools and how each is routed, per sample.

* The JH-LEE layout (``l2p-pytorch``, ``dualprompt-pytorch``; copied by HiDe-Prompt, NoRGa, Mammoth and
  LAMDA-PILOT): a ``Prompt`` with ``prompt_key`` and ``top_k``, routed through its ``prompt_mask``
  argument inside the routed expert's slots (:class:`PromptMaskPool`). Its E-prompt assembly may mix the
  samples of a batch (``_assembly``).
* The Si-Blurry layout (FlyGCL, MISA, Si-Blurry): a ``Prompt`` with ``key`` ``(P, D)`` and ``prompts``,
  called as ``pool(query[, s, e])``, routed by calling it once per routed expert in the batch with that
  expert's slot range, after probing that the range really changes the prompt returned (:class:`KeyPool`).

Both pools are :class:`~fly_modules.adapters.Layout` s. A :class:`PoolFamily` (L2P, DualPrompt) finds its pool
and builds the :class:`Plan` (head, experts, banks) in :meth:`PoolFamily.pool_plan`, the pool its layout with
its :class:`Slots`; the pool adds its seam checks to the plan (``check``) and installs its hooks.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError

from ._assembly import check_assembly
from ._expert_heads import ClassifierRefused, classifier_seat
from ._family import AdapterFamily, Plan
from ._groups import expert_groups, merge_groups
from ._layout import Layout
from ._query import default_query
from ._restore import Snapshot
from ._seams import GENERIC_CALL, SeamError, missing_seam, named_parameters

__all__ = [
    "KeyPool", "PoolFamily", "PromptMaskPool", "Slots", "is_key_pool", "prompt_mask_pool", "routable", "slice_layout",
]

QueryFromOutput = Optional[Callable[[Any], Tensor]]
#: what a Si-Blurry-lineage pool records of its latest call (FlyGCL), put back for the whole batch after a routed call
_SELECTIONS = ("last_selected_indices", "last_topk")


@dataclasses.dataclass
class Slots:
    """How a pool's slots map to experts and ensemble banks.

    Attributes:
        expert_of_slot: ``(P,)`` the expert owning each slot (``num_experts``: none); experts own
            contiguous ranges.
        bank_of_slot: ``(P,)`` the ensemble bank of each slot.
        ties_training: the loop trains each expert on its own slots, so ``verify()`` checks which it trains.
        query_module, query_from_output: read the router features from this module's output instead of
            the pool's call.
    """

    expert_of_slot: Tensor
    bank_of_slot: Tensor
    ties_training: bool
    query_module: Optional[nn.Module] = None
    query_from_output: QueryFromOutput = None

    def to(self, device: torch.device) -> "Slots":
        return dataclasses.replace(self, expert_of_slot=self.expert_of_slot.to(device),
                                   bank_of_slot=self.bank_of_slot.to(device))


# -------------------------------------------------------------------- JH-LEE: routed by prompt_mask
def prompt_mask_pool(model: nn.Module, attribute: str, what: str, *, family: str) -> nn.Module:
    """``model.<attribute>``, checked to be a JH-LEE prompt pool (``prompt_key``, ``top_k``)."""
    module = getattr(model, attribute, None)
    if not isinstance(module, nn.Module):
        raise missing_seam(model, attribute, what, family=family)
    for name in ("prompt_key", "top_k"):
        if not hasattr(module, name):
            raise missing_seam(model, f"{attribute}.{name}", what, family=family)
    if not isinstance(module.prompt_key, Tensor) or module.prompt_key.ndim != 2:
        raise SeamError(
            f"fly_modules.adapters.{family}: `{attribute}.prompt_key` must be a (pool, D) tensor of keys, found "
            f"{type(module.prompt_key).__name__}; for other layouts use {GENERIC_CALL}"
        )
    return module


def _call_argument(args: Tuple[Any, ...], kwargs: Dict[str, Any], position: int, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[position] if len(args) > position else None


def key_query(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tensor:
    """The query a JH-LEE ``Prompt`` matches its keys against, from its call ``(x_embed, prompt_mask,
    cls_features)``, following its ``embedding_key`` (``cls``/``mean``/``max``/``mean_max``)."""
    x_embed = _call_argument(args, kwargs, 0, "x_embed")
    cls_features = _call_argument(args, kwargs, 2, "cls_features")
    mode = getattr(module, "embedding_key", "cls")
    if mode == "cls" and cls_features is not None:
        return cls_features
    if mode == "mean":
        return x_embed.mean(dim=1)
    if mode == "mean_max":
        return x_embed.max(dim=1)[0] + 2 * x_embed.mean(dim=1)
    if mode in ("max", "cls"):
        return x_embed.max(dim=1)[0]
    raise SeamError(f"unsupported embedding_key {mode!r} of {type(module).__name__}")


def router_query_of_call(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tensor:
    """Router features from a JH-LEE prompt call: ``cls_features`` when given, else the key query."""
    cls_features = _call_argument(args, kwargs, 2, "cls_features")
    return cls_features if cls_features is not None else key_query(module, args, kwargs)


def slice_layout(pool: int, num_experts: int, slots_per_expert: Optional[int], top_k: int, *, family: str,
                 remainder_to_last: bool) -> Tuple[int, Tensor]:
    """``(S, expert_of_slot)``: slots per expert and the ``(pool,)`` expert owning each slot (``num_experts``
    for unowned slots when ``remainder_to_last`` is off)."""
    size = int(slots_per_expert) if slots_per_expert is not None else pool // num_experts
    if size < 1 or size * num_experts > pool:
        raise InvalidParameterError(
            f"fly_modules.adapters.{family}: {num_experts} experts of {size} slots do not fit a pool of {pool}"
        )
    if size < top_k:
        raise InvalidParameterError(
            f"fly_modules.adapters.{family}: each expert owns {size} slots, fewer than top_k={top_k}; "
            f"use slots_per_expert >= {top_k} or fewer experts"
        )
    expert_of_slot = torch.div(torch.arange(pool), size, rounding_mode="floor")  # `//` on a tensor warns on torch 1.12
    return size, expert_of_slot.clamp(max=num_experts - 1 if remainder_to_last else num_experts)


class PromptMaskPool(Layout):
    """The JH-LEE wiring shared by L2P and DualPrompt: route by ``prompt_mask`` inside the routed
    expert's slots, bank = ``bank_of_slot[prompt_idx[:, 0]]``."""

    def __init__(self, family: AdapterFamily, prompt: nn.Module, slots: Slots) -> None:
        super().__init__(family)
        self.prompt, self.slots = prompt, slots.to(prompt.prompt_key.device)

    @classmethod
    def matches(cls, owner: Any) -> bool:
        """A JH-LEE pool: it keeps its keys as ``prompt_key``."""
        return hasattr(owner, "prompt_key")

    def check(self, plan: Plan) -> Plan:
        """``plan`` with the assembly correction the options ask for; refuses what cannot be routed."""
        options, name = self.options, self.family.family
        if options.router:
            self.family.require_keyword(self.prompt.forward, "prompt_mask", callee=f"{type(self.prompt).__name__}.forward")
            check_key_width(self.family, plan, self.prompt, "prompt_key", self.slots.query_module is None)
        corrections = check_assembly(self.prompt, family=name, router=options.router, correct=options.correct_assembly)
        plan.corrections = [*plan.corrections, *corrections]
        return plan

    def prompt_mask(self, experts: Tensor, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tensor:
        """The method's own top-k key match, restricted to each sample's routed expert's slots."""
        query = key_query(module, args, kwargs)
        keys = module.prompt_key
        similarity = F.normalize(query.to(keys.dtype), dim=-1) @ F.normalize(keys, dim=-1).t()
        expert_of_slot = self.slots.expert_of_slot
        outside = expert_of_slot.unsqueeze(0) != experts.to(expert_of_slot.device).unsqueeze(1)
        similarity = similarity.masked_fill(outside, float("-inf"))
        return similarity.topk(int(module.top_k), dim=1, largest=True, sorted=True).indices

    def first_slot(self, output: Any) -> Optional[Tensor]:
        index = output.get("prompt_idx") if isinstance(output, dict) else None
        return None if index is None else index[:, 0].to(self.slots.expert_of_slot.device)

    def used_expert(self, output: Any) -> Optional[Tensor]:
        slot = self.first_slot(output)
        return None if slot is None else self.slots.expert_of_slot[slot]

    def observe(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> Optional[Tensor]:
        """The banks of a call (and, in training, the expert it trained)."""
        used = self.used_expert(output)
        if used is not None and self.record.training and self.slots.ties_training:
            self.record.seen(trained=used)
        slot = self.first_slot(output)
        return None if slot is None else self.slots.bank_of_slot[slot]

    def install_hooks(self) -> None:
        slots = self.slots
        if self.options.router:
            if slots.query_module is not None:
                self.read_query(slots.query_module, slots.query_from_output or default_query, "query_module")
            else:
                self.record.query_source = f"the cls_features of the {type(self.prompt).__name__} calls"
            self.route_keyword(
                self.prompt, "prompt_mask", value=self.prompt_mask,
                query_from_call=None if slots.query_module is not None else router_query_of_call,
                used_from_output=self.used_expert,
            )
        self.read_banks(self.prompt, self.observe)


# ---------------------------------------------------------- Si-Blurry lineage: routed by slot range
def is_key_pool(module: Any) -> bool:
    return isinstance(module, nn.Module) and isinstance(getattr(module, "key", None), Tensor) \
        and isinstance(getattr(module, "prompts", None), Tensor)


def routable(pool: nn.Module) -> bool:
    """Its forward names the slot range ``s, e`` (FlyGCL, MISA); Si-Blurry's takes ``**kwargs`` only."""
    return {"s", "e"} <= named_parameters(pool.forward)


def _slot_range(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Optional[int], Optional[int]]:
    s = kwargs.get("s", args[0] if len(args) > 0 else None)
    e = kwargs.get("e", args[1] if len(args) > 1 else None)
    return s, e


def _chosen_rows(pool: nn.Module, output: Any) -> Optional[Tensor]:
    """``(B, P)``: which pool rows equal each sample's first returned prompt (``output[1][:, 0]``)."""
    chosen = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
    if not isinstance(chosen, Tensor) or chosen.ndim != 4:
        return None
    rows = pool.prompts.detach().flatten(1)
    return (chosen[:, 0].detach().flatten(1).unsqueeze(1) == rows.unsqueeze(0)).all(-1)


def _check_range_moves_prompt(pool: nn.Module, start: int, end: int, *, family: str) -> None:
    """Call the pool once with the key of slot ``start`` as query and range ``[start, end)``: a pool
    that returns ``prompts[i - start]`` (a slice-local index: kangzhiq/MISA) instead of ``prompts[i]``
    cannot be routed by the range. Everything the call changes is put back."""
    rows = pool.prompts.detach()
    if torch.equal(rows[start], rows[0]):
        return  # the rows cannot tell local from global indices; the first routed call checks again
    snapshot = Snapshot([pool], [])
    try:
        pool.eval()
        with torch.no_grad():
            hit = _chosen_rows(pool, pool(pool.key.detach()[start:start + 1], s=start, e=end))
    except Exception:  # noqa: BLE001  (an unusual pool: left to the runtime check)
        hit = None
    finally:
        snapshot.restore(final=True)
    if hit is not None and bool(hit[0, 0]) and not bool(hit[0, start]):
        raise SeamError(
            f"fly_modules.adapters.{family}: {type(pool).__name__}.forward(query, s, e) matches key[s:e] but returns "
            f"prompts[i - s] (a slice-local index), so every step trains and uses the same prompts and the routed "
            f"step changes no prompt (kangzhiq/MISA). Retrofit with router=False (the ensemble works), or return "
            f"prompts[i + s] in your copy; other seams: {GENERIC_CALL}"
        )


class KeyPool(Layout):
    """The Si-Blurry-lineage wiring: ``pool.forward`` is wrapped (an instance attribute); training calls
    are recorded (query, banks, the expert trained); routed inference calls run once per expert present in
    the batch with that expert's slot range, never once per sample."""

    def __init__(self, family: AdapterFamily, pool: nn.Module, slots: Slots) -> None:
        super().__init__(family)
        self.pool = pool
        self.slots = slots.to(pool.key.device)
        self.callee = f"{type(pool).__name__}.forward"
        self.original: Callable[..., Any] = pool.forward
        self.query_name = "query"
        self.spans: List[Tuple[int, int]] = []

    @classmethod
    def matches(cls, owner: Any) -> bool:
        """A Si-Blurry-lineage pool: ``key`` and ``prompts`` tensors."""
        return is_key_pool(owner)

    def check(self, plan: Plan) -> Plan:
        """Refuses a pool the router cannot restrict to an expert's slots; ``plan`` unchanged."""
        name, options, pool = self.family.family, self.options, self.pool
        expert_of_slot = self.slots.expert_of_slot
        self.spans = [(int(s[0]), int(s[-1]) + 1) for s in
                      ((expert_of_slot == e).nonzero().flatten() for e in range(plan.num_experts))]
        if not options.router:
            return plan
        why = ("without a slot range nothing restricts its key match to the routed expert's slots (Si-Blurry's "
               "Prompt also trains by a pool-wide match, so no step owns a prompt); retrofit it with router=False "
               "(the ensemble works)")
        self.family.require_keyword(pool.forward, "s", callee=self.callee, why=why)
        self.family.require_keyword(pool.forward, "e", callee=self.callee, why=why)
        check_key_width(self.family, plan, pool, "key", self.slots.query_module is None)
        if getattr(pool, "_batchwise_selection", False):
            raise SeamError(f"{self.caller}: {type(pool).__name__}._batchwise_selection picks one "
                            "prompt set per batch, which routing per sample cannot respect; turn it off or use router=False")
        if plan.num_experts > 1:
            _check_range_moves_prompt(pool, *self.spans[1], family=name)
        return plan

    def install_hooks(self) -> None:
        query_module = self.slots.query_module
        if self.options.router and query_module is not None:
            self.read_query(query_module, self.slots.query_from_output or default_query, "query_module")
        elif self.options.router:
            self.record.query_source = f"the query argument of the {self.callee} calls"
        parameters = list(inspect.signature(self.original).parameters)
        self.query_name = parameters[0] if parameters else "query"
        self.install.set_attribute(self.pool, "forward", self.forward)

    # --------------------------------------------------------------------------------- the wrapper
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        record = self.record
        if args:
            query, args = args[0], args[1:]
        else:
            query = kwargs.pop(self.query_name)
        if record.training:
            return self.train_forward(query, args, kwargs)
        router = self.options.router
        if router and self.slots.query_module is not None:
            features = record.pop_query(query.shape[0]) if record.routing_active() else None
            record.eval_query = None
        else:
            features = query if router else None
        experts = None if features is None else record.route(features)
        if experts is None:
            output, slots, _ = self.call(query, args, kwargs)
            record.seen(banks=self.slots.bank_of_slot[slots])
            return output
        return self.routed_forward(query, experts, kwargs)

    def call(self, query: Tensor, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Tensor, Optional[int]]:
        """``(output, top-1 slot of each sample, range start)`` of one call of the pool."""
        before = getattr(self.pool, "last_selected_indices", None)
        output = self.original(query, *args, **kwargs)
        start, end = _slot_range(args, kwargs)
        return output, self.top1_slot(query.detach(), start, end, before), start

    def top1_slot(self, query: Tensor, start: Optional[int], end: Optional[int], before: Any) -> Tensor:
        recorded = getattr(self.pool, "last_selected_indices", None)
        if isinstance(recorded, Tensor) and recorded is not before:
            return recorded[:, 0]
        keys = self.pool.key if start is None else self.pool.key[start:end]
        match = 1 - F.cosine_similarity(query.unsqueeze(1), keys, dim=-1)
        return match.topk(1, dim=-1, largest=False).indices[:, 0] + (0 if start is None else int(start))

    def train_forward(self, query: Tensor, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        expert_of_slot = self.slots.expert_of_slot
        output, slots, start = self.call(query, args, kwargs)
        trained = None
        if self.slots.ties_training:
            trained = torch.full_like(slots, int(expert_of_slot[start])) if start is not None else expert_of_slot[slots]
        self.record.seen(query.shape[0], query=query if self.slots.query_module is None else None,
                         banks=self.slots.bank_of_slot[slots], trained=trained)
        return output

    def routed_forward(self, query: Tensor, experts: Tensor, kwargs: Dict[str, Any]) -> Any:
        record = self.record
        rest = {k: v for k, v in kwargs.items() if k not in ("s", "e")}
        parts, rows, slot_parts = [], [], []
        selections: List[List[Tensor]] = [[] for _ in _SELECTIONS]
        for expert, index in expert_groups(experts):
            start, end = self.spans[expert]
            output, slots, _ = self.call(query[index], (), {**rest, "s": start, "e": end})
            parts.append(output)
            rows.append(index)
            slot_parts.append(slots)
            for name, values in zip(_SELECTIONS, selections):
                value = getattr(self.pool, name, None)
                if isinstance(value, Tensor):
                    values.append(value)
        merged = merge_groups(parts, rows)
        for name, values in zip(_SELECTIONS, selections):
            if len(values) == len(rows):  # the pool's record of its latest call, for the whole batch
                setattr(self.pool, name, merge_groups(values, rows))
        if self.options.ensemble:
            record.seen(banks=self.slots.bank_of_slot[merge_groups(slot_parts, rows)])
        if record.wants_observation:
            record.used_by_routed(experts, self.used_experts(merged, experts), self.callee)
        return merged

    def used_experts(self, output: Any, experts: Tensor) -> Optional[Tensor]:
        """The expert owning the prompt each sample's output holds (any equal row inside the routed
        expert's range counts: tiled prompt files repeat rows)."""
        hit = _chosen_rows(self.pool, output)
        if hit is None:
            return None
        expert_of_slot = self.slots.expert_of_slot
        inside = (hit & (expert_of_slot.unsqueeze(0) == experts.unsqueeze(1))).any(1)
        first_hit = torch.where(hit.any(1), expert_of_slot[hit.float().argmax(1)], torch.full_like(experts, -1))
        return torch.where(inside, experts, first_hit)


def _key_width(layout: Any) -> Optional[int]:
    keys = layout.prompt.prompt_key if isinstance(layout, PromptMaskPool) else getattr(layout.pool, "key", None)
    return int(keys.shape[-1]) if isinstance(keys, Tensor) else None


def _router_width(plan: Plan) -> Optional[int]:
    """The width the router will be sized to: ``router_dim``, else the classifier's input (``None``: unknown)."""
    if plan.router_dim is not None:
        return int(plan.router_dim)
    try:
        first = classifier_seat(plan.head).first_linear()
    except ClassifierRefused:
        return None
    return None if first is None else int(first.in_features)


def check_key_width(family: AdapterFamily, plan: Plan, pool: nn.Module, attribute: str, query_from_call: bool) -> None:
    """Before anything is installed: the keys the routed key match reads are as wide as the queries matched
    against them (a fork keeping its keys in a projected space is refused), and, when the router reads the
    pool's own query, the router is as wide as that query."""
    keys = getattr(pool, attribute)
    width, embed = int(keys.shape[-1]), getattr(pool, "embed_dim", None)
    where = f"{type(pool).__name__}.{attribute} {tuple(keys.shape)}"
    if isinstance(embed, int) and not isinstance(embed, bool) and embed != width:
        raise SeamError(
            f"{family.caller}: {where} holds keys of width {width} but the pool's queries are {embed} wide "
            f"(embed_dim): its keys live in another space (a projection inside its forward), which the routed key "
            f"match cannot reproduce. Retrofit with router=False (the ensemble works), or route it with {GENERIC_CALL}"
        )
    router = _router_width(plan)
    if query_from_call and router is not None and router != width:
        raise SeamError(
            f"{family.caller}: the router reads the query the pool matches against {where} ({width} wide) but would "
            f"be {router} wide (router_dim, else the classifier's in_features); pass router_dim={width}, or "
            "query_module=... to read the router's features elsewhere"
        )


class PoolFamily(AdapterFamily):
    """A family whose experts own slots of a prompt pool: :meth:`pool_plan` recognises the pool's layout and
    returns the plan carrying the pool (a :class:`KeyPool` or a :class:`PromptMaskPool`)."""

    def recognise(
        self,
        *,
        num_experts: Optional[int] = None,
        slots_per_expert: Optional[int] = None,
        query_module: Optional[nn.Module] = None,
        query_from_output: Optional[Callable[[Any], Tensor]] = None,
        start_expert: Optional[Callable[[int], None]] = None,
        router_dim: Optional[int] = None,
    ) -> Plan:
        plan = self.pool_plan(num_experts, slots_per_expert, dict(query_module=query_module,
                                                                   query_from_output=query_from_output))
        # the router reads the query the pool matches against its keys, unless query_module says otherwise
        width = None if query_module is not None else _key_width(plan.layout)
        return dataclasses.replace(plan, start_expert=start_expert, router_dim=router_dim, query_width=width)

    def pool_plan(self, num_experts: Optional[int], slots_per_expert: Optional[int], query: Dict[str, Any]) -> Plan:
        """The plan of the model's pool (``query``: the :class:`Slots` query options)."""
        raise NotImplementedError(f"{type(self).__name__} must define pool_plan")
