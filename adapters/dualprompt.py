"""DualPrompt / MISA: our reference methods, JH-LEE ``dualprompt-pytorch``, and the Si-Blurry-lineage
``DualPrompt`` models (FlyGCL, MISA: routed through ``e_prompt.forward(query, s, e)``; Si-Blurry:
ensemble only, its ``Prompt.forward(query, **kwargs)`` has no slot range to route).

Each expert (step) owns ``slots_per_expert`` contiguous E-prompt slots; the router picks the step and
the method's own key match runs inside its slots. Ensemble banks are per slot.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from ._handle import Retrofit
from ._options import RetrofitOptions
from ._prompt_pools import is_key_pool, prompt_mask_pool, routable, slice_layout, wire_key_pool, wire_prompt_mask_pool
from ._registry import register_family
from ._wiring import SeamError, backbone_of, count_experts, find_head, missing_seam, step_counter

__all__ = ["retrofit"]

_WHAT = (
    "the E-prompt pool: JH-LEE `EPrompt` (with `prompt_key`) or Si-Blurry/MISA/FlyGCL `Prompt` (with `key` "
    "and `prompts`)"
)


def _wire_key_pool(
    model: nn.Module,
    pool: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: Optional[int],
    slots_per_expert: Optional[int],
    **family_options: Any,
) -> Retrofit:
    """The Si-Blurry lineage: step ``t`` owns slots ``[t*S, (t+1)*S)``, ``S = model.num_pt_per_task``."""
    owner_name = "fly_modules.adapters.dualprompt"
    backbone = backbone_of(model, "dualprompt", "the ViT whose classifier is the online head")
    num_experts = count_experts(num_experts, getattr(model, "task_num", None), "dualprompt", "steps")
    slots = int(pool.key.shape[0])
    size = slots_per_expert if slots_per_expert is not None else getattr(model, "num_pt_per_task", None)
    size, owner = slice_layout(slots, num_experts, size, 1, "dualprompt", remainder_to_last=False)
    if options.ensemble and getattr(pool, "learnable_mask", False):
        raise SeamError(
            f"{owner_name}: e_prompt.learnable_mask multiplies the logits after the classifier, which the head "
            "ensemble cannot see; use ensemble=False or the generic adapter with your own transform"
        )
    steps = routable(pool)  # Si-Blurry's pool-wide selection never reads its `task_id`
    return wire_key_pool(
        model, pool, options, family="dualprompt", head=find_head(backbone, "dualprompt"), num_experts=num_experts,
        owner=owner, bank_of_slot=torch.arange(slots), num_banks=slots,
        banks_of_expert=lambda expert: list(range(expert * size, (expert + 1) * size)),
        counter=step_counter(model) if steps else None, ties_training=steps, **family_options,
    )


@register_family("dualprompt", "misa")
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
    """Retrofit a DualPrompt or MISA model.

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
    prompt = getattr(model, "e_prompt", None)
    if not isinstance(prompt, nn.Module):
        raise missing_seam("dualprompt", model, "e_prompt", _WHAT)
    family_options = dict(query_module=query_module, query_from_output=query_from_output, start_expert=start_expert,
                          router_dim=router_dim)
    if hasattr(prompt, "prompt_key"):
        prompt = prompt_mask_pool(model, "dualprompt", "e_prompt", _WHAT)
        num_experts = count_experts(num_experts, None, "dualprompt", "steps")
        pool, top_k = prompt.prompt_key.shape[0], int(prompt.top_k)
        if slots_per_expert is None and getattr(model, "use_prompt_mask", False):
            slots_per_expert = top_k
        size, owner = slice_layout(pool, num_experts, slots_per_expert, top_k, "dualprompt", remainder_to_last=False)
        return wire_prompt_mask_pool(
            model, "dualprompt", prompt, owner, options, num_experts=num_experts, num_banks=pool,
            ties_training=bool(getattr(model, "use_prompt_mask", False)),
            bank_of_slot=torch.arange(pool), banks_of_expert=lambda expert: list(range(expert * size, (expert + 1) * size)),
            **family_options,
        )
    if hasattr(prompt, "key") and hasattr(prompt, "prompts"):
        if not is_key_pool(prompt):
            raise missing_seam("dualprompt", model, "e_prompt.key", "a (pool, D) tensor of keys")
        return _wire_key_pool(model, prompt, options, num_experts=num_experts, slots_per_expert=slots_per_expert,
                              **family_options)
    raise missing_seam("dualprompt", model, "e_prompt.prompt_key` or `e_prompt.key", _WHAT)
