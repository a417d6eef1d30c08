"""The Si-Blurry-lineage prompt pool (``Prompt`` with ``key`` ``(P, D)`` and ``prompts``, called as
``pool(query[, s, e])``; FlyGCL, MISA, Si-Blurry): routed by calling it once per routed expert in the
batch with that expert's slot range, after probing that the range really changes the prompt returned."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._errors import GENERIC_CALL, SeamError
from ._handle import Retrofit, StepCounter
from ._options import RetrofitOptions
from ._signatures import named_parameters, require_keyword
from ._snapshot import Snapshot
from ._steps import expert_starter
from ._wiring import Wiring, default_query

__all__ = ["is_key_pool", "routable", "wire_key_pool"]


def is_key_pool(module: Any) -> bool:
    return isinstance(module, nn.Module) and isinstance(getattr(module, "key", None), Tensor) \
        and isinstance(getattr(module, "prompts", None), Tensor)


def routable(pool: nn.Module) -> bool:
    """Its forward names the slot range ``s, e`` (FlyGCL, MISA); Si-Blurry's takes ``**kwargs`` only."""
    return {"s", "e"} <= named_parameters(pool.forward)


def _merge_groups(parts: List[Any], rows: List[Tensor]) -> Any:
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
        merged = [_merge_groups([p[i] for p in parts], rows) for i in range(len(first))]
        return type(first)(merged) if isinstance(first, list) else tuple(merged)
    if isinstance(first, dict):
        return {key: _merge_groups([p[key] for p in parts], rows) for key in first}
    return parts[-1]


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


def _check_range_moves_prompt(pool: nn.Module, family: str, start: int, end: int) -> None:
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


