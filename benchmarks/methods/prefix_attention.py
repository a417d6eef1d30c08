"""Prefix attention on a frozen timm ViT: per-sample prefix keys and values prepended to a block's
attention (HiDe-Prompt), optionally with NoRGa's gate on the prefix scores; and the block forward of
experts that add to the attention's fused ``qkv`` (LoRA) or beside the MLP (adapters). Reads the
block's weights, never modifies timm's classes."""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import check_int

__all__ = [
    "prefix_attention", "prefixed_block", "expert_block", "check_prefixable_backbone", "resolve_prefix_layers",
]


def _head_dims(attn: nn.Module) -> Tuple[int, int]:
    num_heads = int(attn.num_heads)
    head_dim = getattr(attn, "head_dim", None)
    if head_dim is None:  # older timm: derived from the fused projection
        head_dim = attn.qkv.out_features // (3 * num_heads)
    return num_heads, int(head_dim)


def prefix_attention(
    attn: nn.Module,
    x: Tensor,
    prefix_key: Optional[Tensor] = None,
    prefix_value: Optional[Tensor] = None,
    *,
    gate: Optional[Tensor] = None,
    qkv_delta: Optional[Tensor] = None,
) -> Tensor:
    """Forward of a timm ``Attention`` with per-sample prefix keys and values prepended.

    Args:
        attn: the block's timm ``Attention`` (fused ``qkv``; ``q_norm``, ``k_norm``, ``norm``, ``gate``
            are used when present). Only read, never modified.
        x: pre-normed tokens ``(B, N, D)`` (the block's ``norm1`` output).
        prefix_key, prefix_value: ``(B, H, P, head_dim)``; they skip ``qkv`` and ``k_norm``. ``None`` or
            ``P = 0`` gives timm's attention.
        gate: NoRGa's ``(a, b)`` (a tensor of 2 elements): the scaled prefix scores ``s`` become
            ``s + sigmoid(a * s) * b``; ``None`` for plain prefix tuning (``scaled_dot_product_attention``).
        qkv_delta: ``(B, N, 3 * D)`` added to the output of ``qkv`` (query, key, value thirds), before
            the head split and ``q_norm`` / ``k_norm``: the update of a LoRA expert.

    Returns:
        ``(B, N, D_out)``, the output of ``attn.proj`` (and ``attn.proj_drop``).
    """
    B, N, _ = x.shape
    num_heads, head_dim = _head_dims(attn)
    out_gate = attn.gate(x).sigmoid() if getattr(attn, "gate", None) is not None else None
    q, k, v = _queries_keys_values(attn, x, qkv_delta, num_heads, head_dim)
    k, v, num_prefix = _with_prefix(k, v, prefix_key, prefix_value)
    scale = float(getattr(attn, "scale", head_dim**-0.5))
    drop = attn.attn_drop.p if (attn.training and hasattr(attn, "attn_drop")) else 0.0
    if gate is None:
        kwargs = {} if math.isclose(scale, head_dim**-0.5, rel_tol=1e-12) else {"scale": scale}
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, **kwargs)
    else:
        out = _gated_prefix_attention(q, k, v, scale, gate, num_prefix, drop)
    out = out.transpose(1, 2).reshape(B, N, num_heads * head_dim)
    norm = getattr(attn, "norm", None)
    if norm is not None:
        out = norm(out)
    if out_gate is not None:
        out = out * out_gate
    out = attn.proj(out)
    proj_drop = getattr(attn, "proj_drop", None)
    return proj_drop(out) if proj_drop is not None else out


def _queries_keys_values(attn: nn.Module, x: Tensor, qkv_delta: Optional[Tensor], num_heads: int,
                         head_dim: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The heads' queries, keys and values ``(B, H, N, head_dim)`` of the fused ``qkv`` (plus ``qkv_delta``),
    through ``q_norm`` / ``k_norm`` where the attention has them."""
    B, N, _ = x.shape
    qkv = attn.qkv(x)
    if qkv_delta is not None:
        qkv = qkv + qkv_delta
    qkv = qkv.reshape(B, N, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if q_norm is not None:
        q = q_norm(q)
    if k_norm is not None:
        k = k_norm(k)
    return q, k, v


def _with_prefix(k: Tensor, v: Tensor, prefix_key: Optional[Tensor],
                 prefix_value: Optional[Tensor]) -> Tuple[Tensor, Tensor, int]:
    """Keys and values with the prefix prepended, and the prefix's length (0 without one)."""
    if prefix_key is None:
        return k, v, 0
    if prefix_value is None or prefix_value.shape != prefix_key.shape:
        raise ValueError(
            "prefix_key and prefix_value must both be given with the same shape, found "
            f"{tuple(prefix_key.shape)} and {None if prefix_value is None else tuple(prefix_value.shape)}"
        )
    k = torch.cat([prefix_key.to(k.dtype), k], dim=2)
    v = torch.cat([prefix_value.to(v.dtype), v], dim=2)
    return k, v, prefix_key.shape[2]


def _gated_prefix_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, gate: Tensor, num_prefix: int,
                            drop: float) -> Tensor:
    """Attention whose scaled prefix scores ``s`` become ``s + sigmoid(a * s) * b`` (NoRGa's gate ``(a, b)``)."""
    scores = (q * scale) @ k.transpose(-2, -1)  # (B, H, N, P + N)
    if num_prefix > 0:
        a, b = gate.to(scores.dtype).reshape(2).unbind(0)
        prefix_scores = scores[..., :num_prefix]
        prefix_scores = prefix_scores + torch.sigmoid(a * prefix_scores) * b
        scores = torch.cat([prefix_scores, scores[..., num_prefix:]], dim=-1)
    probs = scores.softmax(dim=-1)
    if drop > 0.0:
        probs = F.dropout(probs, p=drop)
    return probs @ v


