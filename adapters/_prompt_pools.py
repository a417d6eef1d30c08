"""The upstream prompt pools and how each is routed, per sample.

* The JH-LEE layout (``l2p-pytorch``, ``dualprompt-pytorch``; copied by HiDe-Prompt, NoRGa, Mammoth and
  LAMDA-PILOT): a ``Prompt`` with ``prompt_key`` and ``top_k``, routed through its ``prompt_mask``
  argument inside the routed expert's slots.
* Its prefix assembly defect: the E-prompt pools gather ``prompt[:, :, idx]`` into a ``(layers,
  key/value, B, top_k, length, heads, head_dim)`` tensor and ``reshape`` it to ``(layers, B, key/value,
  ...)`` without moving the batch axis in front of the key/value axis. The reshape only relabels memory:
  for ``B > 1`` sample ``b`` gets the rows ``2b`` and ``2b + 1`` of the ``(key/value, B)`` grid, i.e.
  other samples' prompts and the key half as values. A probe finds it; ``correct_assembly`` relabels the
  memory back and moves the axis (exact, differentiable).
* The Si-Blurry layout (FlyGCL, MISA, Si-Blurry): a ``Prompt`` with ``key`` ``(P, D)`` and ``prompts``,
  called as ``pool(query[, s, e])``, routed by calling it once per routed expert in the batch with that
  expert's slot range, after probing that the range really changes the prompt returned.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError

from ._handle import Retrofit, StepCounter
from ._options import RetrofitOptions
from ._restore import Installation, Snapshot
from ._wiring import (
    GENERIC_CALL,
    SeamError,
    Wiring,
    default_query,
    find_head,
    merge_groups,
    missing_seam,
    named_parameters,
    require_keyword,
)

__all__ = [
    "AssemblyProbe", "check_assembly", "correct_prefix_assembly", "install_assembly_correction", "is_key_pool",
    "probe_assembly", "prompt_mask_pool", "routable", "slice_layout", "wire_key_pool", "wire_prompt_mask_pool",
]


# -------------------------------------------------------------------- JH-LEE: routed by prompt_mask
def prompt_mask_pool(model: nn.Module, family: str, attribute: str, what: str) -> nn.Module:
    """``model.<attribute>``, checked to be a JH-LEE prompt pool (``prompt_key``, ``top_k``)."""
    module = getattr(model, attribute, None)
    if not isinstance(module, nn.Module):
        raise missing_seam(family, model, attribute, what)
    for name in ("prompt_key", "top_k"):
        if not hasattr(module, name):
            raise missing_seam(family, model, f"{attribute}.{name}", what)
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


def slice_layout(pool: int, num_experts: int, slots_per_expert: Optional[int], top_k: int, family: str,
                 *, remainder_to_last: bool) -> Tuple[int, Tensor]:
    """``(S, owner)``: slots per expert and the ``(pool,)`` expert owning each slot (``num_experts`` for
    unowned slots when ``remainder_to_last`` is off)."""
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
    owner = torch.arange(pool) // size
    owner = owner.clamp(max=num_experts - 1) if remainder_to_last else owner.clamp(max=num_experts)
    return size, owner


# ------------------------------------------------------------------------------ the prefix assembly
OPTION = "correct_assembly"
_PROBE_BATCH = 4  # even and > 2: the relabelling then also swaps key and value halves


def correct_prefix_assembly(batched: Tensor) -> Tensor:
    """``(L, B, 2, T, H, hd)`` made by ``raw.reshape`` of a ``(L, 2, B, ...)`` tensor -> the per-sample one."""
    layers, batch, dual = batched.shape[:3]
    rest = batched.shape[3:]
    return batched.reshape(layers, dual, batch, *rest).transpose(1, 2).reshape(batched.shape)


class AssemblyProbe:
    """What a probe call found: ``mixes`` (a sample's prompt depends on the batch) and ``correctable``
    (:func:`correct_prefix_assembly` makes every sample's prompt its own)."""

    def __init__(self, callee: str, mixes: bool, correctable: bool, detail: str) -> None:
        self.callee, self.mixes, self.correctable, self.detail = callee, mixes, correctable, detail


def _callee(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}.forward"


def probe_assembly(module: nn.Module) -> Optional[AssemblyProbe]:
    """Call a JH-LEE-style E-prompt pool (``prompt``, ``prompt_key``, ``forward(x_embed, prompt_mask=...)``
    returning ``batched_prompt`` ``(L, B, ...)``) on a batch whose samples select different slots, and on
    each sample alone; ``None`` when the module does not look like one. The pool's prompts are filled with
    distinct values for the probe (zero-initialised pools would hide a mix) and everything is put back."""
    prompt, keys = getattr(module, "prompt", None), getattr(module, "prompt_key", None)
    if not isinstance(prompt, Tensor) or prompt.ndim < 3:
        return None
    # Without learnable keys (HiDe's prompt_key=False) the pool's prompt_key is a prompt mean of another shape.
    learned = isinstance(keys, Tensor) and keys.ndim == 2
    pool = int(getattr(module, "pool_size", 0) or (keys.shape[0] if learned else 0))
    width = prompt.shape[-2] * prompt.shape[-1] if prompt.ndim == 6 else prompt.shape[-1]  # heads x head_dim
    dim = int(getattr(module, "embed_dim", 0) or (keys.shape[1] if learned else width))
    top_k = int(getattr(module, "top_k", 1) or 1)
    if pool < 2 or dim < 1 or top_k > pool:
        return None
    generator = torch.Generator().manual_seed(0)  # the global random state stays untouched
    x_embed = torch.randn(_PROBE_BATCH, 3, dim, generator=generator).to(device=prompt.device, dtype=prompt.dtype)
    slots = (torch.arange(_PROBE_BATCH).unsqueeze(1) + torch.arange(top_k)) % pool
    mask = slots.to(prompt.device)
    snapshot = Snapshot([module], [])
    try:
        module.eval()
        with torch.no_grad():
            prompt.copy_(torch.arange(prompt.numel(), dtype=prompt.dtype, device=prompt.device).reshape(prompt.shape))
            together = _batched(module(x_embed, prompt_mask=mask))
            alone = [_batched(module(x_embed[b:b + 1], prompt_mask=mask[b:b + 1])) for b in range(_PROBE_BATCH)]
    except Exception:  # noqa: BLE001  (an unusual pool: left to verify's batch-independence check)
        return None
    finally:
        snapshot.restore(final=True)
    if together is None or any(a is None for a in alone) or together.ndim < 2 or together.shape[1] != _PROBE_BATCH:
        return None
    alone_batch = torch.cat(alone, dim=1)
    callee = _callee(module)
    if alone_batch.shape == together.shape and torch.equal(together, alone_batch):
        return AssemblyProbe(callee, False, False, "each sample's prompt is its own")
    correctable = together.ndim == 6 and together.shape[2] == 2 and torch.equal(
        correct_prefix_assembly(together), alone_batch)
    return AssemblyProbe(callee, True, correctable, (
        f"{callee} assembles the prefix prompts of a batch with a reshape of its (layers, key/value, batch, ...) "
        "gather into (layers, batch, key/value, ...) that does not move the batch axis, so each sample's key and "
        "value prefixes come from other samples of the batch (and from the key half as values)"
        if correctable else
        f"{callee} gives a sample of a {_PROBE_BATCH}-sample batch other prompts than the sample alone"
    ))


def _batched(output: Any) -> Optional[Tensor]:
    value = output.get("batched_prompt") if isinstance(output, dict) else None
    return value.detach().clone() if isinstance(value, Tensor) else None


def install_assembly_correction(handle: Retrofit, module: nn.Module, install: Optional[Installation] = None) -> None:
    """A forward hook on ``module`` replacing its ``batched_prompt`` by the per-sample assembly, in the
    handle's installation (undone by ``remove()`` with the rest of the retrofit) or in ``install``.
    The handle keeps how to make it again: ``verify()`` compares with the corrected model alone."""
    if install is None:
        install = handle.install
        handle.corrections.append(lambda other: install_assembly_correction(handle, module, other))

    def correct(mod: nn.Module, args: Any, output: Any) -> Any:
        batched = output.get("batched_prompt") if isinstance(output, dict) else None
        if not isinstance(batched, Tensor) or batched.ndim != 6:
            return None
        fixed: Dict[str, Any] = dict(output)
        fixed["batched_prompt"] = correct_prefix_assembly(batched)
        return fixed

    install.forward_hook(module, correct)


def check_assembly(module: nn.Module, *, family: str, router: bool, correct: bool) -> bool:
    """Probe ``module`` when the option or the router needs it; ``True`` when the correction must be installed.

    Called before anything is installed. ``router=True`` on a mixing pool without ``correct_assembly=True``
    raises :class:`SeamError` (the routed expert would reach its sample mixed with its neighbours');
    ``router=False`` without the option leaves the pool untouched (not even probed);
    ``correct_assembly=True`` corrects it for every variant, and is a no-op on a pool that does not mix.
    """
    if not (router or correct):
        return False
    probe = probe_assembly(module)
    if probe is None or not probe.mixes:
        return False
    if not probe.correctable:
        raise SeamError(
            f"fly_modules.adapters.{family}: {probe.detail}: a sample's prompt depends on the other samples of the "
            f"batch and {OPTION}=True does not know this assembly. Make the prompt of each sample its own in your "
            f"copy, or route through another seam: {GENERIC_CALL}"
        )
    if correct:
        return True
    raise SeamError(
        f"fly_modules.adapters.{family}: {probe.detail}. The router's expert would reach each sample mixed with "
        f"its neighbours' prompts. Retrofit with {OPTION}=True: it corrects the assembly for every variant "
        f"(router=False too, for a like-with-like baseline) and remove() undoes it; router=False without it "
        "leaves the model as it is"
    )


def wire_prompt_mask_pool(
    model: nn.Module,
    family: str,
    prompt: nn.Module,
    owner: Tensor,
    options: RetrofitOptions,
    *,
    num_experts: int,
    num_banks: int,
    ties_training: bool,
    bank_of_slot: Tensor,
    banks_of_expert: Callable[[int], Sequence[int]],
    query_module: Optional[nn.Module],
    query_from_output: Optional[Callable[[Any], Tensor]],
    start_expert: Optional[Callable[[int], None]],
    router_dim: Optional[int],
) -> Retrofit:
    """The JH-LEE wiring shared by L2P and DualPrompt: route by ``prompt_mask`` inside the routed
    expert's slots, bank = ``bank_of_slot[prompt_idx[:, 0]]``, ensemble on ``model.head``.
    ``ties_training``: the loop trains expert ``t`` on its own slots (``use_prompt_mask``)."""
    head_owner, head_name = find_head(model, family)
    if options.router:
        require_keyword(prompt.forward, "prompt_mask", family=family, callee=f"{type(prompt).__name__}.forward")
    correct = check_assembly(prompt, family=family, router=options.router, correct=options.correct_assembly)
    device = prompt.prompt_key.device
    owner = owner.to(device)
    bank_of_slot = bank_of_slot.to(device)
    wiring = Wiring.create(
        model, family, options, classifier=getattr(head_owner, head_name), num_experts=num_experts,
        num_banks=num_banks, banks_of_expert=banks_of_expert, start_expert=start_expert, router_dim=router_dim,
    )
    handle = wiring.handle
    if correct:
        install_assembly_correction(handle, prompt)
    if not options.router and not options.ensemble:
        return handle

    def prompt_mask(experts: Tensor, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tensor:
        query = key_query(module, args, kwargs)
        keys = module.prompt_key
        similarity = F.normalize(query.to(keys.dtype), dim=-1) @ F.normalize(keys, dim=-1).t()
        outside = owner.unsqueeze(0) != experts.to(device).unsqueeze(1)
        similarity = similarity.masked_fill(outside, float("-inf"))
        return similarity.topk(int(module.top_k), dim=1, largest=True, sorted=True).indices

    def used_expert(output: Any) -> Optional[Tensor]:
        index = output.get("prompt_idx") if isinstance(output, dict) else None
        return None if index is None else owner[index[:, 0].to(device)]

    if options.router:
        if query_module is not None:
            handle.query_source = f"the forward of {type(query_module).__name__} (query_module)"
            wiring.hook_query_module(query_module, query_from_output or default_query)
        else:
            handle.query_source = f"the cls_features of the {type(prompt).__name__} calls"
        wiring.hook_route_module(
            prompt, route_kwarg="prompt_mask", route_value=prompt_mask,
            query_from_call=None if query_module is not None else router_query_of_call, banks_follow_routing=False,
            used_from_output=used_expert,
        )

    def observe(module: nn.Module, args: Any, kwargs: Any, output: Any) -> Optional[Tensor]:
        used = used_expert(output)
        if used is not None and handle.training and ties_training:
            handle.note_trained(used)
        index = output.get("prompt_idx") if isinstance(output, dict) else None
        return None if index is None else bank_of_slot[index[:, 0].to(device)]

    wiring.hook_banks(prompt, observe)
    if options.ensemble:
        wiring.swap_head(head_owner, head_name)
    return handle


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
        num_banks=num_banks, banks_of_expert=banks_of_expert, start_expert=start_expert, counter=counter,
        router_dim=router_dim,
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
        merged = merge_groups(parts, rows)
        for name, values in records.items():
            if len(values) == len(rows):
                setattr(pool, name, merge_groups(values, rows))
        if options.ensemble:
            wiring.banks_seen(bank_of_slot[merge_groups(slot_parts, rows)])
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
            wiring.batch.eval_query = None
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
