"""The JH-LEE prompt pool (``l2p-pytorch``, ``dualprompt-pytorch``, copied by HiDe-Prompt and PILOT):
recognising it, and routing it by ``prompt_mask`` inside the routed expert's slots."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError

from ._assembly import check_assembly, install_assembly_correction
from ._errors import GENERIC_CALL, SeamError, missing_seam
from ._handle import Retrofit
from ._head import find_head
from ._options import RetrofitOptions
from ._signatures import require_keyword
from ._wiring import Wiring, default_query

__all__ = ["jhlee_prompt_module", "slice_layout", "wire_jhlee"]


def jhlee_prompt_module(model: nn.Module, family: str, attribute: str, what: str) -> nn.Module:
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


def jhlee_key_query(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tensor:
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


def jhlee_router_query(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tensor:
    """Router features from a JH-LEE prompt call: ``cls_features`` when given, else the key query."""
    cls_features = _call_argument(args, kwargs, 2, "cls_features")
    return cls_features if cls_features is not None else jhlee_key_query(module, args, kwargs)


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


def wire_jhlee(
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
        num_banks=num_banks, banks_of_expert=banks_of_expert, start_method_expert=start_expert, router_dim=router_dim,
    )
    handle = wiring.handle
    if correct:
        install_assembly_correction(handle, prompt)
    if not options.router and not options.ensemble:
        return handle

    def prompt_mask(experts: Tensor, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tensor:
        query = jhlee_key_query(module, args, kwargs)
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
            query_from_call=None if query_module is not None else jhlee_router_query, banks_follow_routing=False,
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
