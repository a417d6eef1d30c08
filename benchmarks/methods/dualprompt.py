"""DualPrompt and MISA on a frozen timm ViT (docs/protocol.md §4.2, §4.3): a shared G-prompt and an
E-prompt pool whose slots the steps (experts) own in slices; MISA starts from pretrained prompts.
Expert = step, ensemble bank = slot (docs/methods.md, "DualPrompt and MISA").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from fly_modules._validation import check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import QueryFeatures, register_method
from .prompting import (
    ConcatPromptMethod,
    PromptSource,
    cls_position,
    cosine_distance,
    load_prompt_tensor,
    prompts_by_layer,
    resolve_layers,
)

__all__ = ["DualPrompt", "MISA", "load_prompt_weights"]


@register_method
class DualPrompt(ConcatPromptMethod):
    """DualPrompt with step-sliced E-prompt pool.

    Args:
        backbone: frozen timm ViT.
        num_classes: classifier outputs.
        num_experts: number of steps (default 5).
        pool_size: E-prompt slots; default ``max(10, num_experts)``; must be ``>= num_experts``.
        g_prompt_layers, e_prompt_layers: block positions (default (0, 1) and (2, 3, 4), clamped to
            the backbone depth).
        g_prompt_length, e_prompt_length: tokens per layer (5 and 20).
        key_pull_weight: weight of the key-pull term (1.0).
        reference_quirks: match over the whole pool at inference, as the reference does.

    Attributes:
        g_prompts: ``(1, len(g_prompt_layers) * g_prompt_length, D)`` parameter (layer-major tokens).
        e_prompts: ``(pool_size, len(e_prompt_layers) * e_prompt_length, D)`` parameter.
        e_keys: ``(pool_size, D)`` parameter.
        slot_step: ``(pool_size,)`` long buffer, the step owning each slot (``>= num_experts`` for
            unowned slots).
    """

    name = "dualprompt"
    session_aware = False
    default_lr = 0.005

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        *,
        num_experts: int = 5,
        pool_size: Optional[int] = None,
        g_prompt_layers: Optional[Iterable[int]] = None,
        g_prompt_length: int = 5,
        e_prompt_layers: Optional[Iterable[int]] = None,
        e_prompt_length: int = 20,
        key_pull_weight: float = 1.0,
        reference_quirks: bool = False,
    ) -> None:
        super().__init__(backbone, num_classes, num_experts=num_experts)
        pool_size = max(10, self.num_experts) if pool_size is None else int(pool_size)
        if pool_size < self.num_experts:
            raise ValueError(
                f"{type(self).__name__}: pool_size {pool_size} is smaller than num_experts {self.num_experts}; "
                "every step needs at least one slot"
            )
        g_prompt_length = check_int(g_prompt_length, "g_prompt_length", caller=type(self).__name__, minimum=1)
        e_prompt_length = check_int(e_prompt_length, "e_prompt_length", caller=type(self).__name__, minimum=1)
        self.pool_size = pool_size
        self.slots_per_step = pool_size // self.num_experts
        caller = type(self).__name__
        self.g_layers = resolve_layers(g_prompt_layers, self.depth, default=(0, 1), what=f"{caller} G-prompt")
        self.e_layers = resolve_layers(e_prompt_layers, self.depth, default=(2, 3, 4), what=f"{caller} E-prompt")
        self.g_prompt_length = int(g_prompt_length)
        self.e_prompt_length = int(e_prompt_length)
        self.key_pull_weight = float(key_pull_weight)
        self.reference_quirks = bool(reference_quirks)
        factory = self._factory()
        g_tokens = len(self.g_layers) * self.g_prompt_length
        e_tokens = len(self.e_layers) * self.e_prompt_length
        self.g_prompts = nn.Parameter(torch.empty(1, g_tokens, self.embed_dim, **factory).uniform_(-1, 1))
        self.e_prompts = nn.Parameter(torch.empty(pool_size, e_tokens, self.embed_dim, **factory).uniform_(-1, 1))
        self.e_keys = nn.Parameter(torch.empty(pool_size, self.embed_dim, **factory).uniform_(-1, 1))
        self.register_buffer("slot_step", (torch.arange(pool_size) // self.slots_per_step).to(factory["device"]))

    # ------------------------------------------------------------------------------- seams
    def allowed_slots(self, batch: int, *, train: bool, expert: Optional[Tensor] = None) -> Optional[Tensor]:
        """``(B, pool_size)`` or ``(1, pool_size)`` bool mask of the slots a selection may use (None = all)."""
        if expert is not None:
            expert = self._check_expert_ids(expert, batch)
            return self.slot_step.unsqueeze(0) == expert.unsqueeze(1)
        if train:
            return (self.slot_step == self.current_expert).unsqueeze(0)
        if self.reference_quirks:
            return None
        owned = self.slot_step < self.num_experts
        return (owned & self.expert_started[self.slot_step.clamp(max=self.num_experts - 1)]).unsqueeze(0)

    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """``(B,)`` slot ids: top-1 key match inside the allowed slots (see ``allowed_slots``)."""
        distance = cosine_distance(query, self.e_keys).detach()
        allowed = self.allowed_slots(query.shape[0], train=train, expert=expert)
        if allowed is not None:
            distance = distance.masked_fill(~allowed, float("inf"))
        return distance.argmin(dim=1)

    def expert_of(self, selection: Tensor) -> Tensor:
        return self.slot_step[selection].clamp(max=self.num_experts - 1)

    # Temporal-ensemble banks are keyed by slot, as in the reference's "w/ TE2" (one bank per E-prompt
    # slot); the router still targets the step.
    @property
    def num_banks(self) -> int:
        return self.pool_size

    def bank_of(self, selection: Tensor) -> Tensor:
        return selection

    def banks_of_expert(self, expert: int) -> List[int]:
        return [int(slot) for slot in torch.nonzero(self.slot_step == int(expert)).flatten()]

    def _g_tokens(self, batch: int) -> Tensor:
        """``(B, G layers, G length, D)``: the shared G-prompt of every sample."""
        g = self.g_prompts + cls_position(self.backbone)
        return g.view(1, len(self.g_layers), self.g_prompt_length, self.embed_dim).expand(batch, -1, -1, -1)

    def selected_e_prompts(self, selection: Tensor) -> Tensor:
        """``(B, len(e_prompt_layers) * e_prompt_length, D)`` E-prompt tokens of the selected slots (the seam
        MISA's session adaptation overrides to add its projector)."""
        return self.e_prompts[selection]

    def _layer_prompts(self, selection: Tensor) -> Dict[int, List[Tensor]]:
        batch, dim = selection.shape[0], self.embed_dim
        e = (self.selected_e_prompts(selection) + cls_position(self.backbone)).view(
            batch, len(self.e_layers), self.e_prompt_length, dim)
        return prompts_by_layer((self.g_layers, self._g_tokens(batch)), (self.e_layers, e))

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        return self._prompted_cls(x, self._layer_prompts(selection))

    def common_features(self, x: Tensor) -> Tensor:
        """The class token with the G-prompt alone, shared by every step (the CKA study's common representation)."""
        return self._prompted_cls(x, prompts_by_layer((self.g_layers, self._g_tokens(x.shape[0]))))

    def auxiliary_loss(
        self, query: QueryFeatures, selection: Tensor, features: Tensor, parallel: BatchShare = WHOLE_BATCH
    ) -> Tensor:
        """Key pull: ``key_pull_weight * mean(1 - cos(query, selected key))``."""
        cos = torch.nn.functional.cosine_similarity(query.query, self.e_keys[selection], dim=-1)
        return self.key_pull_weight * (1.0 - cos).mean()


@register_method
class MISA(DualPrompt):
    """DualPrompt initialised from pretrained G/E prompts (MISA).

    The prompts come either as ``g_prompt`` and ``e_prompt``, or together as ``prompt_weights``.

    Args:
        g_prompt: tensor or file (``.safetensors``, or ``torch.save`` read with ``weights_only=True``) of
            shape ``(1, len(g_prompt_layers) * g_prompt_length, D)`` (or without the leading 1); the
            MISA release ships ``g_prompt.pt`` of shape (1, 20, 768).
        e_prompt: tensor or file of shape ``(P, len(e_prompt_layers) * e_prompt_length, D)``; the
            release ships ``e_prompt.pt`` of shape (10, 60, 768). When ``P != pool_size`` it is tiled
            along the pool axis and cut to ``pool_size`` (the reference's rule).
        prompt_weights: a ``.safetensors`` file holding exactly ``g_prompt`` and ``e_prompt`` (the proxy's:
            ``benchmarks/proxy/weights/proxy_misa_prompts.safetensors``, docs/methods.md).
        g_prompt_length: G tokens per layer (10 for MISA).
        **kwargs: the other ``DualPrompt`` arguments. The keys are not loaded (random, as in MISA).
    """

    name = "misa"

    @classmethod
    def protocol_kwargs(cls, protocol: Any, *, seed: int, backbone: nn.Module, num_classes: int) -> Dict[str, Any]:
        kwargs = super().protocol_kwargs(protocol, seed=seed, backbone=backbone, num_classes=num_classes)
        if "prompt_weights" in kwargs and protocol.misa_prompts:
            raise ValueError(
                f"MISA: pretrained prompts given twice, --misa-prompts {protocol.misa_prompts} and prompt_weights "
                f"{kwargs['prompt_weights']}; expected one of them"
            )
        if "g_prompt" in kwargs or "prompt_weights" in kwargs:
            return kwargs
        if protocol.misa_prompts:
            kwargs["g_prompt"] = f"{protocol.misa_prompts}/g_prompt.pt"
            kwargs["e_prompt"] = f"{protocol.misa_prompts}/e_prompt.pt"
            return kwargs
        # No pretrained prompts supplied: MISA degenerates to DualPrompt with 10 G tokens per layer and a
        # seeded uniform initialisation (protocol_notes says so in the run record).
        layout = {k: v for k, v in kwargs.items() if k not in ("num_experts", "reference_quirks")}
        shapes = DualPrompt(backbone, num_classes, num_experts=protocol.num_experts, **{"g_prompt_length": 10, **layout})
        generator = torch.Generator().manual_seed(seed)
        kwargs["g_prompt"] = torch.empty_like(shapes.g_prompts).uniform_(-1, 1, generator=generator)
        kwargs["e_prompt"] = torch.empty_like(shapes.e_prompts).uniform_(-1, 1, generator=generator)
        return kwargs

    @classmethod
    def protocol_notes(cls, protocol: Any) -> str:
        """Whether the run loaded pretrained prompts, and from where."""
        given = protocol.method_kwargs.get(cls.name, {})
        if "prompt_weights" in given:
            return f"pretrained prompts loaded from {Path(given['prompt_weights']).name} (prompt_weights)"
        if "g_prompt" in given:
            return "prompts given as g_prompt and e_prompt in the method's arguments"
        if protocol.misa_prompts:
            return "pretrained prompts loaded from --misa-prompts (g_prompt.pt, e_prompt.pt)"
        return cls.protocol_warning(protocol)

    @classmethod
    def protocol_warning(cls, protocol: Any) -> str:
        given = protocol.method_kwargs.get(cls.name, {})
        if protocol.misa_prompts or "prompt_weights" in given or "g_prompt" in given:
            return ""
        return ("no --misa-prompts: DualPrompt with MISA's 10 G-prompt tokens and a uniform prompt initialisation, "
                "not MISA's pretrained prompts")

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        *,
        g_prompt: Optional[PromptSource] = None,
        e_prompt: Optional[PromptSource] = None,
        prompt_weights: Optional[Union[str, "os.PathLike[str]"]] = None,
        g_prompt_length: int = 10,
        **kwargs,
    ) -> None:
        super().__init__(backbone, num_classes, g_prompt_length=g_prompt_length, **kwargs)
        g, e = _initial_prompts(g_prompt, e_prompt, prompt_weights)
        if g.dim() == 2:
            g = g.unsqueeze(0)
        self._check_prompt_shape(g, self.g_prompts, "g_prompt", "g_prompt_layers", "g_prompt_length", pool_axis=False)
        self._check_prompt_shape(e, self.e_prompts, "e_prompt", "e_prompt_layers", "e_prompt_length", pool_axis=True)
        if e.shape[0] != self.pool_size:
            repeats = -(-self.pool_size // e.shape[0])
            e = e.repeat(repeats, 1, 1)[: self.pool_size]
        with torch.no_grad():
            self.g_prompts.copy_(g)
            self.e_prompts.copy_(e)

    @staticmethod
    def _check_prompt_shape(
        loaded: Tensor, target: Tensor, what: str, layers_arg: str, length_arg: str, *, pool_axis: bool
    ) -> None:
        expected = ("P" if pool_axis else 1, target.shape[1], target.shape[2])
        ok = (
            loaded.dim() == 3
            and loaded.shape[1:] == target.shape[1:]
            and (loaded.shape[0] >= 1 if pool_axis else loaded.shape[0] == 1)
        )
        if not ok:
            raise ValueError(
                f"MISA {what}: loaded shape {tuple(loaded.shape)} does not match the expected {expected} "
                f"(tokens = len({layers_arg}) * {length_arg}, last dim = the backbone's embed dim); "
                "pretrained MISA prompts only fit the backbone width and prompt sizes they were trained with"
            )
        if not loaded.is_floating_point():
            raise TypeError(f"MISA {what}: expected a floating-point tensor, got {loaded.dtype}")


def _initial_prompts(
    g_prompt: Optional[PromptSource], e_prompt: Optional[PromptSource], prompt_weights: Optional[Any]
) -> Tuple[Tensor, Tensor]:
    """MISA's ``(g, e)`` from ``g_prompt`` and ``e_prompt``, or from ``prompt_weights``: exactly one source."""
    if prompt_weights is None:
        if g_prompt is None or e_prompt is None:
            raise ValueError("MISA: expected pretrained prompts, g_prompt and e_prompt or prompt_weights; got neither")
        return load_prompt_tensor(g_prompt, "MISA g_prompt"), load_prompt_tensor(e_prompt, "MISA e_prompt")
    if g_prompt is not None or e_prompt is not None:
        raise ValueError("MISA: expected g_prompt and e_prompt or prompt_weights, not both")
    return load_prompt_weights(prompt_weights)


def load_prompt_weights(path: Union[str, "os.PathLike[str]"]) -> Tuple[Tensor, Tensor]:
    """``(g_prompt, e_prompt)`` from a ``.safetensors`` file holding exactly those two tensors."""
    path = os.fspath(path)
    if not path.endswith(".safetensors"):
        raise ValueError(f"MISA prompt_weights: expected a .safetensors file with g_prompt and e_prompt, got {path!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"MISA prompt_weights: {path!r} does not exist; expected a .safetensors file with g_prompt and e_prompt "
            "(the proxy's is written by python -m benchmarks.proxy.pretrain_misa_prompts)"
        )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(path, device="cpu")
    except SafetensorError as error:
        raise ValueError(f"MISA prompt_weights: {path!r} is not a readable safetensors file ({error})") from None
    if set(tensors) != {"g_prompt", "e_prompt"}:
        raise ValueError(f"MISA prompt_weights: {path!r} holds {sorted(tensors)}; expected exactly e_prompt and g_prompt")
    return tensors["g_prompt"], tensors["e_prompt"]

