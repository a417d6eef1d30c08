"""CODA-Prompt's map of tensors: the official model keeps one prompt, key and attention tensor per prompt
layer (``e_p_<layer>``, ``e_k_<layer>``, ``e_a_<layer>``), ours one of each with a leading layer axis."""

from __future__ import annotations

from typing import Dict, Sequence

__all__ = ["SESSION_END_SEED", "weights"]

#: both sides reseed the global generator with this plus the session right before their session-end hook,
#: where the next task's components are drawn
SESSION_END_SEED = 3000


def weights(layers: Sequence[int]) -> Dict[str, str]:
    """``e_{p,k,a}_<layer>`` -> ``{prompts,keys,attention}[i]`` for the ``i``-th prompt layer, and the head."""
    names = {"p": "prompts", "k": "keys", "a": "attention"}
    mapped = {f"e_{kind}_{layer}": f"{ours}[{i}]" for i, layer in enumerate(layers) for kind, ours in names.items()}
    return {**mapped, "backbone.fc.weight": "head.weight", "backbone.fc.bias": "head.bias"}
