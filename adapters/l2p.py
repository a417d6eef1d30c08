"""L2P retrofit: our reference ``l2p`` and the JH-LEE ``l2p-pytorch`` family.

A model that implements the fly-modules seam contract (``benchmarks.methods``) goes to
:func:`fly_modules.adapters.reference.retrofit`. Otherwise the adapter recognises the JH-LEE layout
(also copied by Avalanche, PILOT and Mammoth): ``model.prompt`` is the prompt pool with keys
``prompt.prompt_key`` ``(P, D)`` and ``prompt.top_k``, called as
``model.prompt(x_embed, prompt_mask=..., cls_features=...)`` and returning a dict with ``prompt_idx``;
the classifier is ``model.head``; the query is ``cls_features``, the ``pre_logits`` of a separate frozen
``original_model`` that the training loop passes in.

L2P has no experts, so the retrofit defines them (as the reference ``l2p`` does): the key pool is split
into ``num_experts`` contiguous slices of ``slots_per_expert`` keys (default ``P // num_experts``; the
remainder joins the last slice), and each slice is an expert.

* ``router=True``: at inference the router picks a slice per sample, and the method's own key match
  (cosine similarity of the query and the keys, the ``top_k`` best) runs inside that slice only; the
  result is injected as ``prompt_mask`` ``(B, top_k)``, which the JH-LEE ``Prompt`` uses as the
  selected indices. The router is fed the ``cls_features`` of the training calls (the query the method
  matches; with another ``embedding_key`` and no ``cls_features`` the key-match query itself), or the
  output of ``query_module`` when given. Training-time selection is untouched.
* ``ensemble=True``: one bank per slice; the bank of a sample is the slice of its best (first) selected
  key (``prompt_idx[:, 0]``), in training (the banks moved after each optimizer step) and at inference
  (the banks ensembled). ``model.head`` becomes a :class:`~fly_modules.adapters.generic.EnsembleLinear`:
  online logits in training, the ensemble's log-probabilities at inference (``handle.set_logit_mask``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._core import Retrofit, Schedule, SeamError, missing_seam, undo_on_failure
from .generic import default_query, find_head, make_wiring, reference_or_none

__all__ = ["retrofit"]


# ------------------------------------------------------------------------- JH-LEE helpers
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
            f"{type(module.prompt_key).__name__}; use fly_modules.adapters.generic.retrofit for other layouts"
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
        raise ValueError(
            f"fly_modules.adapters.{family}: {num_experts} experts of {size} slots do not fit a pool of {pool}"
        )
    if size < top_k:
        raise ValueError(
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
    *,
    num_experts: int,
    num_banks: int,
    bank_of_slot: Tensor,
    banks_of_expert: Callable[[int], Sequence[int]],
    query_module: Optional[nn.Module],
    query_from_output: Optional[Callable[[Any], Tensor]],
    start_expert: Optional[Callable[[int], None]],
    router: bool,
    ensemble: bool,
    **common: Any,
) -> Retrofit:
    """The JH-LEE wiring shared by L2P and DualPrompt: route by ``prompt_mask`` inside the routed
    expert's slots, bank = ``bank_of_slot[prompt_idx[:, 0]]``, ensemble on ``model.head``."""
    head_owner, head_name = find_head(model, family)
    device = prompt.prompt_key.device
    owner = owner.to(device)
    bank_of_slot = bank_of_slot.to(device)
    wiring = make_wiring(
        model, family, classifier=getattr(head_owner, head_name), num_experts=num_experts, num_banks=num_banks,
        banks_of_expert=banks_of_expert, start_method_expert=start_expert, router=router, ensemble=ensemble,
        current_expert=0, **common,
    )
    if not router and not ensemble:
        return wiring.handle

    def prompt_mask(experts: Tensor, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tensor:
        query = jhlee_key_query(module, args, kwargs)
        keys = module.prompt_key
        similarity = F.normalize(query.to(keys.dtype), dim=-1) @ F.normalize(keys, dim=-1).t()
        outside = owner.unsqueeze(0) != experts.to(device).unsqueeze(1)
        similarity = similarity.masked_fill(outside, float("-inf"))
        return similarity.topk(int(module.top_k), dim=1, largest=True, sorted=True).indices

    if router:
        if query_module is not None:
            wiring.hook_query_module(query_module, query_from_output or default_query)
        wiring.hook_route_module(
            prompt, route_kwarg="prompt_mask", route_value=prompt_mask,
            query_from_call=None if query_module is not None else jhlee_router_query, banks_follow_routing=False,
        )
    if ensemble:
        def banks(module: nn.Module, args: Any, kwargs: Any, output: Any) -> Optional[Tensor]:
            index = output.get("prompt_idx") if isinstance(output, dict) else None
            return None if index is None else bank_of_slot[index[:, 0].to(device)]

        wiring.hook_banks(prompt, banks)
        wiring.swap_head(head_owner, head_name)
    return wiring.handle


# ------------------------------------------------------------------------------------ public
@undo_on_failure
def retrofit(
    model: nn.Module,
    *,
    num_experts: Optional[int] = None,
    router: bool = True,
    ensemble: bool = True,
    optimizer: Optional[torch.optim.Optimizer] = None,
    schedule: Schedule = None,
    slots_per_expert: Optional[int] = None,
    query_module: Optional[nn.Module] = None,
    query_from_output: Optional[Callable[[Any], Tensor]] = None,
    start_expert: Optional[Callable[[int], None]] = None,
    router_dim: Optional[int] = None,
    expansion_dim: int = 10_000,
    ridge: Any = 1e4,
    seed: int = 0,
    decays: Sequence[float] = (0.9, 0.99),
    aggregate: str = "softmax_max",
) -> Retrofit:
    """Retrofit an L2P model (reference ``l2p`` or JH-LEE ``l2p-pytorch``); see the module docstring.

    Args:
        model: the L2P model.
        num_experts: key-pool slices (required for upstream models; the reference method's own otherwise).
        slots_per_expert: keys per slice (default ``pool // num_experts``, remainder to the last slice).
        query_module, query_from_output: read the router features from this module's output instead of
            the ``cls_features`` of the prompt call (see :func:`fly_modules.adapters.generic.retrofit`).
        start_expert: the method's own expert start (default: nothing; JH-LEE loops pass ``task_id``).
        The other arguments are those of :func:`fly_modules.adapters.generic.retrofit`.
    """
    common: Dict[str, Any] = dict(
        optimizer=optimizer, schedule=schedule, expansion_dim=expansion_dim, ridge=ridge, seed=seed,
        decays=decays, aggregate=aggregate,
    )
    upstream_only = dict(slots_per_expert=slots_per_expert, query_module=query_module,
                         query_from_output=query_from_output, start_expert=start_expert, router_dim=router_dim)
    handle = reference_or_none(model, "l2p", num_experts, upstream_only, router=router, ensemble=ensemble, **common)
    if handle is not None:
        return handle
    prompt = jhlee_prompt_module(model, "l2p", "prompt", "the JH-LEE l2p-pytorch prompt pool `prompt.Prompt`")
    if num_experts is None:
        raise TypeError("fly_modules.adapters.l2p: pass num_experts (the number of key-pool slices)")
    pool, top_k = prompt.prompt_key.shape[0], int(prompt.top_k)
    _, owner = slice_layout(pool, int(num_experts), slots_per_expert, top_k, "l2p", remainder_to_last=True)
    return wire_jhlee(
        model, "l2p", prompt, owner, num_experts=int(num_experts), num_banks=int(num_experts), bank_of_slot=owner,
        banks_of_expert=lambda expert: [int(expert)], query_module=query_module, query_from_output=query_from_output,
        start_expert=start_expert, router=router, ensemble=ensemble, router_dim=router_dim, **common,
    )
