"""Stand-ins of the codebases outside the families, retrofitted through the ``generic`` seams only
(``docs/adapters.md``, "Codebases outside the table's families"): the real signatures of their model classes,
as read at the commits named there; nothing upstream is imported or copied."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor
from upstream_standins import JLL2P, JLPrompt


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
