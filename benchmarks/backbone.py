"""The benchmark's backbone: a timm ViT by name, its pretrained weights from a local file or the local cache.

Nothing is fetched from the network unless downloads are allowed (``cross_ablation.py --download``):
without it the weights come from ``--weights FILE`` or from the local Hugging Face / timm cache, and a
missing file is a one-line :class:`BackboneLoadError` saying how to supply it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Tuple

from torch import nn

from benchmarks.flags import Parser, add_input_flag, add_output_flag

__all__ = [
    "BACKBONES", "BackbonePreset", "BackboneLoadError", "backbone_of", "build_backbone", "cached_weights", "check_backbone_available",
    "downloads_allowed",
]

_downloads = {"allowed": False}


@dataclass(frozen=True)
class BackbonePreset:
    """One of the paper's pretrained ViT-B/16 backbones.

    Attributes:
        label: the paper's name.
        model: the timm model (with the pretrained tag whose weights are these, where timm has them).
        ridge: the paper's router ridge lambda for this backbone.
        official_file: the checkpoint file the official code loads for it; where timm has no such
            weights, pass it (converted to a plain state dict when it is wrapped) with ``--weights``.
        wrapped: ``(key, prefix)`` of the backbone's tensors inside that file (``None``: a plain state dict;
            a file without ``key`` is read as a plain state dict).
        timm_differs: ``""`` where timm's weights for ``model`` are the paper's; otherwise the weights a run
            without ``--weights`` loads instead, said as a warning when it does.
    """

    label: str
    model: str
    ridge: float
    official_file: str
    wrapped: Optional[Tuple[str, str]] = None
    timm_differs: str = ""

    def warning(self, name: str) -> str:
        """The line a run of this backbone on timm's weights prints (``""`` where they are the paper's)."""
        if not self.timm_differs:
            return ""
        return (f"--backbone {name} without --weights runs {self.timm_differs}, a training other than the paper's "
                f"{self.label} ({self.official_file}); convert that file with python -m benchmarks.backbone {name} "
                f"{self.official_file} {name}.safetensors and pass --weights {name}.safetensors")


_TIMM_DEFAULT = "timm's default vit_base_patch16_224 weights (augreg2_in21k_ft_in1k)"

#: the paper's backbones by name (docs/benchmark.md, "Backbones"); ``--backbone NAME`` selects one
BACKBONES = {
    "sup21k": BackbonePreset("Sup-21K", "vit_base_patch16_224.orig_in21k", 1e4, "ViT-B_16.npz"),
    # The official code reads this file into a ViT-B/16, plain or under "state_dict" (FlyGCL's
    # vit_base_patch16_224_mepo_21k_1k); timm's tag is Google's AugReg ImageNet-21k -> 1k fine-tuning.
    "sup21k-1k": BackbonePreset(
        "Sup-21K/1K", "vit_base_patch16_224.augreg_in21k_ft_in1k", 1e6, "vit_21k_1k_mepo_epoch_0.pth",
        ("state_dict", ""), "timm's augreg_in21k_ft_in1k weights (Google's AugReg ImageNet-21k pretraining, "
                            "fine-tuned on ImageNet-1k)"),
    "ibot21k": BackbonePreset("iBOT-21K", "vit_base_patch16_224", 1e7, "checkpoint.pth", ("teacher", "backbone."),
                              _TIMM_DEFAULT),
    "ibot1k": BackbonePreset("iBOT-1K", "vit_base_patch16_224", 1e7, "ibot_vitbase16_pretrain.pth",
                             ("state_dict", ""), _TIMM_DEFAULT),
    "dino1k": BackbonePreset("DINO-1K", "vit_base_patch16_224.dino", 1e7, "dino_vitbase16_pretrain.pth"),
    "mocov3-1k": BackbonePreset("MoCo v3-1K", "vit_base_patch16_224", 1e6, "mocov3-vit-base-300ep.pth",
                                ("model", ""), _TIMM_DEFAULT),
}


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


def backbone_of(protocol: Any) -> nn.Module:
    """The timm ViT (no classifier) a protocol names: its ``model``, ``model_kwargs``, ``pretrained`` and
    ``weights`` (:class:`benchmarks.core.protocol.Protocol`), built by :func:`build_backbone`."""
    return build_backbone(protocol.model, protocol.model_kwargs, pretrained=protocol.pretrained, weights=protocol.weights)


def unwrap_checkpoint(path: str, wrapped: Tuple[str, str], model: nn.Module) -> dict:
    """The backbone tensors of a wrapped checkpoint (``wrapped = (key, prefix)``), named as ``model``'s.

    Loaded with ``weights_only=True``. Entries that are not the model's (a projection head, the
    optimizer) are left out; a model tensor the file lacks, or has in another shape, raises.
    """
    import torch

    root = torch.load(path, map_location="cpu", weights_only=True)
    key, prefix = wrapped
    tensors = root.get(key, root) if isinstance(root, dict) else None
    if not isinstance(tensors, dict):
        raise BackboneLoadError(f"{path}: expected a dict of tensors (under {key!r}), found {type(root).__name__}")
    renamed = {name[len(prefix):]: value for name, value in tensors.items() if name.startswith(prefix)}
    expected = {name: value.shape for name, value in model.state_dict().items()}
    missing = [name for name in expected if name not in renamed]
    wrong = [name for name in expected if name in renamed and renamed[name].shape != expected[name]]
    if missing or wrong:
        raise BackboneLoadError(f"{path}: {len(missing)} of the model's tensors missing (e.g. {missing[:2]}), "
                                f"{len(wrong)} of another shape (e.g. {wrong[:2]}); expected a checkpoint of "
                                f"this model under {key!r} with prefix {prefix!r}")
    return {name: renamed[name].contiguous() for name in expected}


def convert(preset: str, source: str, target: str) -> str:
    """Write the backbone tensors of ``preset``'s official checkpoint ``source`` as a safetensors file
    ``target``, loadable with ``--backbone preset --weights target``."""
    import timm
    from safetensors.torch import save_file

    spec = BACKBONES[preset]
    model = timm.create_model(spec.model.split(".")[0], pretrained=False, num_classes=0)
    tensors = unwrap_checkpoint(source, spec.wrapped or ("", ""), model)
    save_file(tensors, target)
    return target


def main(argv: Optional[list] = None) -> int:
    """``python -m benchmarks.backbone PRESET SOURCE TARGET``: convert an official checkpoint."""
    parser = Parser(prog="python -m benchmarks.backbone", description=main.__doc__)
    parser.add_argument("preset", choices=list(BACKBONES))
    add_input_flag(parser, "source", "file", convert=str, help="the official code's checkpoint file")
    add_output_flag(parser, "target", "file", default=None, help="the safetensors file to write")
    args = parser.parse_args(argv)
    print(f"written: {convert(args.preset, args.source, args.target)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
