"""Stand-ins of the codebases outside the families, retrofitted through the ``generic`` seams only
(``docs/adapters.md``, "Codebases outside the table's families"): the real signatures of their model classes,
as read at the commits named there; nothing upstream is imported or copied."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor, nn
from upstream_standins import JLL2P, C, D, E, JLPrompt, embed, tii_prompt_id, vit


class PGPL2P(JLL2P):
    """l2p-pgp ``VisionTransformer``: l2p-pytorch's signatures (``prompt.Prompt.forward(x_embed,
    prompt_mask=None, cls_features=None)``, ``head``, ``forward(x, task_id=-1, cls_features=None,
    train=False)``), pool 10 / top 5 scaled to pool 4 / top 2 (an expert = one slice of 2 slots); it records
    the patch embeddings in ``act["rep"]``, which the task-start memory pass reads for the projection."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.prompt = JLPrompt(pool_size=4, length=2, top_k=2, batchwise_prompt=True)
        self.act: Dict[str, Tensor] = {}

    def forward(self, x: Tensor, task_id: int = -1, cls_features: Optional[Tensor] = None, train: bool = False):
        self.act["rep"] = self.vit.patch_embed(x)
        return super().forward(x, task_id=task_id, cls_features=cls_features, train=train)


# -------------------------------------------------------------------- HiDe-PET HiDe-LoRA (lora_type hide)
class HiDePETLoraPool(nn.Module):
    """``peft.lora.hide_lora.HideLoraPool``: one LoRA per task (``k_lora_A`` ``(pool, D, r)``, ``k_lora_B``
    ``(pool, r, D)``; here on the tokens, one block); ``forward(x, task_id=-1, train=False, **kwargs)``: an int
    in training, one id per sample at evaluation."""

    def __init__(self, pool_size: int, rank: int) -> None:
        super().__init__()
        self.k_lora_A = nn.Parameter(0.3 * torch.randn(pool_size, D, rank))
        self.k_lora_B = nn.Parameter(0.3 * torch.randn(pool_size, rank, D))

    def forward(self, x: Tensor, task_id: Any = -1, train: bool = False, **kwargs: Any) -> Dict[str, Tensor]:
        ids = torch.full((x.shape[0],), task_id, dtype=torch.long) if isinstance(task_id, int) else task_id
        return {"lora_value": torch.bmm(torch.bmm(x, self.k_lora_A[ids]), self.k_lora_B[ids])}


class HiDePETLoRA(nn.Module):
    """HiDe-PET ``vits.hide_lora_vision_transformer.VisionTransformer`` (``lora_type='hide'``): ``lora_layer``,
    ``head``; ``forward(x, task_id=-1, train=False, fc_only=False, cls_features=None, old=False,
    use_mlp_head=False, mlp_head_only=False)`` returning a dict. ``train_one_epoch`` calls
    ``model(x, task_id=t, train=True)`` and never runs ``original_model``; ``evaluate`` runs ``original_model``
    (class -> task) and calls ``model(x, task_id=<one id per sample>)``. ``last_task_ids``: the LoRA each sample
    used."""

    def __init__(self) -> None:
        super().__init__()
        self.vit = vit()
        torch.manual_seed(9)
        self.lora_layer = HiDePETLoraPool(E, rank=2)
        self.head = nn.Linear(D, C)
        self.last_task_ids: Optional[Tensor] = None

    def forward(self, x: Tensor, task_id: Any = -1, train: bool = False, fc_only: bool = False,
                cls_features: Optional[Tensor] = None, old: bool = False, use_mlp_head: bool = False,
                mlp_head_only: bool = False) -> Dict[str, Tensor]:
        if fc_only:
            return {"logits": self.head(x)}
        tokens = embed(self.vit, x)
        lora = self.lora_layer(tokens, task_id=task_id, train=train)["lora_value"]
        self.last_task_ids = torch.full((x.shape[0],), task_id) if isinstance(task_id, int) else task_id
        features = self.vit.norm(self.vit.blocks(tokens + lora))[:, 0]
        return {"pre_logits": features, "features": features, "logits": self.head(features)}


def hide_pet_eval_forward(model: nn.Module, original: nn.Module, x: Tensor) -> Dict[str, Tensor]:
    """HiDe-PET's evaluation call: the task-identity pass, then one LoRA id per sample."""
    return model(x, task_id=tii_prompt_id(original, x)[:, 0])
