"""The benchmark's backbone: a timm ViT by name, its pretrained weights from a local file or the local cache.

Nothing is fetched from the network unless downloads are allowed (``cross_ablation.py --download``):
without it the weights come from ``--weights FILE`` or from the local Hugging Face / timm cache, and a
missing file is a one-line :class:`BackboneLoadError` saying how to supply it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional

from torch import nn

__all__ = ["BackboneLoadError", "build_backbone", "cached_weights", "check_backbone_available", "downloads_allowed"]

_downloads = {"allowed": False}


class BackboneLoadError(RuntimeError):
    """The backbone's pretrained weights could not be loaded (the message says how to supply them)."""


@contextlib.contextmanager
def downloads_allowed(allowed: bool = True) -> Iterator[None]:
    """Let :func:`build_backbone` fetch missing weights from the hub inside this block (process-wide)."""
    before = _downloads["allowed"]
    _downloads["allowed"] = bool(allowed)
    try:
        yield
    finally:
        _downloads["allowed"] = before


def _pretrained_cfg(model: str) -> Any:
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(model)
    if cfg is None:
        raise BackboneLoadError(f"timm has no pretrained weights registered for {model!r}; pass --weights FILE")
    return cfg


def cached_weights(model: str) -> Optional[str]:
    """Path of ``model``'s pretrained weights in the local Hugging Face or timm cache, ``None`` if absent."""
    cfg = _pretrained_cfg(model)
    if cfg.hf_hub_id:
        from huggingface_hub import try_to_load_from_cache

        repo, _, revision = cfg.hf_hub_id.partition("@")
        names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["model.safetensors", "pytorch_model.bin"]
        for name in names:
            found = try_to_load_from_cache(repo, name, revision=revision or None)
            if isinstance(found, str) and os.path.isfile(found):
                return found
    if cfg.url:
        from timm.models._hub import get_cache_dir

        candidate = os.path.join(get_cache_dir(), os.path.basename(cfg.url.split("?")[0]))
        if os.path.isfile(candidate):
            return candidate
    return None


def _source(model: str) -> str:
    cfg = _pretrained_cfg(model)
    return f"the Hugging Face hub ({cfg.hf_hub_id})" if cfg.hf_hub_id else (cfg.url or "timm's weight URL")


def check_backbone_available(model: str, pretrained: bool, weights: Optional[str]) -> None:
    """Raise :class:`BackboneLoadError` now if the weights a run will need are neither given nor cached
    (and downloads are not allowed), so that a sweep fails before any data or model work."""
    if weights is not None:
        if not os.path.isfile(weights):
            raise BackboneLoadError(f"--weights {weights!r}: no such file")
        return
    if pretrained and not _downloads["allowed"] and cached_weights(model) is None:
        raise BackboneLoadError(
            f"the pretrained weights of {model!r} are not in the local cache; pass --weights FILE, "
            f"or --download to fetch them from {_source(model)}, or --pretrained false for a random backbone"
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


def build_backbone(model: str, model_kwargs: dict, *, pretrained: bool, weights: Optional[str]) -> nn.Module:
    """A timm ViT without classifier (``num_classes=0``), pretrained weights from ``weights``, the local
    cache, or (only inside :func:`downloads_allowed`) the hub."""
    import timm  # the bench extra

    kwargs = dict(model_kwargs)
    if weights is None and pretrained and not _downloads["allowed"]:
        weights = cached_weights(model)
        if weights is None:
            check_backbone_available(model, pretrained, None)  # raises with the fix
    if weights is not None:
        # custom_load routes a file to the model's own JAX .npz reader; timm releases differ in whether that
        # reader also accepts safetensors/.pth, so only .npz files take it and the rest timm's state-dict loader.
        kwargs["pretrained_cfg_overlay"] = dict(file=weights, custom_load=str(weights).endswith(".npz"))
    try:
        return timm.create_model(model, pretrained=pretrained or weights is not None, num_classes=0, **kwargs)
    except Exception as error:  # timm raises several types for unreadable weights (hub, file, config)
        if not (pretrained or weights):
            raise
        raise BackboneLoadError(
            f"could not load pretrained weights for {model!r} ({type(error).__name__}: {_first_line(error)}); "
            f"pass --weights /path/to/file (.safetensors/.pth/.npz) or --pretrained false"
        ) from error
