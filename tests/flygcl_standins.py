"""Small stand-ins of FlyGCL's own methods beyond the Si-Blurry lineage, for the adapter tests: S-Prompts,
HiDe-Prompt / NoRGa, CODA-Prompt, HiDe-LoRA / HiDe-Adapter and SD-LoRA.

Written like ``upstream_standins`` (which holds the shared backbone helpers and the other codebases'
stand-ins): from the public interface only, nothing upstream imported or copied; quirks marked ``quirk``.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from upstream_standins import TASK_OF_CLASS, C, D, E, classifier_backbone, embed, prompted_blocks, vit


# ------------------------------------------------------------------------------ FlyGCL S-Prompts
class ExpertPrompts(nn.Module):
    """FlyGCL ``models.flyprompt.Prompt``: ``prompts`` (layers, experts, len, D), ``num_experts``;
    ``forward(backbone, inputs, expert_ids)`` gathers each sample's expert (``prompts[:, expert_ids]``);
    ``init_new_expert(e)`` starts expert ``e`` from the mean of the earlier ones."""

    def __init__(self, num_experts: int = E, layers: int = 2, length: int = 2) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.prompts = nn.Parameter(torch.rand(layers, num_experts, length, D))
        self.last_expert_ids: Optional[Tensor] = None

    def forward(self, backbone: nn.Module, inputs: Tensor, expert_ids: Tensor) -> Tensor:
        self.last_expert_ids = expert_ids.detach().clone()
        prompts = self.prompts[:, expert_ids.long()]  # (layers, B, len, D): per sample
        tokens = embed(backbone, inputs)
        return prompted_blocks(backbone, tokens, {i: prompts[i] for i in range(prompts.shape[0])})[:, 0]

    @torch.no_grad()
    def init_new_expert(self, expert_id: int) -> None:
        if 0 < expert_id < self.num_experts:
            self.prompts[:, expert_id] = self.prompts[:, :expert_id].mean(dim=1)


class FlyGCLSPrompt(nn.Module):
    """FlyGCL ``models.sprompt.SPrompt``: ``experts``, ``backbone`` (classifier ``fc``), ``task_count``;
    ``forward(inputs, expert_ids=None, **kwargs)`` (``None``: every sample on ``task_count``),
    ``process_task_count()`` at each task end."""

    def __init__(self) -> None:
        super().__init__()
        self.task_num, self.task_count = E, 0
        self.backbone = classifier_backbone(fc=True)
        torch.manual_seed(8)
        self.experts = ExpertPrompts(E)

    def forward(self, inputs: Tensor, expert_ids: Optional[Tensor] = None, **kwargs: Any) -> Tensor:
        if expert_ids is None:
            expert_ids = torch.full((inputs.shape[0],), self.task_count, dtype=torch.long, device=inputs.device)
        return self.backbone.fc(self.experts(self.backbone, inputs, expert_ids))

    @torch.no_grad()
    def process_task_count(self) -> None:
        self.task_count += 1
        self.experts.init_new_expert(self.task_count)


def sprompt_eval_forward(model: nn.Module, x: Tensor) -> Tensor:
    """The S-Prompts evaluation call: the trainer routes each sample (nearest task prototype; here every
    sample to task 0) and passes ``expert_ids``."""
    return model(x, expert_ids=torch.zeros(x.shape[0], dtype=torch.long))


# ------------------------------------------------------------------------ FlyGCL HiDe-Prompt / NoRGa
class PrefixBackbone(nn.Module):
    """FlyGCL ``PrefixViTBackbone``: ``forward_features(x, use_prefix, task_id=None)`` returns the class
    token; with ``use_prefix`` each sample gets its task's prompts (``task_id`` an int or ``(B,)``)."""

    def __init__(self, gated: bool) -> None:
        super().__init__()
        self.backbone = vit()
        torch.manual_seed(9)
        self.prefix = nn.Parameter(0.5 * torch.randn(2, E, 2, D))
        if gated:  # NoRGa's gate scale
            self.act_scale = nn.Parameter(torch.ones(2, 2, 1, 1))
        self.last_task_ids: Optional[Tensor] = None

    def forward_features(self, x: Tensor, use_prefix: bool, task_id: Optional[Any] = None) -> Tensor:
        tokens = embed(self.backbone, x)
        if not use_prefix or task_id is None:
            return prompted_blocks(self.backbone, tokens, {})[:, 0]
        ids = torch.as_tensor(task_id, device=x.device).long().reshape(-1).expand(x.shape[0]).clamp(0, E - 1)
        self.last_task_ids = ids.clone()
        prompts = self.prefix[:, ids]
        return prompted_blocks(self.backbone, tokens, {i: prompts[i] for i in range(prompts.shape[0])})[:, 0]


