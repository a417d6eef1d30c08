"""Reference implementations of the prompt, LoRA and adapter methods, the linear probe and RanPAC† on a frozen
timm ViT, and sequential fine-tuning of one (registered by name)."""

from . import (  # noqa: F401  (registration side effects)
    coda_prompt,
    dualprompt,
    flyprompt,
    hide,
    hide_experts,
    l2p,
    linear_probe,
    mvp,
    ranpac,
    ranpac_variants,
    sdlora,
    seq_ft,
    sprompt,
)
from .base import MethodOutput, PromptMethod, QueryFeatures, create_method, list_methods, method_class, register_method

__all__ = [
    "MethodOutput", "PromptMethod", "QueryFeatures", "create_method", "list_methods", "method_class", "register_method",
]
