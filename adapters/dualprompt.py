"""DualPrompt / MISA: our reference methods, JH-LEE ``dualprompt-pytorch``, and the Si-Blurry-lineage
``DualPrompt`` models (FlyGCL, MISA: routed through ``e_prompt.forward(query, s, e)``; Si-Blurry:
ensemble only, its ``Prompt.forward(query, **kwargs)`` has no slot range to route).

Each expert (step) owns ``slots_per_expert`` contiguous E-prompt slots; the router picks the step and
the method's own key match runs inside its slots. Ensemble banks are per slot.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import nn

from ._family import Plan
from ._prompt_pools import (
    KeyPool,
    PoolFamily,
    PromptMaskPool,
    Slots,
    prompt_mask_pool,
    routable,
    slice_layout,
)
from ._registry import register_family
from ._seams import SeamError, step_counter

__all__ = ["DualPrompt", "retrofit"]

_WHAT = (
    "the E-prompt pool: JH-LEE `EPrompt` (with `prompt_key`) or Si-Blurry/MISA/FlyGCL `Prompt` (with `key` "
    "and `prompts`)"
)


class DualPrompt(PoolFamily):
    """Retrofit a DualPrompt or MISA model: step ``t`` owns slots ``[t*S, (t+1)*S)``, one bank per slot.

    Args:
        num_experts: steps (required for JH-LEE; Si-Blurry lineage default ``model.task_num``).
        slots_per_expert: slots per step (JH-LEE: ``top_k`` with ``use_prompt_mask``, else
            ``pool // num_experts``; Si-Blurry lineage: ``model.num_pt_per_task``).
        query_module, query_from_output: read the router features from this module's output instead of
            the prompt call's query.
        start_expert: the method's own expert start; default: moving the model's step counter
            (FlyGCL ``process_task_count()`` up to the expert, MISA ``task_id``).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """

    names = ("dualprompt", "misa")

    def pool_plan(self, num_experts: Optional[int], slots_per_expert: Optional[int], query: Dict[str, Any]) -> Plan:
        prompt = getattr(self.model, "e_prompt", None)
        if not isinstance(prompt, nn.Module):
            raise self.missing_seam("e_prompt", _WHAT)
        if PromptMaskPool.matches(prompt):
            return self.jh_lee_layout(num_experts, slots_per_expert, query)
        if hasattr(prompt, "key") and hasattr(prompt, "prompts"):
            if not KeyPool.matches(prompt):
                raise self.missing_seam("e_prompt.key", "a (pool, D) tensor of keys")
            return self.key_pool_layout(prompt, num_experts, slots_per_expert, query)
        raise self.missing_seam("e_prompt.prompt_key` or `e_prompt.key", _WHAT)

    def jh_lee_layout(self, num_experts: Optional[int], slots_per_expert: Optional[int], query: Dict[str, Any]) -> Plan:
        """JH-LEE ``dualprompt-pytorch``: routed by ``prompt_mask``; with ``use_prompt_mask`` the loop trains
        step ``t`` on its own ``top_k`` slots."""
        prompt = prompt_mask_pool(self.model, "e_prompt", _WHAT, family=self.family)
        num_experts = self.count_experts(num_experts, None, "steps")
        pool, top_k = prompt.prompt_key.shape[0], int(prompt.top_k)
        tied = bool(getattr(self.model, "use_prompt_mask", False))
        if slots_per_expert is None and tied:
            slots_per_expert = top_k
        size, expert_of_slot = slice_layout(pool, num_experts, slots_per_expert, top_k, family=self.family,
                                            remainder_to_last=False)
        layout = PromptMaskPool(self, prompt, Slots(expert_of_slot, torch.arange(pool), tied, **query))
        return Plan(head=self.find_head(), num_experts=num_experts, layout=layout, num_banks=pool,
                    banks_of_expert=lambda expert: list(range(expert * size, (expert + 1) * size)))

    def key_pool_layout(self, pool: nn.Module, num_experts: Optional[int], slots_per_expert: Optional[int],
                        query: Dict[str, Any]) -> Plan:
        """The Si-Blurry lineage: ``S = model.num_pt_per_task``; the steps tie training where the pool's
        forward takes the slot range (Si-Blurry's pool-wide selection never reads its ``task_id``)."""
        backbone = self.backbone_of("the ViT whose classifier is the online head")
        num_experts = self.count_experts(num_experts, getattr(self.model, "task_num", None), "steps")
        slots = int(pool.key.shape[0])
        size = slots_per_expert if slots_per_expert is not None else getattr(self.model, "num_pt_per_task", None)
        size, expert_of_slot = slice_layout(slots, num_experts, size, 1, family=self.family, remainder_to_last=False)
        if self.options.ensemble and getattr(pool, "learnable_mask", False):
            raise SeamError(
                f"{self.caller}: e_prompt.learnable_mask multiplies the logits after the classifier, "
                "which the head ensemble cannot see; use ensemble=False or the generic adapter with your own transform"
            )
        steps = routable(pool)
        layout = KeyPool(self, pool, Slots(expert_of_slot, torch.arange(slots), steps, **query))
        return Plan(head=self.find_head(backbone), num_experts=num_experts, layout=layout, num_banks=slots,
                    banks_of_expert=lambda expert: list(range(expert * size, (expert + 1) * size)),
                    counter=step_counter(self.model) if steps else None)


retrofit = register_family(DualPrompt)
