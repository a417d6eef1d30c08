"""Prompting by concatenation on a frozen timm ViT, the machinery L2P, DualPrompt, MISA, MVP and
FlyPrompt share: prompt tokens appended before a block and cut off after it, layer positions fitted
to the backbone's depth, and ``ConcatPromptMethod``, their common base (docs/methods.md).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import check_int

from ..parallel import BatchShare
from .base import PromptMethod, QueryFeatures, frozen_cls

__all__ = [
    "ConcatPromptMethod",
    "ExpertPromptMethod",
    "check_vit",
    "vit_dims",
    "resolve_layers",
    "embed_tokens",
    "cls_position",
    "run_blocks",
    "prompts_by_layer",
    "cosine_distance",
    "count_selections",
    "new_head",
    "load_prompt_tensor",
]

PromptSource = Union[str, "os.PathLike[str]", Tensor]

_REQUIRED_VIT_ATTRS = ("patch_embed", "_pos_embed", "blocks", "norm", "cls_token")


# -------------------------------------------------------------------------------- backbone
def check_vit(backbone: nn.Module, method: str) -> None:
    """Raise ``TypeError`` unless ``backbone`` looks like a timm ``VisionTransformer`` with a class token."""
    missing = [name for name in _REQUIRED_VIT_ATTRS if not hasattr(backbone, name)]
    if missing:
        raise TypeError(
            f"{method} needs a timm VisionTransformer-like backbone (attributes {', '.join(_REQUIRED_VIT_ATTRS)}); "
            f"{type(backbone).__name__} lacks {', '.join(missing)}"
        )
    if backbone.cls_token is None:
        raise TypeError(
            f"{method} reads the class token, but the backbone {type(backbone).__name__} was built without one "
            "(class_token=False); create it with class_token=True"
        )


def vit_dims(backbone: nn.Module) -> Tuple[int, int]:
    """``(embed_dim, depth)`` of a timm ViT; the embed dim is cross-checked against its classifier."""
    embed_dim = getattr(backbone, "num_features", None) or getattr(backbone, "embed_dim", None)
    if embed_dim is None:
        embed_dim = backbone.cls_token.shape[-1]
    embed_dim = int(embed_dim)
    # The backbone's own classifier is never used (each method has a fresh head), but its input size
    # must agree: timm names it `head`, the ViT vendored by FlyGCL/MISA `fc`; get_classifier() knows.
    get_classifier = getattr(backbone, "get_classifier", None)
    classifier = get_classifier() if callable(get_classifier) else None
    if isinstance(classifier, nn.Linear) and classifier.in_features != embed_dim:
        raise ValueError(
            f"backbone classifier {type(classifier).__name__} takes {classifier.in_features} features but the "
            f"backbone's num_features is {embed_dim}; cannot size the prompt head"
        )
    return embed_dim, len(backbone.blocks)


def resolve_layers(
    layers: Optional[Iterable[int]], depth: int, *, default: Sequence[int], what: str
) -> Tuple[int, ...]:
    """Validated, sorted prompt-layer positions for a backbone of ``depth`` blocks.

    ``layers=None`` uses ``default`` (the ViT-B/16 positions) clamped to ``depth``: positions past the
    last block are dropped. Explicit positions must all exist. An empty result is an error.
    """
    if layers is None:
        resolved = tuple(sorted({int(p) for p in default if int(p) < depth}))
        if not resolved:
            raise ValueError(
                f"{what}: the default positions {tuple(default)} do not fit a backbone of depth {depth}; "
                f"pass explicit positions in [0, {depth})"
            )
        return resolved
    resolved = tuple(sorted({int(p) for p in layers}))
    if not resolved:
        raise ValueError(f"{what}: at least one prompt layer is needed, got {tuple(layers)}")
    bad = [p for p in resolved if not 0 <= p < depth]
    if bad:
        raise ValueError(
            f"{what}: layer positions {bad} are outside the backbone's {depth} blocks (valid: 0..{depth - 1})"
        )
    return resolved


def embed_tokens(backbone: nn.Module, x: Tensor) -> Tensor:
    """Prompt-free token sequence ``(B, N, D)`` entering the first block (class token at index 0)."""
    tokens = backbone.patch_embed(x)
    tokens = backbone._pos_embed(tokens)
    tokens = backbone.patch_drop(tokens) if hasattr(backbone, "patch_drop") else tokens
    return backbone.norm_pre(tokens) if hasattr(backbone, "norm_pre") else tokens


def cls_position(backbone: nn.Module) -> Tensor:
    """``(D,)`` positional embedding of the class token (zeros when the class token has none).

    The reference adds it to every prompt token (FlyPrompt, DualPrompt, MISA, L2P; not MVP).
    """
    pos_embed = getattr(backbone, "pos_embed", None)
    if pos_embed is None or getattr(backbone, "no_embed_class", False):
        return backbone.cls_token.new_zeros(backbone.cls_token.shape[-1])
    return pos_embed[0, 0]


def run_blocks(backbone: nn.Module, tokens: Tensor, prompts: Mapping[int, Sequence[Tensor]]) -> Tensor:
    """Run all blocks, appending ``prompts[n]`` (each ``(B, L, D)``, in order) before block ``n``.

    After every block the sequence is truncated back to its prompt-free length, so the returned
    ``(B, N, D)`` tokens (before the final norm) hold no prompt outputs.
    """
    length = tokens.shape[1]
    for n, block in enumerate(backbone.blocks):
        extra = prompts.get(n)
        if extra:
            tokens = block(torch.cat((tokens, *extra), dim=1))[:, :length]
        else:
            tokens = block(tokens)
    return tokens


def prompts_by_layer(*groups: Tuple[Sequence[int], Tensor]) -> Dict[int, List[Tensor]]:
    """``run_blocks``'s ``prompts`` from ``(layers, tokens)`` groups, ``tokens`` of shape ``(B, len(layers), L, D)``.

    A block that several groups prompt (DualPrompt's and MVP's G- and E-prompts) gets their prompts in
    the order of the groups.
    """
    prompts: Dict[int, List[Tensor]] = {}
    for layers, tokens in groups:
        for i, layer in enumerate(layers):
            prompts.setdefault(layer, []).append(tokens[:, i])
    return prompts


def cosine_distance(query: Tensor, keys: Tensor) -> Tensor:
    """``1 - cos(query_b, key_p)``: ``(B, D) x (P, D) -> (B, P)`` (or ``(P, P)`` for keys vs keys)."""
    return 1.0 - F.normalize(query, dim=-1) @ F.normalize(keys, dim=-1).transpose(-1, -2)


@torch.no_grad()
def count_selections(counter: Tensor, selection: Tensor, parallel: BatchShare) -> None:
    """Add to ``counter`` (one entry per prompt) how often each prompt of ``selection`` was chosen in the
    global batch (L2P's diversification frequency, MVP's count-scaled matching)."""
    counter += parallel.sum(torch.bincount(selection.reshape(-1), minlength=counter.numel()))


def new_head(embed_dim: int, num_classes: int, *, like: Optional[Tensor] = None) -> nn.Linear:
    """Fresh classifier ``Linear(embed_dim, num_classes)``: weights trunc-normal(std 0.02), bias 0."""
    factory: Dict[str, Any] = {} if like is None else {"device": like.device, "dtype": like.dtype}
    head = nn.Linear(embed_dim, num_classes, **factory)
    nn.init.trunc_normal_(head.weight, std=0.02)
    nn.init.zeros_(head.bias)
    return head


def load_prompt_tensor(source: PromptSource, what: str) -> Tensor:
    """A prompt tensor from a tensor, a ``.safetensors`` file or a ``torch.save`` file (weights only).

    A file may hold a bare tensor or a mapping with exactly one tensor.
    """
    if isinstance(source, Tensor):
        return source.detach()
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what}: prompt file {path!r} does not exist")
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError as err:  # pragma: no cover - safetensors ships with timm
            raise ImportError(
                f"{what}: reading {path!r} needs the safetensors package (pip install safetensors)"
            ) from err
        obj: Any = load_file(path, device="cpu")
    else:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, Mapping):
        tensors = [v for v in obj.values() if isinstance(v, Tensor)]
        if len(tensors) != 1 or len(obj) != 1:
            raise ValueError(
                f"{what}: {path!r} holds {len(obj)} entries {sorted(obj)}; expected a single prompt tensor"
            )
        obj = tensors[0]
    if not isinstance(obj, Tensor):
        raise TypeError(f"{what}: {path!r} holds a {type(obj).__name__}, expected a tensor")
    return obj.detach()


# ---------------------------------------------------------------------------------- base class
class ConcatPromptMethod(PromptMethod):
    """Common base of the concatenation-prompt methods.

    Args:
        backbone: a timm ``VisionTransformer`` (any size, with a class token). Frozen here
            (``requires_grad`` off, eval mode); it is not otherwise modified (its own classifier, whether
            called ``head`` or ``fc``, stays unused).
        num_classes: outputs of the fresh head.
        num_experts: router targets / ensemble banks of the method.

    Attributes:
        head: the trainable ``nn.Linear(embed_dim, num_classes)`` (trunc-normal 0.02, bias 0).
        embed_dim, depth: read from the backbone.
        expert_started: ``(num_experts,)`` bool buffer, ``True`` for experts that ``on_expert_start``
            has started (expert 0 from construction).
    """

    def __init__(self, backbone: nn.Module, num_classes: int, *, num_experts: int) -> None:
        super().__init__()
        check_vit(backbone, type(self).__name__)
        num_classes = check_int(num_classes, "num_classes", caller=type(self).__name__, minimum=1)
        num_experts = check_int(num_experts, "num_experts", caller=type(self).__name__, minimum=1)
        backbone.requires_grad_(False)
        backbone.eval()
        self.backbone = backbone
        self.embed_dim, self.depth = vit_dims(backbone)
        self.num_classes = int(num_classes)
        self.num_experts = int(num_experts)
        self.current_expert = 0
        self.head = new_head(self.embed_dim, self.num_classes, like=backbone.cls_token)
        started = torch.zeros(self.num_experts, dtype=torch.bool, device=backbone.cls_token.device)
        started[0] = True
        self.register_buffer("expert_started", started)

    # ----------------------------------------------------------------------------- helpers
    def _factory(self) -> Dict[str, Any]:
        return {"device": self.backbone.cls_token.device, "dtype": self.backbone.cls_token.dtype}

    def _check_expert_ids(self, expert: Tensor, batch: int) -> Tensor:
        if expert.dtype not in (torch.int64, torch.int32) or expert.shape != (batch,):
            raise ValueError(
                f"{type(self).__name__}: expert must be an integer tensor of shape ({batch},), "
                f"got {expert.dtype} {tuple(expert.shape)}"
            )
        if expert.numel() and (int(expert.min()) < 0 or int(expert.max()) >= self.num_experts):
            raise ValueError(
                f"{type(self).__name__}: expert ids must lie in [0, {self.num_experts}), "
                f"got min {int(expert.min())} max {int(expert.max())}"
            )
        return expert.long()

    def _prompted_cls(self, x: Tensor, prompts: Mapping[int, Sequence[Tensor]]) -> Tensor:
        """Final-norm class token of a pass with ``prompts[n]`` appended before block ``n``."""
        tokens = run_blocks(self.backbone, embed_tokens(self.backbone, x), prompts)
        return self.backbone.norm(tokens)[:, 0]

    # ------------------------------------------------------------------------------- seams
    def frozen_features(self, x: Tensor) -> Tensor:
        """Frozen prompt-free final-norm class token."""
        return frozen_cls(self.backbone, x)

    def query_from_frozen(self, frozen: Tensor) -> QueryFeatures:
        """The class token is both the query and the router features."""
        return QueryFeatures(query=frozen, router=frozen)

    def on_expert_start(self, expert: int) -> None:
        expert = int(expert)
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"{type(self).__name__}: expert {expert} is outside [0, {self.num_experts})")
        super().on_expert_start(expert)
        self.expert_started[expert] = True

    # ------------------------------------------------------------------------- extra state
    def get_extra_state(self) -> Dict[str, Any]:
        return {"current_expert": int(self.current_expert)}

    def set_extra_state(self, state: Dict[str, Any]) -> None:
        self.current_expert = int(state["current_expert"])


class ExpertPromptMethod(ConcatPromptMethod):
    """A concatenation-prompt method with one prompt per expert in each prompt layer (FlyPrompt, S-Prompt++):
    ``self.prompts`` of shape ``(len(prompt_layers), num_experts, length, D)`` at ``self.prompt_layers``; the
    current expert in training, the method's :meth:`route` of the query at inference."""

    def route(self, query: Tensor) -> Tensor:
        """``(B,)`` experts chosen for the query at inference (the method's own router)."""
        raise NotImplementedError

    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """``(B,)`` experts: ``expert`` when given, the current expert in training, else :meth:`route`'s."""
        if expert is not None:
            return self._check_expert_ids(expert, query.shape[0])
        if train:
            return torch.full((query.shape[0],), self.current_expert, dtype=torch.long, device=query.device)
        return self.route(query)

    def expert_of(self, selection: Tensor) -> Tensor:
        return selection

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        prompts = self.prompts[:, selection] + cls_position(self.backbone)  # (layers, B, L, D)
        layer_prompts: Dict[int, List[Tensor]] = {layer: [prompts[i]] for i, layer in enumerate(self.prompt_layers)}
        return self._prompted_cls(x, layer_prompts)