def wire_key_pool(
    model: nn.Module,
    pool: nn.Module,
    options: RetrofitOptions,
    *,
    family: str,
    head: Tuple[nn.Module, str],
    num_experts: int,
    owner: Tensor,
    bank_of_slot: Tensor,
    num_banks: int,
    banks_of_expert: Callable[[int], Sequence[int]],
    counter: Optional[StepCounter],
    ties_training: bool,
    query_module: Optional[nn.Module],
    query_from_output: Optional[Callable[[Any], Tensor]],
    start_expert: Optional[Callable[[int], None]],
    router_dim: Optional[int],
) -> Retrofit:
    """Wrap ``pool.forward`` (instance attribute): training calls are recorded (query, banks, the expert
    trained); routed inference calls run once per expert present in the batch, never once per sample.

    ``owner`` ``(P,)``: the expert owning each slot (``num_experts`` for none); experts own contiguous
    ranges. ``bank_of_slot`` ``(P,)``: the ensemble bank of each slot. ``ties_training``: the model
    trains each expert on its own range (a step counter), so verify() checks which range it trains.
    """
    callee = f"{type(pool).__name__}.forward"
    if options.router:
        why = ("without a slot range nothing restricts its key match to the routed expert's slots (Si-Blurry's Prompt "
               "also trains by a pool-wide match, so no step owns a prompt); retrofit it with router=False (the "
               "ensemble works)")
        require_keyword(pool.forward, "s", family=family, callee=callee, why=why)
        require_keyword(pool.forward, "e", family=family, callee=callee, why=why)
        if getattr(pool, "_batchwise_selection", False):
            raise SeamError(f"fly_modules.adapters.{family}: {type(pool).__name__}._batchwise_selection picks one "
                            "prompt set per batch, which routing per sample cannot respect; turn it off or use router=False")
    owner = owner.to(pool.key.device)
    bank_of_slot = bank_of_slot.to(pool.key.device)
    spans = [(int(s[0]), int(s[-1]) + 1) for s in ((owner == e).nonzero().flatten() for e in range(num_experts))]
    if options.router and num_experts > 1:
        _check_range_moves_prompt(pool, family, *spans[1])
    head_owner, head_name = head
    wiring = Wiring.create(
        model, family, options, classifier=getattr(head_owner, head_name), num_experts=num_experts,
        num_banks=num_banks, banks_of_expert=banks_of_expert, start_method_expert=expert_starter(counter, start_expert),
        router_dim=router_dim, current_expert=counter.read() if counter is not None else 0, step_counter=counter,
    )
    handle = wiring.handle
    if not options.router and not options.ensemble:
        return handle
    if options.router and query_module is not None:
        handle.query_source = f"the forward of {type(query_module).__name__} (query_module)"
        wiring.hook_query_module(query_module, query_from_output or default_query)
    elif options.router:
        handle.query_source = f"the query argument of the {callee} calls"

    original = pool.forward
    parameters = list(inspect.signature(original).parameters)
    query_name = parameters[0] if parameters else "query"

    def top1_slot(query: Tensor, s: Optional[int], e: Optional[int], before: Any) -> Tensor:
        recorded = getattr(pool, "last_selected_indices", None)
        if isinstance(recorded, Tensor) and recorded is not before:
            return recorded[:, 0]
        keys = pool.key if s is None else pool.key[s:e]
        match = 1 - F.cosine_similarity(query.unsqueeze(1), keys, dim=-1)
        return match.topk(1, dim=-1, largest=False).indices[:, 0] + (0 if s is None else int(s))

    def used_experts(output: Any, experts: Tensor) -> Optional[Tensor]:
        """The expert owning the prompt each sample's output holds (any equal row inside the routed
        expert's range counts: tiled prompt files repeat rows)."""
        hit = _chosen_rows(pool, output)
        if hit is None:
            return None
        inside = (hit & (owner.unsqueeze(0) == experts.unsqueeze(1))).any(1)
        first_hit = torch.where(hit.any(1), owner[hit.float().argmax(1)], torch.full_like(experts, -1))
        return torch.where(inside, experts, first_hit)

    def call(query: Tensor, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Tensor, Optional[int]]:
        before = getattr(pool, "last_selected_indices", None)
        output = original(query, *args, **kwargs)
        s, e = _slot_range(args, kwargs)
        return output, top1_slot(query.detach(), s, e, before), s

    def train_forward(query: Tensor, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        wiring.batch_seen(query.shape[0])
        if query_module is None:
            wiring.query_seen(query)
        output, slots, start = call(query, args, kwargs)
        if ties_training:
            handle.note_trained(torch.full_like(slots, int(owner[start])) if start is not None else owner[slots])
        wiring.banks_seen(bank_of_slot[slots])
        return output

    def routed_forward(query: Tensor, experts: Tensor, kwargs: Dict[str, Any]) -> Any:
        rest = {k: v for k, v in kwargs.items() if k not in ("s", "e")}
        parts, rows, slot_parts, records = [], [], [], {}
        for expert in torch.unique(experts).tolist():
            index = (experts == expert).nonzero().squeeze(1)
            start, end = spans[expert]
            output, slots, _ = call(query[index], (), {**rest, "s": start, "e": end})
            parts.append(output)
            rows.append(index)
            slot_parts.append(slots)
            for name in ("last_selected_indices", "last_topk"):
                value = getattr(pool, name, None)
                if isinstance(value, Tensor):
                    records.setdefault(name, []).append(value)
        merged = _merge_groups(parts, rows)
        for name, values in records.items():
            if len(values) == len(rows):
                setattr(pool, name, _merge_groups(values, rows))
        if options.ensemble:
            wiring.banks_seen(bank_of_slot[_merge_groups(slot_parts, rows)])
        handle.observed["routed"] = experts
        if handle.wants_observation:
            handle.note_routed(experts, used_experts(merged, experts), callee)
        return merged

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not wiring.active:
            return original(*args, **kwargs)
        if args:
            query, args = args[0], args[1:]
        else:
            query = kwargs.pop(query_name)
        if handle.training:
            return train_forward(query, args, kwargs)
        if options.router and query_module is not None:
            features = wiring.pop_query(query.shape[0]) if handle.routing_active() else None
            wiring.eval_query = None
        else:
            features = query if options.router else None
        experts = None if features is None else wiring.route(features)
        if experts is None:
            output, slots, _ = call(query, args, kwargs)
            wiring.banks_seen(bank_of_slot[slots])
            return output
        return routed_forward(query, experts, kwargs)

    handle.install.set_attribute(pool, "forward", forward)
    if options.ensemble:
        wiring.swap_head(head_owner, head_name)
    return handle