class FlyGCLPrefixModel(nn.Module):
    """FlyGCL ``HiDePrefixModel`` / ``NoRGaPrefixModel``: no ``forward``; ``forward_prompt(x, task_id,
    labels=None, update_stats=False) -> (logits, features)`` and ``forward_gate(x, detach_backbone=True,
    labels=None, update_stats=False) -> (logits, h)``; ``prompt_head``, ``g_mlp``, ``g_head``, ``task_num``."""

    def __init__(self, gated: bool = False) -> None:
        super().__init__()
        self.task_num = E
        self.backbone = PrefixBackbone(gated)
        self.backbone.backbone.requires_grad_(False)
        torch.manual_seed(10)
        self.prompt_head = nn.Linear(D, C)
        self.g_mlp = nn.Sequential(nn.Linear(D, D), nn.ReLU(inplace=True))
        self.g_head = nn.Linear(D, C)

    def forward_prompt(self, x: Tensor, task_id: Any, labels: Optional[Tensor] = None,
                       update_stats: bool = False) -> Tuple[Tensor, Tensor]:
        features = self.backbone.forward_features(x, use_prefix=True, task_id=task_id)
        return self.prompt_head(features), features

    def forward_gate(self, x: Tensor, detach_backbone: bool = True, labels: Optional[Tensor] = None,
                     update_stats: bool = False) -> Tuple[Tensor, Tensor]:
        features = self.backbone.forward_features(x, use_prefix=False, task_id=None)
        h = self.g_mlp(features.detach() if detach_backbone else features)
        return self.g_head(h), h


def prefix_train_forward(model: nn.Module, x: Tensor, task_id: int) -> Tensor:
    """``online_train``: the prompt branch on the trainer's task, then the gate branch (both trained)."""
    logits, _ = model.forward_prompt(x, task_id=task_id)
    model.forward_gate(x, detach_backbone=True)
    return logits


def prefix_eval_forward(model: nn.Module, x: Tensor) -> Tensor:
    """``online_evaluate``: the gate's class, mapped to its first task, then the prompt branch."""
    with torch.no_grad():
        gate_logits, _ = model.forward_gate(x)
    task_hat = TASK_OF_CLASS[gate_logits.argmax(dim=1)]
    logits, _ = model.forward_prompt(x, task_id=task_hat)
    return logits


def prefix_alignment_step(model: nn.Module) -> None:
    """The classifier alignment of ``online_after_task``: the model in eval mode, ``prompt_head`` trained
    directly on sampled features (FlyGCL's ``_run_ca_for_branch``)."""
    model.eval()
    head = model.prompt_head
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    features = torch.randn(6, D, generator=torch.Generator().manual_seed(3))
    loss = F.cross_entropy(head(features), torch.arange(6) % C)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


