"""HiDe-LoRA and HiDe-Adapter on a frozen timm ViT: HiDe's training (``HiDeMethod``: gate branch,
orthogonality, classifier alignment, task identification by the gate) with per-task LoRA on the key
and value projections, or per-task adapters beside the MLP, in the first blocks instead of prefixes
(docs/methods.md, "HiDe-LoRA and HiDe-Adapter").
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Dict, Sequence, Union

from torch import Tensor, nn

from fly_modules._validation import check_int

from .base import register_method
from .hide import HiDeMethod
from .prefix_attention import check_prefixable_backbone, class_token_pass, expert_block, resolve_prefix_layers
from .task_experts import GatheredAdapters, GatheredLoRA, TaskAdapter, TaskLoRA, Tasks

__all__ = ["HiDeLoRA", "HiDeAdapter"]


class _BlockExperts(HiDeMethod):
    """``HiDeMethod`` whose experts act inside the first blocks (``expert_layers``); the pass is one
    embedding, the blocks (each expert block through ``expert_block``), the final norm's CLS."""

    def _expert_layers(self, layers: Union[int, Sequence[int]]) -> None:
        self.expert_layers = resolve_prefix_layers(layers, len(self.backbone.blocks))
        check_prefixable_backbone(self.backbone, self.expert_layers)
        self._slot_of_layer: Dict[int, int] = {layer: s for s, layer in enumerate(self.expert_layers)}

    def _tasks(self, selection: Union[Tensor, int], batch: int, device: Any) -> Tasks:
        return int(selection) if isinstance(selection, int) else self._task_ids(selection, batch, device)

    def forward_features(self, x: Tensor, selection: Union[Tensor, int]) -> Tensor:
        """Pass with task ``selection`` (one int for the batch, or ``(B,)`` long) -> final-norm CLS ``(B, D)``."""
        experts = self.gathered_experts(self._tasks(selection, x.shape[0], x.device))
        return class_token_pass(self.backbone, x, self._slot_of_layer,
                                lambda block, tokens, slot: self.expert_block(experts, slot, block, tokens))

    def gathered_experts(self, tasks: Tasks) -> Any:
        """The experts' weights of ``tasks`` for one pass."""
        raise NotImplementedError

    def expert_block(self, experts: Any, slot: int, block: nn.Module, tokens: Tensor) -> Tensor:
        """The ``slot``-th expert block's forward with ``experts`` (:meth:`gathered_experts`)."""
        raise NotImplementedError


@register_method
class HiDeLoRA(_BlockExperts):
    """HiDe-LoRA: ``HiDeMethod`` whose experts are per-task LoRA on the attention's key and value
    projections of the first blocks (``TaskLoRA``).

    Args (besides ``HiDeMethod``'s):
        lora_layers: the first n blocks (5, clamped to the depth) or explicit block indices.
        lora_rank: r (10, the official run's ``sdlora_rank``); lora_alpha: the update's scale is
            ``alpha / r`` (0.8, its ``sdlora_alpha``).

    Attributes:
        lora: ``TaskLoRA`` holding every task's bank; expert_layers: the LoRA blocks.
    """

    name: ClassVar[str] = "hide-lora"

    def build_experts(
        self, dd: Dict[str, Any], *, lora_layers: Union[int, Sequence[int]] = 5, lora_rank: int = 10,
        lora_alpha: float = 0.8,
    ) -> None:
        self._expert_layers(lora_layers)
        rank = check_int(lora_rank, "lora_rank", caller=type(self).__name__, minimum=1)
        self.lora = TaskLoRA(self.expert_layers, self.num_tasks, self.embed_dim, rank, float(lora_alpha), dd)

    def experts_repr(self) -> str:
        return f"lora_layers={self.expert_layers}, lora_rank={self.lora.rank}, lora_alpha={self.lora.alpha}"

    def gathered_experts(self, tasks: Tasks) -> GatheredLoRA:
        return self.lora.gathered(tasks)

    def expert_block(self, experts: GatheredLoRA, slot: int, block: nn.Module, tokens: Tensor) -> Tensor:
        return expert_block(block, tokens, qkv_delta=partial(experts.qkv_delta, slot))


@register_method
class HiDeAdapter(_BlockExperts):
    """HiDe-Adapter: ``HiDeMethod`` whose experts are per-task bottleneck adapters beside the MLP of the
    first blocks (``TaskAdapter``).

    Args (besides ``HiDeMethod``'s):
        adapter_layers: the first n blocks (5, clamped to the depth) or explicit block indices.
        adapter_width: the bottleneck W (20: twice the official run's ``sdlora_rank``, as it sets it).

    Attributes:
        adapter: ``TaskAdapter`` holding every task's bank; expert_layers: the adapter blocks.
    """

    name: ClassVar[str] = "hide-adapter"

    def build_experts(
        self, dd: Dict[str, Any], *, adapter_layers: Union[int, Sequence[int]] = 5, adapter_width: int = 20,
    ) -> None:
        self._expert_layers(adapter_layers)
        width = check_int(adapter_width, "adapter_width", caller=type(self).__name__, minimum=1)
        self.adapter = TaskAdapter(self.expert_layers, self.num_tasks, self.embed_dim, width, dd)

    def experts_repr(self) -> str:
        return f"adapter_layers={self.expert_layers}, adapter_width={self.adapter.width}"

    def gathered_experts(self, tasks: Tasks) -> GatheredAdapters:
        return self.adapter.gathered(tasks)

    def expert_block(self, experts: GatheredAdapters, slot: int, block: nn.Module, tokens: Tensor) -> Tensor:
        return expert_block(block, tokens, beside_mlp=partial(experts.output, slot))
