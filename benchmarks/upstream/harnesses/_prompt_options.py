"""The prompt-pool keyword arguments of the JH-LEE ``VisionTransformer`` lineage, as l2p-pytorch,
dualprompt-pytorch, mammoth and LAMDA-PILOT configure it for L2P and DualPrompt (length-5 prompts,
uniform init, a learnable key per slot matched against the 'cls' feature)."""

from __future__ import annotations

from typing import Any, Dict


def _keyed_pool(pool: int, top_k: int) -> Dict[str, Any]:
    return dict(prompt_length=5, embedding_key="cls", prompt_init="uniform", prompt_pool=True, prompt_key=True,
                pool_size=pool, top_k=top_k, prompt_key_init="uniform")


def l2p_prompt(pool: int, top_k: int, *, batchwise_prompt: bool) -> Dict[str, Any]:
    """L2P: prompts prepended to the tokens, the 'prompt' head, no prompt mask."""
    return dict(_keyed_pool(pool, top_k), batchwise_prompt=batchwise_prompt, head_type="prompt",
                use_prompt_mask=False)


def dualprompt_prompt(pool: int, top_k: int) -> Dict[str, Any]:
    """DualPrompt: prefix G-prompts on layers 0-1, prefix E-prompts on 2-4 (prompt mask: task t trains
    slot t), batch-wise selection, the 'token' head."""
    return dict(_keyed_pool(pool, top_k), batchwise_prompt=True, head_type="token", use_prompt_mask=True,
                use_g_prompt=True, g_prompt_length=5, g_prompt_layer_idx=[0, 1], use_prefix_tune_for_g_prompt=True,
                use_e_prompt=True, e_prompt_layer_idx=[2, 3, 4], use_prefix_tune_for_e_prompt=True,
                same_key_value=False)