def _identity(x: Tensor) -> Tensor:
    return x


def prefixed_block(
    block: nn.Module,
    x: Tensor,
    prefix_key: Optional[Tensor] = None,
    prefix_value: Optional[Tensor] = None,
    *,
    gate: Optional[Tensor] = None,
) -> Tensor:
    """A timm pre-norm ``Block`` forward whose attention gets prefix keys/values (``prefix_attention``).

    ``norm1 -> prefixed attention -> ls1 -> drop_path1 -> residual -> norm2 -> mlp -> ls2 -> drop_path2
    -> residual``; with no prefix it equals ``block(x)``.
    """
    ls1 = getattr(block, "ls1", _identity)
    ls2 = getattr(block, "ls2", _identity)
    dp1 = getattr(block, "drop_path1", _identity)
    dp2 = getattr(block, "drop_path2", _identity)
    x = x + dp1(ls1(prefix_attention(block.attn, block.norm1(x), prefix_key, prefix_value, gate=gate)))
    return x + dp2(ls2(block.mlp(block.norm2(x))))


def expert_block(
    block: nn.Module,
    x: Tensor,
    *,
    qkv_delta: Optional[Callable[[Tensor], Tensor]] = None,
    beside_mlp: Optional[Callable[[Tensor], Tensor]] = None,
) -> Tensor:
    """A timm pre-norm ``Block`` forward with experts: ``qkv_delta(norm1(x))`` ``(B, N, 3 * D)`` is added to
    the attention's ``qkv`` output (``prefix_attention``), and ``beside_mlp(x)`` (the tokens after the
    attention's residual) is added to the residual stream beside the MLP's output:
    ``x + beside_mlp(x) + mlp branch``. With neither it equals ``block(x)`` up to float rounding.
    """
    ls1 = getattr(block, "ls1", _identity)
    ls2 = getattr(block, "ls2", _identity)
    dp1 = getattr(block, "drop_path1", _identity)
    dp2 = getattr(block, "drop_path2", _identity)
    normed = block.norm1(x)
    delta = None if qkv_delta is None else qkv_delta(normed)
    x = x + dp1(ls1(prefix_attention(block.attn, normed, qkv_delta=delta)))
    mlp = dp2(ls2(block.mlp(block.norm2(x))))
    return x + mlp if beside_mlp is None else x + beside_mlp(x) + mlp


def class_token_pass(
    backbone: nn.Module, x: Tensor, slot_of_layer: Dict[int, int],
    slotted_block: Callable[[nn.Module, Tensor, int], Tensor],
) -> Tensor:
    """The final-norm class token ``(B, D)`` of ``backbone`` on ``x``, the block at each layer of
    ``slot_of_layer`` run as ``slotted_block(block, tokens, slot)`` (prefixes or experts) and the others as they are."""
    tokens = backbone.norm_pre(backbone.patch_drop(backbone._pos_embed(backbone.patch_embed(x))))
    for i, block in enumerate(backbone.blocks):
        slot = slot_of_layer.get(i)
        tokens = block(tokens) if slot is None else slotted_block(block, tokens, slot)
    return backbone.norm(tokens)[:, 0]


def check_prefixable_backbone(backbone: nn.Module, layers: Sequence[int]) -> Tuple[int, int]:
    """Check the timm ViT interface we use; returns ``(num_heads, head_dim)`` of the prefixed layers."""
    needed = ("patch_embed", "_pos_embed", "patch_drop", "norm_pre", "blocks", "norm")
    missing = [a for a in needed if not hasattr(backbone, a)]
    if missing:
        raise TypeError(
            f"HiDe-Prompt needs a timm VisionTransformer backbone; {type(backbone).__name__} lacks {missing}"
        )
    if getattr(backbone, "cls_token", None) is None:
        raise ValueError(
            f"HiDe-Prompt reads the final-norm CLS token, but {type(backbone).__name__} has no class token "
            "(build it with class_token=True)"
        )
    dims = set()
    for i in layers:
        block = backbone.blocks[i]
        attn = getattr(block, "attn", None)
        lacks = [a for a in ("norm1", "attn", "norm2", "mlp") if not hasattr(block, a)]
        if attn is not None:
            lacks += [f"attn.{a}" for a in ("qkv", "num_heads", "proj") if not hasattr(attn, a)]
        if lacks:
            raise TypeError(
                f"block {i} ({type(block).__name__}) cannot be prefixed: it lacks {lacks} "
                "(a pre-norm timm Block with a fused-qkv Attention is required)"
            )
        if not isinstance(attn.qkv, nn.Linear):
            raise TypeError(f"block {i}: attn.qkv must be an nn.Linear, found {type(attn.qkv).__name__}")
        dims.add(_head_dims(attn))
    if len(dims) != 1:
        raise ValueError(f"the prefixed layers disagree on (num_heads, head_dim): {sorted(dims)}")
    return dims.pop()


def resolve_prefix_layers(prefix_layers: Union[int, Sequence[int]], depth: int) -> Tuple[int, ...]:
    if depth < 1:
        raise ValueError("the backbone has no transformer blocks to prefix")
    if isinstance(prefix_layers, int):
        first = check_int(prefix_layers, "prefix_layers (the first n blocks)", caller="resolve_prefix_layers", minimum=1)
        return tuple(range(min(first, depth)))
    layers = tuple(sorted({int(i) for i in prefix_layers}))
    if not layers or layers[0] < 0 or layers[-1] >= depth:
        raise ValueError(f"prefix_layers must be block indices in [0, {depth}), found {list(prefix_layers)}")
    return layers
