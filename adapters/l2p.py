"""L2P: our reference ``l2p``, the JH-LEE ``l2p-pytorch`` family (``model.prompt`` with ``prompt_key``,
``top_k``; ``model.head``) and the Si-Blurry-lineage ``L2P`` (``model.prompt`` with ``key``, ``prompts``;
routed where its forward takes ``s, e``: FlyGCL). L2P has no experts: the key pool is split into
``num_experts`` contiguous slices, and the router picks the slice inside which the method's own top-k
key match runs."""

from __future__ import annotations

from typing import Any, Dict, Optional

from ._family import Plan
from ._prompt_pools import KeyPool, PoolFamily, PromptMaskPool, Slots, prompt_mask_pool, slice_layout
from ._registry import register_family

__all__ = ["L2P", "retrofit"]


class L2P(PoolFamily):
    """Retrofit an L2P model (reference ``l2p`` or JH-LEE ``l2p-pytorch``): one bank per key-pool slice.

    Args:
        num_experts: key-pool slices (required for upstream models; the reference method's own otherwise).
        slots_per_expert: keys per slice (default ``pool // num_experts``, remainder to the last slice).
        query_module, query_from_output: read the router features from this module's output instead of
            the ``cls_features`` of the prompt call.
        start_expert: the method's own expert start (default: nothing).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """

    names = ("l2p",)

    def pool_plan(self, num_experts: Optional[int], slots_per_expert: Optional[int], query: Dict[str, Any]) -> Plan:
        """The JH-LEE pool routed by ``prompt_mask``, the Si-Blurry-lineage pool by its slot range."""
        prompt = getattr(self.model, "prompt", None)  # its seams first: a model without one is not an L2P model
        if KeyPool.matches(prompt):
            head = self.find_head(self.backbone_of("the ViT whose classifier is the online head"))
            pool_size, top_k = int(prompt.key.shape[0]), int(getattr(prompt, "selection_size", 1))
        else:
            prompt = prompt_mask_pool(self.model, "prompt", "the JH-LEE l2p-pytorch prompt pool `prompt.Prompt`",
                                      family=self.family)
            head = self.find_head()
            pool_size, top_k = int(prompt.prompt_key.shape[0]), int(prompt.top_k)
        num_experts = self.count_experts(num_experts, None, "key-pool slices")
        _, expert_of_slot = slice_layout(pool_size, num_experts, slots_per_expert, top_k, family=self.family,
                                         remainder_to_last=True)
        slots = Slots(expert_of_slot, expert_of_slot, ties_training=False, **query)
        layout = KeyPool(self, prompt, slots) if KeyPool.matches(prompt) else PromptMaskPool(self, prompt, slots)
        return Plan(head=head, num_experts=num_experts, layout=layout)


retrofit = register_family(L2P)
