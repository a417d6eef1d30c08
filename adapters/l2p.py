"""L2P: our reference ``l2p``, the JH-LEE ``l2p-pytorch`` family (``model.prompt`` with ``prompt_key``,
``top_k``; ``model.head``) and the Si-Blurry-lineage ``L2P`` (``model.prompt`` with ``key``, ``prompts``;
routed where its forward takes ``s, e``: FlyGCL). L2P has no experts: the key pool is split into
``num_experts`` contiguous slices, and the router picks the slice inside which the method's own top-k
key match runs."""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError, check_int

from ._errors import missing_seam
from ._handle import Retrofit
from ._head import find_head
from ._jhlee import jhlee_prompt_module, slice_layout, wire_jhlee
from ._keypool import is_key_pool, wire_key_pool
from ._options import RetrofitOptions
from ._registry import register_family

__all__ = ["retrofit"]


@register_family("l2p")
def retrofit(
    model: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: Optional[int] = None,
    slots_per_expert: Optional[int] = None,
    query_module: Optional[nn.Module] = None,
    query_from_output: Optional[Callable[[Any], Tensor]] = None,
    start_expert: Optional[Callable[[int], None]] = None,
    router_dim: Optional[int] = None,
) -> Retrofit:
    """Retrofit an L2P model (reference ``l2p`` or JH-LEE ``l2p-pytorch``).

    Args:
        num_experts: key-pool slices (required for upstream models; the reference method's own otherwise).
        slots_per_expert: keys per slice (default ``pool // num_experts``, remainder to the last slice).
        query_module, query_from_output: read the router features from this module's output instead of
            the ``cls_features`` of the prompt call.
        start_expert: the method's own expert start (default: nothing).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """
    if num_experts is None:
        raise InvalidParameterError("fly_modules.adapters.l2p: pass num_experts (the number of key-pool slices)")
    num_experts = check_int(num_experts, "num_experts", owner="fly_modules.adapters.l2p", minimum=1)
    if is_key_pool(getattr(model, "prompt", None)):
        backbone = getattr(model, "backbone", None)
        if not isinstance(backbone, nn.Module):
            raise missing_seam("l2p", model, "backbone", "the ViT whose classifier is the online head")
        pool = model.prompt
        _, owner = slice_layout(int(pool.key.shape[0]), num_experts, slots_per_expert,
                                int(getattr(pool, "selection_size", 1)), "l2p", remainder_to_last=True)
        return wire_key_pool(
            model, pool, options, family="l2p", head=find_head(backbone, "l2p"), num_experts=num_experts, owner=owner,
            bank_of_slot=owner, num_banks=num_experts, banks_of_expert=lambda expert: [int(expert)], counter=None,
            ties_training=False, query_module=query_module, query_from_output=query_from_output,
            start_expert=start_expert, router_dim=router_dim,
        )
    prompt = jhlee_prompt_module(model, "l2p", "prompt", "the JH-LEE l2p-pytorch prompt pool `prompt.Prompt`")
    pool, top_k = prompt.prompt_key.shape[0], int(prompt.top_k)
    _, owner = slice_layout(pool, num_experts, slots_per_expert, top_k, "l2p", remainder_to_last=True)
    return wire_jhlee(
        model, "l2p", prompt, owner, options, num_experts=num_experts, num_banks=num_experts, bank_of_slot=owner,
        ties_training=False,
        banks_of_expert=lambda expert: [int(expert)], query_module=query_module, query_from_output=query_from_output,
        start_expert=start_expert, router_dim=router_dim,
    )