# ------------------------------------------------------------------------------ FlyGCL CODA-Prompt
class FlyGCLCodaPrompt(nn.Module):
    """FlyGCL ``models.codaprompt.CodaPrompt``: per prompt layer ``e_k_<l>``, ``e_a_<l>`` (pool, D) and
    ``e_p_<l>`` (pool, len, D); ``num_pt_per_task`` components per task; ``forward(inputs)`` (training:
    ``(logits, loss)``, components ``[0, (task_count+1)·pt)`` with the earlier ones detached; inference:
    logits, the same window); ``process_task_count()`` re-creates the Parameters (quirk: new objects)."""

    def __init__(self) -> None:
        super().__init__()
        self.task_num, self.task_count, self.num_pt_per_task = E, 0, 2
        self.backbone = classifier_backbone(fc=True)
        self.register_buffer("pos_e_prompt", torch.tensor([0, 1]))
        torch.manual_seed(11)
        for layer in (0, 1):
            setattr(self, f"e_k_{layer}", nn.Parameter(torch.randn(E * 2, D)))
            setattr(self, f"e_a_{layer}", nn.Parameter(torch.randn(E * 2, D)))
            setattr(self, f"e_p_{layer}", nn.Parameter(torch.randn(E * 2, 2, D)))

    def forward(self, inputs: Tensor) -> Any:
        with torch.no_grad():
            query = self.backbone.forward_features(inputs)[:, 0]
        start, end = self.task_count * self.num_pt_per_task, (self.task_count + 1) * self.num_pt_per_task
        prompts = {}
        for layer in (0, 1):
            key, attention, prompt = (getattr(self, f"e_{n}_{layer}") for n in "kap")
            if self.training:
                key, attention, prompt = (torch.cat([t[:start].detach(), t[start:end]]) for t in (key, attention, prompt))
            else:
                key, attention, prompt = key[:end], attention[:end], prompt[:end]
            weights = torch.einsum("bkd,kd->bk", F.normalize(query.unsqueeze(1) * attention, dim=2),
                                   F.normalize(key, dim=1))
            prompts[layer] = torch.einsum("bk,kld->bld", weights, prompt)
        logits = self.backbone.fc(prompted_blocks(self.backbone, embed(self.backbone, inputs), prompts)[:, 0])
        return (logits, torch.zeros(())) if self.training else logits

    @torch.no_grad()
    def process_task_count(self) -> None:
        self.task_count += 1
        for name in [n for n, _ in self.named_parameters() if n.startswith("e_")]:
            setattr(self, name, nn.Parameter(getattr(self, name).detach().clone()))


# -------------------------------------------------------------- FlyGCL HiDe-LoRA / HiDe-Adapter / SD-LoRA
class TaskExperts(nn.Module):
    """FlyGCL ``models.experts.LoRAExpert`` / ``models.hide_adapter_vit.AdapterExpert``: per-task low-rank
    experts in the first ``layers`` blocks; ``forward(backbone, inputs, expert_ids) -> (B, D)`` final-norm
    class token. The batch is split by ``expert_ids.unique()`` and scattered back, as upstream. Here the
    LoRA expert adds a low-rank path beside the attention, the adapter one beside the MLP."""

    def __init__(self, adapter: bool, layers: int = 2, rank: int = 2, seed: int = 12) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.adapter, self.num_experts, self.layers = adapter, E, layers
        self.down = nn.Parameter(0.5 * torch.randn(layers, E, D, rank))
        self.up = nn.Parameter(0.5 * torch.randn(layers, E, rank, D))
        self.last_expert_ids: Optional[Tensor] = None

    def forward(self, backbone: nn.Module, inputs: Tensor, expert_ids: Tensor) -> Tensor:
        self.last_expert_ids = expert_ids.clone()
        tokens = embed(backbone, inputs)
        output = tokens.new_zeros(tokens.shape[0], tokens.shape[2])
        for expert in expert_ids.unique().tolist():
            rows = (expert_ids == expert).nonzero(as_tuple=True)[0]
            output[rows] = self.one_expert(backbone, tokens[rows], int(expert))
        return output

    def one_expert(self, backbone: nn.Module, tokens: Tensor, expert: int) -> Tensor:
        for i, block in enumerate(backbone.blocks):
            if i >= self.layers:
                tokens = block(tokens)
                continue
            down, up = self.down[i, expert], self.up[i, expert]
            hidden = block.norm1(tokens)
            lora = 0 if self.adapter else hidden @ down @ up
            tokens = tokens + block.attn(hidden) + lora
            adapter = F.relu(tokens @ down) @ up if self.adapter else 0
            tokens = tokens + block.mlp(block.norm2(tokens)) + adapter
        return backbone.norm(tokens)[:, 0]


