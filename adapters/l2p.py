"""L2P: our reference ``l2p``, the JH-LEE ``l2p-pytorch`` family (``model.prompt`` with ``prompt_key``,
``top_k``; ``model.head``) and the Si-Blurry-lineage ``L2P`` (``model.prompt`` with ``key``, ``prompts``;
routed where its forward takes ``s, e``: FlyGCL). L2P has no experts: the key pool is split into
``num_experts`` contiguous slices, and the router picks the slice inside which the method's own top-k
key match runs."""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import Tensor, nn

from ._handle import Retrofit
from ._options import RetrofitOptions
from ._prompt_pools import is_key_pool, prompt_mask_pool, slice_layout, wire_key_pool, wire_prompt_mask_pool
from ._registry import register_family
from ._wiring import backbone_of, count_experts, find_head

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
    num_experts = count_experts(num_experts, None, "l2p", "key-pool slices")
    if is_key_pool(getattr(model, "prompt", None)):
        backbone = backbone_of(model, "l2p", "the ViT whose classifier is the online head")
        pool = model.prompt
        _, owner = slice_layout(int(pool.key.shape[0]), num_experts, slots_per_expert,
                                int(getattr(pool, "selection_size", 1)), "l2p", remainder_to_last=True)
        return wire_key_pool(
            model, pool, options, family="l2p", head=find_head(backbone, "l2p"), num_experts=num_experts, owner=owner,
            bank_of_slot=owner, num_banks=num_experts, banks_of_expert=lambda expert: [int(expert)], counter=None,
            ties_training=False, query_module=query_module, query_from_output=query_from_output,
            start_expert=start_expert, router_dim=router_dim,
        )
    prompt = prompt_mask_pool(model, "l2p", "prompt", "the JH-LEE l2p-pytorch prompt pool `prompt.Prompt`")
    pool, top_k = prompt.prompt_key.shape[0], int(prompt.top_k)
    _, owner = slice_layout(pool, num_experts, slots_per_expert, top_k, "l2p", remainder_to_last=True)
    return wire_prompt_mask_pool(
        model, "l2p", prompt, owner, options, num_experts=num_experts, num_banks=num_experts, bank_of_slot=owner,
        ties_training=False,
        banks_of_expert=lambda expert: [int(expert)], query_module=query_module, query_from_output=query_from_output,
        start_expert=start_expert, router_dim=router_dim,
    )

