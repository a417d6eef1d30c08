"""Stand-ins of the codebases outside the families, retrofitted through the ``generic`` seams only
(``docs/adapters.md``, "Codebases outside the table's families"): the real signatures of their model classes,
as read at the commits named there; nothing upstream is imported or copied."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

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


# ------------------------------------------------------------------------- S-Prompts S-iPrompts (SiNet)
class SPromptsViT(nn.Module):
    """``models.sinet.ViT_Prompts``: ``forward(x, instance_tokens=None, **kwargs)``, the prompt tokens (``(L, D)``
    for the batch or ``(B, L, D)`` per sample) inserted after the class token; returns the class token."""

    def __init__(self) -> None:
        super().__init__()
        self.vit = vit(seed=3)

    def forward(self, x: Tensor, instance_tokens: Optional[Tensor] = None, **kwargs: Any) -> Tensor:
        tokens = embed(self.vit, x)
        if instance_tokens is not None:
            prompts = instance_tokens + torch.zeros(x.shape[0], 1, tokens.shape[-1])
            tokens = torch.cat([tokens[:, :1], prompts, tokens[:, 1:]], dim=1)
        return self.vit.norm(self.vit.blocks(tokens))[:, 0]


class SPromptsSiNet(nn.Module):
    """``models.sinet.SiNet`` (CDDB: 2 classes per domain): ``classifier_pool`` and ``prompt_pool`` (one
    ``nn.Linear`` each per domain, the prompt its ``weight``), ``numtask`` (advanced by ``update_fc``);
    ``extract_vector(image)`` (the prompt-free pass, normalised), ``forward(image)`` (the current domain's prompt
    and classifier: a dict), ``interface(image, selection)`` (each sample's domain prompt, every classifier run,
    each sample's slice kept)."""

    class_num = 2

    def __init__(self, total_sessions: int = E, prompt_length: int = 3) -> None:
        super().__init__()
        self.image_encoder = SPromptsViT()
        torch.manual_seed(11)
        self.classifier_pool = nn.ModuleList([nn.Linear(D, self.class_num) for _ in range(total_sessions)])
        self.prompt_pool = nn.ModuleList([nn.Linear(D, prompt_length, bias=False) for _ in range(total_sessions)])
        self.numtask = 0

    def extract_vector(self, image: Tensor) -> Tensor:
        features = self.image_encoder(image)
        return features / features.norm(dim=-1, keepdim=True)

    def forward(self, image: Tensor) -> Dict[str, Tensor]:
        features = self.image_encoder(image, self.prompt_pool[self.numtask - 1].weight)
        return {"logits": self.classifier_pool[self.numtask - 1](features), "features": features}

    def interface(self, image: Tensor, selection: Tensor) -> Tensor:
        instance_batch = torch.stack([p.weight for p in self.prompt_pool], 0)[selection, :, :]
        features = self.image_encoder(image, instance_batch)
        logits = torch.cat([classifier(features) for classifier in self.classifier_pool], 1)
        columns = selection[:, None] * self.class_num + torch.arange(self.class_num)
        return logits.gather(1, columns)

    def update_fc(self, nb_classes: int) -> None:
        self.numtask += 1


# ------------------------------------------------------------------------------------- InfLoRA (SiNet)
class InfLoRAViT(nn.Module):
    """``models.vit_inflora.ViT_lora_co``: ``forward(x, task_id=-1, register_blk=-1, get_feat=False,
    get_cur_feat=False)`` returning ``(tokens, prompt_loss)``; every task's LoRA up to ``task_id`` added (here on
    the tokens, one block)."""

    def __init__(self, n_tasks: int, rank: int = 2) -> None:
        super().__init__()
        self.vit = vit(seed=4)
        torch.manual_seed(12)
        self.lora_A = nn.Parameter(0.3 * torch.randn(n_tasks, D, rank))
        self.lora_B = nn.Parameter(0.3 * torch.randn(n_tasks, rank, D))

    def forward(self, x: Tensor, task_id: int = -1, register_blk: int = -1, get_feat: bool = False,
                get_cur_feat: bool = False) -> Tuple[Tensor, Tensor]:
        tokens = embed(self.vit, x)
        lora = sum(tokens @ self.lora_A[t] @ self.lora_B[t] for t in range(task_id + 1))
        return self.vit.norm(self.vit.blocks(tokens + lora)), torch.zeros(())


class InfLoRASiNet(nn.Module):
    """``models.sinet_inflora.SiNet``: ``classifier_pool`` (one ``nn.Linear`` per task), ``numtask`` (advanced by
    ``update_fc``); ``forward(image, get_feat=False, get_cur_feat=False, fc_only=False)`` (the current task's
    classifier: a dict), ``interface(image, task_id=None)`` (every task's classifier so far, concatenated)."""

    def __init__(self, total_sessions: int = E, init_cls: int = 3) -> None:
        super().__init__()
        self.image_encoder = InfLoRAViT(total_sessions)
        torch.manual_seed(13)
        self.classifier_pool = nn.ModuleList([nn.Linear(D, init_cls) for _ in range(total_sessions)])
        self.numtask = 0

    def forward(self, image: Tensor, get_feat: bool = False, get_cur_feat: bool = False,
                fc_only: bool = False) -> Dict[str, Tensor]:
        features, prompt_loss = self.image_encoder(image, task_id=self.numtask - 1, get_feat=get_feat,
                                                   get_cur_feat=get_cur_feat)
        features = features[:, 0, :]
        return {"logits": self.classifier_pool[self.numtask - 1](features), "features": features,
                "prompt_loss": prompt_loss}

    def interface(self, image: Tensor, task_id: Optional[int] = None) -> Tensor:
        features, _ = self.image_encoder(image, task_id=self.numtask - 1 if task_id is None else task_id)
        return torch.cat([classifier(features[:, 0, :]) for classifier in self.classifier_pool[:self.numtask]], 1)

    def update_fc(self, nb_classes: int) -> None:
        self.numtask += 1