class FlyGCLExpertModel(nn.Module):
    """FlyGCL ``HiDeLoRAModel`` (``lora_expert``) / ``HiDeAdapterModel`` (``adapter_expert``): no ``forward``;
    ``forward_prompt(x, task_id, labels=None, update_stats=False) -> (logits, feat)`` with ``task_id`` an
    int, a 0-d or a ``(B,)`` tensor clamped to ``[0, task_num - 1]``; ``forward_gate(x, detach_backbone=True,
    labels=None, update_stats=False) -> (logits, h)`` on the frozen ``backbone.forward_features(x)[:, 0]``;
    ``prompt_head``, ``g_mlp``, ``g_head``, ``task_num``."""

    def __init__(self, adapter: bool = False) -> None:
        super().__init__()
        self.task_num = E
        self.backbone = vit()
        setattr(self, "adapter_expert" if adapter else "lora_expert", TaskExperts(adapter))
        self.experts = self.adapter_expert if adapter else self.lora_expert
        torch.manual_seed(13)
        self.prompt_head = nn.Linear(D, C)
        self.g_mlp = nn.Sequential(nn.Linear(D, D), nn.ReLU(inplace=True))
        self.g_head = nn.Linear(D, C)

    def _build_task_ids(self, batch: int, task_id: Any, device: torch.device) -> Tensor:
        if isinstance(task_id, int):
            ids = torch.full((batch,), task_id, device=device, dtype=torch.long)
        elif isinstance(task_id, Tensor):
            ids = task_id.reshape(1).expand(batch) if task_id.dim() == 0 else task_id
            ids = ids.to(device).long()
        else:
            raise TypeError("task_id must be int or 1D/0D tensor")
        return ids.clamp(0, self.task_num - 1)

    def forward_prompt(self, x: Tensor, task_id: Any, labels: Optional[Tensor] = None,
                       update_stats: bool = False) -> Tuple[Tensor, Tensor]:
        features = self.experts(self.backbone, x, self._build_task_ids(x.shape[0], task_id, x.device))
        return self.prompt_head(features), features

    def forward_gate(self, x: Tensor, detach_backbone: bool = True, labels: Optional[Tensor] = None,
                     update_stats: bool = False) -> Tuple[Tensor, Tensor]:
        features = self.backbone.forward_features(x)[:, 0]
        h = self.g_mlp(features.detach() if detach_backbone else features)
        return self.g_head(h), h


class SDLoRAQKV(nn.Module):
    """FlyGCL ``models.sdlora.LoRAQKVAdapter``: the frozen ``qkv`` plus, for the query and the value, every
    task's LoRA direction up to ``current_task`` scaled by its learned magnitude (``alpha_q``, ``alpha_v``),
    the earlier tasks' directions frozen. Every sample uses every direction."""

    def __init__(self, qkv: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base_qkv, self.current_task = qkv, 0
        self.A_q = nn.ModuleList([nn.Linear(D, rank, bias=False) for _ in range(E)])
        self.B_q = nn.ModuleList([nn.Linear(rank, D, bias=False) for _ in range(E)])
        self.A_v = nn.ModuleList([nn.Linear(D, rank, bias=False) for _ in range(E)])
        self.B_v = nn.ModuleList([nn.Linear(rank, D, bias=False) for _ in range(E)])
        self.alpha_q = nn.ParameterList([nn.Parameter(torch.ones(1)) for _ in range(E)])
        self.alpha_v = nn.ParameterList([nn.Parameter(torch.ones(1)) for _ in range(E)])

    def set_task_trainable(self, task: int) -> None:
        for name in ("A_q", "B_q", "A_v", "B_v", "alpha_q", "alpha_v"):
            for t, part in enumerate(getattr(self, name)):
                part.requires_grad_(t == task)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.base_qkv(x).chunk(3, dim=-1)
        for t in range(self.current_task + 1):
            q = q + self.alpha_q[t] * self.B_q[t](self.A_q[t](x))
            v = v + self.alpha_v[t] * self.B_v[t](self.A_v[t](x))
        return torch.cat([q, k, v], dim=-1)


class FlyGCLSDLoRA(nn.Module):
    """FlyGCL ``models.sdlora.SDLoRAModel``: ``forward(inputs, **kwargs)`` (keywords ignored) runs the
    backbone with every task's directions up to ``task_count``; classifier ``backbone.fc``;
    ``process_task_count()`` advances ``task_count`` (capped at ``task_num - 1``)."""

    def __init__(self) -> None:
        super().__init__()
        self.task_num, self.task_count = E, 0
        self.backbone = classifier_backbone(fc=True)
        torch.manual_seed(14)
        self.lora_layers = []
        for block in self.backbone.blocks[:2]:
            block.attn.qkv = SDLoRAQKV(block.attn.qkv)
            self.lora_layers.append(block.attn.qkv)
        self._set_active_task()

    def _set_active_task(self) -> None:
        for layer in self.lora_layers:
            layer.current_task = self.task_count
            layer.set_task_trainable(self.task_count)

    def forward(self, inputs: Tensor, **kwargs: Any) -> Tensor:
        self._set_active_task()
        return self.backbone.fc(self.backbone.forward_features(inputs)[:, 0])

    def process_task_count(self) -> None:
        if self.task_count + 1 < self.task_num:
            self.task_count += 1
