"""Small stand-ins of the upstream prompt-CL codebases, for the adapter tests.

Written for these tests from each codebase's public interface: the attribute names, the call
signatures (``**kwargs`` included, since the adapters check them) and the per-batch calls of its
training and evaluation loops, as read in the repositories named in ``docs/adapters.md``. Internals
are minimal (prompt tuning everywhere, no positional embedding for prompts). Nothing upstream is
imported or copied. Quirks the adapters must handle are reproduced on purpose and marked ``quirk``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

D, C, E = 32, 5, 2
VIT_KW = dict(img_size=32, patch_size=8, embed_dim=D, depth=4, num_heads=2)


def vit(num_classes: int = 0, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    # The class itself rather than create_model: timm 0.6.12 (the official FlyPrompt pin) cannot
    # override a registered model's patch size, and these tests also run there.
    model = VisionTransformer(num_classes=num_classes, **VIT_KW)
    return model.requires_grad_(False).eval()


class FcViT(VisionTransformer):
    """The ViT vendored by FlyGCL / MISA names its classifier ``fc``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fc = self.head
        del self.head

    def get_classifier(self) -> nn.Module:
        return self.fc


def embed(backbone: nn.Module, x: Tensor) -> Tensor:
    return backbone._pos_embed(backbone.patch_embed(x))


def prompted_blocks(backbone: nn.Module, tokens: Tensor, prompts: Dict[int, Tensor]) -> Tensor:
    """Prepend ``prompts[i]`` (B, L, D) before block ``i`` and drop their outputs after it."""
    for i, block in enumerate(backbone.blocks):
        extra = prompts.get(i)
        tokens = block(tokens) if extra is None else block(torch.cat([extra, tokens], dim=1))[:, extra.shape[1]:]
    return backbone.norm(tokens)


def classifier_backbone(fc: bool) -> nn.Module:
    """A frozen ViT with a trainable classifier named ``fc`` (FlyGCL, MISA) or ``head`` (timm, Si-Blurry)."""
    torch.manual_seed(0)
    backbone = (FcViT(num_classes=C, **VIT_KW) if fc else vit(num_classes=C)).requires_grad_(False)
    backbone.get_classifier().requires_grad_(True)
    return backbone


class Original(nn.Module):
    """JH-LEE / HiDe ``original_model``: a frozen ViT returning a dict with ``pre_logits`` (and a TII head)."""

    def __init__(self) -> None:
        super().__init__()
        self.vit = vit(seed=5)
        torch.manual_seed(6)
        self.head = nn.Linear(D, C)

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        features = self.vit(x)
        return {"pre_logits": features, "logits": self.head(features)}


# ------------------------------------------------------------------ JH-LEE l2p- / dualprompt-pytorch
class JLPrompt(nn.Module):
    """``prompt.Prompt``: ``prompt`` (pool, len, D), ``prompt_key`` (pool, D), ``top_k``;
    ``forward(x_embed, prompt_mask=None, cls_features=None)``; ``prompt_mask`` *is* the selection."""

    def __init__(self, pool_size: int, length: int, top_k: int, layers: Optional[int] = None,
                 batchwise_prompt: bool = False) -> None:
        super().__init__()
        self.pool_size, self.length, self.top_k, self.embedding_key = pool_size, length, top_k, "cls"
        self.batchwise_prompt = batchwise_prompt
        shape = (pool_size, length, D) if layers is None else (layers, pool_size, length, D)
        self.prompt = nn.Parameter(torch.empty(shape).uniform_(-1, 1))
        self.prompt_key = nn.Parameter(torch.empty(pool_size, D).uniform_(-1, 1))

    def forward(self, x_embed: Tensor, prompt_mask: Optional[Tensor] = None, cls_features: Optional[Tensor] = None):
        query = cls_features if cls_features is not None else x_embed.max(dim=1)[0]
        similarity = F.normalize(query, dim=-1) @ F.normalize(self.prompt_key, dim=-1).t()
        if prompt_mask is None:
            idx = similarity.topk(self.top_k, dim=1).indices
            if self.batchwise_prompt:  # the batch's most frequent keys (only without prompt_mask)
                ids, counts = idx.unique(return_counts=True)
                idx = ids[counts.topk(min(self.top_k, ids.numel())).indices].expand(x_embed.shape[0], -1)
        else:
            idx = prompt_mask
        out = {"prompt_idx": idx, "similarity": similarity}
        if self.prompt.ndim == 3:  # L2P: shallow, prepended to the patch embeddings
            prompts = self.prompt[idx].flatten(1, 2)
            out.update(total_prompt_len=prompts.shape[1], prompted_embedding=torch.cat([prompts, x_embed], dim=1))
        else:  # DualPrompt E-prompt: one group of tokens per prompt layer
            out["batched_prompt"] = self.prompt[:, idx].flatten(2, 3)
        return out


class JLL2P(nn.Module):
    """l2p-pytorch ``VisionTransformer``: ``prompt``, ``head``, ``forward(x, task_id=-1, cls_features=None,
    train=False)``; its engine passes ``cls_features = original_model(x)["pre_logits"]``."""

    def __init__(self) -> None:
        super().__init__()
        self.vit = vit()
        torch.manual_seed(1)
        self.prompt = JLPrompt(pool_size=6, length=2, top_k=2, batchwise_prompt=True)
        self.head = nn.Linear(D, C)

    def get_classifier(self) -> nn.Module:
        return self.head

    def forward(self, x: Tensor, task_id: int = -1, cls_features: Optional[Tensor] = None, train: bool = False):
        res = self.prompt(self.vit.patch_embed(x), prompt_mask=None, cls_features=cls_features)
        cls = self.vit.cls_token.expand(x.shape[0], -1, -1)
        tokens = self.vit.norm(self.vit.blocks(torch.cat([cls, res["prompted_embedding"]], dim=1)))
        res["pre_logits"] = tokens[:, 1 : 1 + res["total_prompt_len"]].mean(dim=1)
        res["logits"] = self.head(res["pre_logits"])
        return res


class JLDualPrompt(nn.Module):
    """dualprompt-pytorch: ``g_prompt``, ``e_prompt`` (EPrompt), ``head``, ``use_prompt_mask``: in training
    task ``t`` uses slots ``[t*top_k, (t+1)*top_k)`` (the loop passes ``task_id``)."""

    def __init__(self) -> None:
        super().__init__()
        self.vit = vit()
        torch.manual_seed(2)
        self.g_prompt_layer_idx, self.e_prompt_layer_idx = (0, 1), (2, 3)
        self.g_prompt = nn.Parameter(torch.empty(2, 2, D).uniform_(-1, 1))
        self.head = nn.Linear(D, C)  # before e_prompt: remove() must keep the children's order
        self.e_prompt = JLPrompt(pool_size=4, length=2, top_k=1, layers=2)
        self.use_prompt_mask = True

    def forward(self, x: Tensor, task_id: int = -1, cls_features: Optional[Tensor] = None, train: bool = False):
        tokens = embed(self.vit, x)
        prompt_mask = None
        if self.use_prompt_mask and train:
            k = self.e_prompt.top_k
            prompt_mask = torch.arange(task_id * k, (task_id + 1) * k).unsqueeze(0).expand(x.shape[0], -1)
        res = self.e_prompt(tokens, prompt_mask=prompt_mask, cls_features=cls_features)
        prompts = {i: self.g_prompt[j].expand(x.shape[0], -1, -1) for j, i in enumerate(self.g_prompt_layer_idx)}
        prompts.update({i: res["batched_prompt"][j] for j, i in enumerate(self.e_prompt_layer_idx)})
        res["pre_logits"] = prompted_blocks(self.vit, tokens, prompts)[:, 0]
        res["logits"] = self.head(res["pre_logits"])
        return res


class JLPrefixEPrompt(nn.Module):
    """dualprompt-pytorch ``EPrompt`` with ``use_prefix_tune_for_e_prompt`` (also Mammoth's, PILOT's, and
    HiDe-Prompt's / NoRGa's copies): ``prompt`` ``(layers, 2, pool, length, heads, head_dim)``, key/value
    halves at index 0/1. quirk: ``batched_prompt`` is the ``(layers, 2, B, top_k, length, ...)`` gather
    *reshaped* to ``(layers, B, 2, top_k * length, ...)`` without moving the batch axis, as upstream; with
    ``per_sample=True`` the axis is moved (what each sample's prompt should be)."""

    def __init__(self, pool_size: int, length: int, layers: int, heads: int = 2, per_sample: bool = False) -> None:
        super().__init__()
        self.pool_size, self.length, self.top_k, self.embedding_key = pool_size, length, 1, "cls"
        self.batchwise_prompt, self.per_sample = False, per_sample
        self.prompt = nn.Parameter(torch.empty(layers, 2, pool_size, length, heads, D // heads).uniform_(-1, 1))
        self.prompt_key = nn.Parameter(torch.empty(pool_size, D).uniform_(-1, 1))

    def forward(self, x_embed: Tensor, prompt_mask: Optional[Tensor] = None, cls_features: Optional[Tensor] = None):
        query = cls_features if cls_features is not None else x_embed.max(dim=1)[0]
        similarity = F.normalize(query, dim=-1) @ F.normalize(self.prompt_key, dim=-1).t()
        idx = similarity.topk(self.top_k, dim=1).indices if prompt_mask is None else prompt_mask
        raw = self.prompt[:, :, idx]  # (layers, 2, B, top_k, length, heads, head_dim)
        layers, dual, batch, top_k, length, heads, head_dim = raw.shape
        if self.per_sample:
            raw = raw.transpose(1, 2)
        batched = raw.reshape(layers, batch, dual, top_k * length, heads, head_dim)
        return {"prompt_idx": idx, "similarity": similarity, "batched_prompt": batched}


class JLPrefixDualPrompt(JLDualPrompt):
    """``JLDualPrompt`` with the prefix E-prompt pool; a layer's prefix enters as the tokens
    ``key + 2 * value`` (minimal internals: both halves act, the attention is the block's own)."""

    def __init__(self, per_sample: bool = False) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.e_prompt = JLPrefixEPrompt(pool_size=4, length=2, layers=2, per_sample=per_sample)

    def forward(self, x: Tensor, task_id: int = -1, cls_features: Optional[Tensor] = None, train: bool = False):
        tokens = embed(self.vit, x)
        prompt_mask = None
        if self.use_prompt_mask and train:
            prompt_mask = torch.full((x.shape[0], 1), task_id, dtype=torch.long)
        res = self.e_prompt(tokens, prompt_mask=prompt_mask, cls_features=cls_features)
        prefix = res["batched_prompt"]  # (layers, B, 2, length, heads, head_dim)
        prompts = {i: self.g_prompt[j].expand(x.shape[0], -1, -1) for j, i in enumerate(self.g_prompt_layer_idx)}
        layers = enumerate(self.e_prompt_layer_idx)
        prompts.update({i: (prefix[j, :, 0] + 2 * prefix[j, :, 1]).flatten(-2) for j, i in layers})
        res["pre_logits"] = prompted_blocks(self.vit, tokens, prompts)[:, 0]
        res["logits"] = self.head(res["pre_logits"])
        return res


def jhlee_forward(model: nn.Module, original: nn.Module, x: Tensor, task_id: int,
                  cls_features: Optional[Tensor] = None) -> Dict[str, Tensor]:
    """One call of the JH-LEE engines (training and evaluation): the frozen model's ``pre_logits`` as
    ``cls_features``, then ``model(x, task_id=..., cls_features=..., train=model.training)``."""
    if cls_features is None:
        with torch.no_grad():
            cls_features = original(x)["pre_logits"]
    return model(x, task_id=task_id, cls_features=cls_features, train=model.training)


# ------------------------------------------------------- Si-Blurry lineage key pools (Prompt class)
class KeyPool(nn.Module):
    """FlyGCL ``Prompt``: ``key`` (pool, D), ``prompts`` (pool, len, D), ``counter``;
    ``forward(query, s=None, e=None, **kwargs)`` matches ``key[s:e]`` and returns
    ``(similarity, prompts[i + s])`` (B, k, len, D), recording ``last_selected_indices`` / ``last_topk``."""

    global_index = True

    def __init__(self, pool_size: int, selection_size: int, prompt_len: int) -> None:
        super().__init__()
        self.pool_size, self.selection_size, self.prompt_len = pool_size, selection_size, prompt_len
        self._batchwise_selection = False
        self.key = nn.Parameter(torch.empty(pool_size, D).uniform_(-1, 1))
        self.prompts = nn.Parameter(torch.empty(pool_size, prompt_len, D).uniform_(-1, 1))
        self.register_buffer("counter", torch.zeros(pool_size))

    def forward(self, query: Tensor, s: Optional[int] = None, e: Optional[int] = None, **kwargs: Any):
        keys = self.key if s is None else self.key[s:e]
        match = 1 - F.cosine_similarity(query.unsqueeze(1), keys, dim=-1)
        topk = match.topk(self.selection_size, dim=-1, largest=False).indices
        index = topk + s if s is not None and self.global_index else topk
        self.record(topk, index)
        self.counter += torch.bincount(index.reshape(-1), minlength=self.pool_size)
        return match.gather(1, topk), self.prompts[index]

    def record(self, topk: Tensor, index: Tensor) -> None:
        self.last_topk, self.last_selected_indices = topk.detach(), index.detach()


class MISAKeyPool(KeyPool):
    """MISA ``Prompt``: FlyGCL's signature, but ``prompts[i]`` for the slice-local ``i`` (quirk) and no record."""

    global_index = False

    def record(self, topk: Tensor, index: Tensor) -> None:
        pass


class SiBlurryKeyPool(MISAKeyPool):
    """Si-Blurry ``Prompt``: ``forward(query, **kwargs)``: always the whole pool (quirk: no slot range)."""

    def forward(self, query: Tensor, **kwargs: Any):
        return super().forward(query)


def _frozen_query(backbone: nn.Module, inputs: Tensor) -> Tensor:
    with torch.no_grad():
        return backbone.forward_features(inputs)[:, 0]


class KeyPoolDualPrompt(nn.Module):
    """The Si-Blurry-lineage ``DualPrompt``: ``backbone``, ``e_prompt`` (a :class:`KeyPool`), ``g_prompt``,
    ``task_num``, ``num_pt_per_task``, ``loss_fn``; ``forward(inputs)`` takes the images only and trains
    the slots of step :meth:`step` (``e_prompt(query, s, e)``), inferring with ``e_prompt(query)``."""

    pool_class = KeyPool
    classifier_fc = True
    slots_per_step = 2

    def __init__(self, pool_class: Optional[type] = None) -> None:
        super().__init__()
        self.backbone = classifier_backbone(fc=self.classifier_fc)
        torch.manual_seed(3)
        self.task_num, self.num_pt_per_task = E, self.slots_per_step
        self.g_prompt = KeyPool(1, 1, 4)
        self.e_prompt = (pool_class or self.pool_class)(E * self.num_pt_per_task, 1, 4)
        self.used_prompts: Optional[Tensor] = None

    def step(self) -> Optional[int]:
        raise NotImplementedError

    def query(self, inputs: Tensor) -> Tensor:
        return _frozen_query(self.backbone, inputs)

    def forward(self, inputs: Tensor) -> Tensor:
        query = self.query(inputs)
        step = self.step()
        if self.training and step is not None and step * self.num_pt_per_task < self.e_prompt.pool_size:
            start, end = step * self.num_pt_per_task, (step + 1) * self.num_pt_per_task
            similarity, e_prompts = self.e_prompt(query, s=start, e=end)
        else:
            similarity, e_prompts = self.e_prompt(query)
        self.similarity = similarity.mean()
        self.used_prompts = e_prompts.detach()  # test-only observation of the selection
        g = self.g_prompt.prompts[0].expand(inputs.shape[0], -1, -1)
        e = e_prompts[:, 0]
        prompts = {0: g[:, :2], 1: g[:, 2:], 2: e[:, :2], 3: e[:, 2:]}
        cls = prompted_blocks(self.backbone, embed(self.backbone, inputs), prompts)[:, 0]
        return self.backbone.get_classifier()(cls)

    def loss_fn(self, output: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(output, target) + 0.1 * self.similarity


class FlyGCLDualPrompt(KeyPoolDualPrompt):
    """FlyGCL: step counter ``task_count``, moved by ``process_task_count()`` (its trainer calls it)."""

    def __init__(self) -> None:
        super().__init__()
        self.task_count = 0

    def step(self) -> int:
        return self.task_count

    def process_task_count(self) -> None:
        self.task_count += 1


class MISADualPrompt(KeyPoolDualPrompt):
    """MISA: step counter ``task_id``, incremented by its trainer at each task end (:meth:`online_after_task`);
    its ``Prompt`` returns slice-local prompts (``fixed_gather=True``: a copy patched to ``prompts[i + s]``)."""

    def __init__(self, fixed_gather: bool = False) -> None:
        super().__init__(KeyPool if fixed_gather else MISAKeyPool)
        self.task_id = 0

    def step(self) -> int:
        return self.task_id

    def online_after_task(self) -> None:
        self.task_id += 1


class SiBlurryDualPrompt(KeyPoolDualPrompt):
    """Si-Blurry: classifier ``head``, one slot per task, ``task_id = -1`` never read, ``e_prompt(query)`` always."""

    pool_class = SiBlurryKeyPool
    classifier_fc = False
    slots_per_step = 1

    def __init__(self) -> None:
        super().__init__()
        self.task_id = -1

    def step(self) -> None:
        return None


class FlyGCLL2P(nn.Module):
    """FlyGCL ``L2P``: ``backbone`` (classifier ``fc``), ``prompt`` (a FlyGCL :class:`KeyPool`, top-k over
    the whole pool in training and inference), ``selection_size``, ``loss_fn``."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = classifier_backbone(fc=True)
        torch.manual_seed(8)
        self.selection_size, self.prompt_len = 2, 2
        self.prompt = KeyPool(6, self.selection_size, self.prompt_len)

    def query(self, inputs: Tensor) -> Tensor:
        return _frozen_query(self.backbone, inputs)

    def forward(self, inputs: Tensor) -> Tensor:
        query = self.query(inputs)
        similarity, prompts = self.prompt(query)
        self.used_prompts = prompts.detach()  # test-only observation of the selection
        self.similarity = similarity.mean()
        tokens = embed(self.backbone, inputs)
        tokens = torch.cat([tokens[:, :1], prompts.flatten(1, 2), tokens[:, 1:]], dim=1)
        tokens = self.backbone.norm(self.backbone.blocks(tokens))
        return self.backbone.fc(tokens[:, 1 : 1 + self.selection_size * self.prompt_len].mean(dim=1))

    def loss_fn(self, output: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(output, target) + 0.5 * self.similarity


# ------------------------------------------------------------------------------------------- MVP
class MVP(nn.Module):
    """MVP: ``backbone``, ``e_prompts``, keys ``key`` / class mask ``mask`` (FlyGCL ``learnable_key`` /
    ``learnable_mask``, classifier ``fc``, ``task_count``/``process_task_count``), ``count``,
    ``use_last_layer``, ``use_contrastiv``, ``use_mask``, ``selection_size``,
    ``forward_features(inputs, **kwargs) -> (feature, mask)``, ``forward_head``, ``loss_fn``."""

    def __init__(self, flygcl: bool, use_last_layer: bool = True) -> None:
        super().__init__()
        self.backbone = classifier_backbone(fc=flygcl)
        torch.manual_seed(4)
        self.key_name, self.mask_name = ("learnable_key", "learnable_mask") if flygcl else ("key", "mask")
        setattr(self, self.key_name, nn.Parameter(torch.randn(E, D)))
        setattr(self, self.mask_name, nn.Parameter(torch.zeros(E, C) - 1))
        self.e_prompts = nn.Parameter(torch.randn(E, 4, D))
        self.register_buffer("count", torch.zeros(E))
        self.selection_size = 1
        self.use_last_layer, self.use_contrastiv, self.use_mask = use_last_layer, True, True

    def forward_features(self, inputs: Tensor, **kwargs: Any) -> Tuple[Tensor, Tensor]:
        self.backbone.eval()  # as upstream: the module holding the classifier is in eval mode during training too
        with torch.no_grad():
            tokens = embed(self.backbone, inputs)
            query = tokens.clone()
            for n, block in enumerate(self.backbone.blocks):
                if n == len(self.backbone.blocks) - 1 and not self.use_last_layer:
                    break
                query = block(query)
            query = query[:, 0]
        distance = 1 - F.cosine_similarity(query.unsqueeze(1), getattr(self, self.key_name), dim=-1)
        scaled = distance * (self.count + 1) if self.use_contrastiv else distance
        topk = scaled.topk(self.selection_size, dim=1, largest=False)[1]
        self.selected = topk[:, 0]  # test-only observation of the selection
        self.similarity_loss = distance.gather(1, topk).mean()
        mask = getattr(self, self.mask_name)[topk].mean(1)
        if self.training:
            with torch.no_grad():
                self.count += topk.view(-1).bincount(minlength=E)
        e = self.e_prompts[topk[:, 0]]
        feature = prompted_blocks(self.backbone, tokens, {2: e[:, :2], 3: e[:, 2:]})[:, 0]
        return feature, torch.sigmoid(mask) * 2.0

    def forward_head(self, feature: Tensor, **kwargs: Any) -> Tensor:
        return self.backbone.get_classifier()(self.backbone.fc_norm(feature))

    def forward(self, inputs: Tensor, **kwargs: Any) -> Tensor:
        feature, mask = self.forward_features(inputs)
        logits = self.forward_head(feature)
        return logits * mask if self.use_mask else logits

    def loss_fn(self, output: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(output, target) + self.similarity_loss


class FlyGCLMVP(MVP):
    """FlyGCL's MVP: ``learnable_key`` / ``learnable_mask``, classifier ``fc``, ``task_count`` moved by
    ``process_task_count()`` (read only by its optional gate at evaluation)."""

    def __init__(self, use_last_layer: bool = True) -> None:
        super().__init__(flygcl=True, use_last_layer=use_last_layer)
        self.task_count = 0

    def process_task_count(self) -> None:
        self.task_count += 1


# ---------------------------------------------------------------------- HiDe-Prompt / NoRGa
class HDEPrompt(nn.Module):
    """Official ``EPrompt``: ``forward(x_embed, prompt_mask=None, prompt_idx=None, prompt_weight=None,
    prompt_momentum=0)``; ``prompt_mask`` wins over ``prompt_idx``; ``batchwise_prompt`` replaces
    ``prompt_idx`` by the batch's most frequent ids."""

    def __init__(self, layers: int, pool_size: int, length: int, gated: bool) -> None:
        super().__init__()
        self.pool_size, self.top_k, self.batchwise_prompt = pool_size, 1, False
        self.prompt = nn.Parameter(0.02 * torch.randn(layers, pool_size, length, D))
        self.prompt_key = nn.Parameter(torch.empty(pool_size, D).uniform_(-1, 1))
        if gated:  # NoRGa
            self.act_scale = nn.Parameter(torch.ones(layers, 2, 1, 1))

    def forward(self, x_embed, prompt_mask=None, prompt_idx=None, prompt_weight=None, prompt_momentum=0):
        assert prompt_mask is not None or prompt_idx is not None or prompt_weight is not None
        idx = prompt_idx
        if self.batchwise_prompt and prompt_idx is not None:
            ids, counts = prompt_idx.unique(return_counts=True)
            idx = ids[counts.argmax()].expand(x_embed.shape[0], 1)
        if prompt_mask is not None:
            idx = prompt_mask
        return {"prompt_idx": idx, "batched_prompt": self.prompt[:, idx].flatten(2, 3)}


class HDModel(nn.Module):
    """Official HiDe/NoRGa ViT: ``e_prompt``, ``head``, ``forward(x, task_id=-1, prompt_id=None,
    prompt_weight=None, train=False, fc_only=False, prompt_momentum=0)`` returning a dict; with
    ``use_prompt_mask`` and ``train`` the prompt of ``task_id`` is used."""

    def __init__(self, gated: bool = False) -> None:
        super().__init__()
        self.vit = vit()
        torch.manual_seed(7)
        self.e_prompt = HDEPrompt(2, E, 2, gated)
        self.head = nn.Linear(D, C)
        self.use_prompt_mask = True

    def forward(self, x, task_id=-1, prompt_id=None, prompt_weight=None, train=False, fc_only=False, prompt_momentum=0):
        if fc_only:
            return {"logits": self.head(x)}
        tokens = embed(self.vit, x)
        prompt_mask = None
        if self.use_prompt_mask and train:
            prompt_mask = torch.full((x.shape[0], 1), task_id, dtype=torch.long)
        res = self.e_prompt(tokens, prompt_mask=prompt_mask, prompt_idx=prompt_id, prompt_weight=prompt_weight,
                            prompt_momentum=prompt_momentum)
        features = prompted_blocks(self.vit, tokens, {0: res["batched_prompt"][0], 1: res["batched_prompt"][1]})[:, 0]
        res.update(pre_logits=features, features=features, logits=self.head(features))
        return res


class HDPrefixEPrompt(HDEPrompt):
    """Official ``EPrompt`` with ``use_prefix_tune_for_e_prompt`` (HiDe-Prompt, NoRGa): ``prompt`` ``(layers, 2,
    pool, length, heads, head_dim)``. quirk: the gather reshaped to ``(layers, B, 2, ...)`` without moving the
    batch axis, as upstream (``JLPrefixEPrompt``)."""

    def __init__(self, layers: int, pool_size: int, length: int, gated: bool, heads: int = 2) -> None:
        super().__init__(layers, pool_size, length, gated)
        self.prompt = nn.Parameter(0.5 * torch.randn(layers, 2, pool_size, length, heads, D // heads))

    def forward(self, x_embed, prompt_mask=None, prompt_idx=None, prompt_weight=None, prompt_momentum=0):
        idx = prompt_mask if prompt_mask is not None else prompt_idx
        raw = self.prompt[:, :, idx]  # (layers, 2, B, 1, length, heads, head_dim)
        layers, dual, batch, top_k, length, heads, head_dim = raw.shape
        return {"prompt_idx": idx, "batched_prompt": raw.reshape(layers, batch, dual, top_k * length, heads, head_dim)}


class HDPrefixModel(HDModel):
    """``HDModel`` with the prefix pool; a layer's prefix enters as the tokens ``key + 2 * value``."""

    def __init__(self, gated: bool = False) -> None:
        super().__init__(gated)
        torch.manual_seed(8)
        self.e_prompt = HDPrefixEPrompt(2, E, 2, gated)

    def forward(self, x, task_id=-1, prompt_id=None, prompt_weight=None, train=False, fc_only=False, prompt_momentum=0):
        tokens = embed(self.vit, x)
        prompt_mask = torch.full((x.shape[0], 1), task_id, dtype=torch.long) if self.use_prompt_mask and train else None
        res = self.e_prompt(tokens, prompt_mask=prompt_mask, prompt_idx=prompt_id)
        prefix = res["batched_prompt"]
        prompts = {j: (prefix[j, :, 0] + 2 * prefix[j, :, 1]).flatten(-2) for j in range(prefix.shape[0])}
        features = prompted_blocks(self.vit, tokens, prompts)[:, 0]
        res.update(pre_logits=features, features=features, logits=self.head(features))
        return res


TASK_OF_CLASS = torch.tensor([0, 0, 0, 1, 1])


def tii_prompt_id(original: nn.Module, x: Tensor) -> Tensor:
    """Task identification of the HiDe/NoRGa engines: the frozen model's class, mapped to its task."""
    with torch.no_grad():
        return TASK_OF_CLASS[original(x)["logits"].argmax(dim=1)].unsqueeze(1)


def hide_train_forward(model: nn.Module, original: nn.Module, x: Tensor, task_id: int) -> Dict[str, Tensor]:
    """HiDe-Prompt's training call: TII through ``original_model`` first, then the model."""
    return model(x, task_id=task_id, prompt_id=tii_prompt_id(original, x), train=True)


def norga_train_forward(model: nn.Module, x: Tensor, task_id: int) -> Dict[str, Tensor]:
    """NoRGa's training call (``norga_prompt_engine.train_one_epoch``): ``prompt_id = task_id`` for every
    sample, and ``original_model`` never runs."""
    prompt_id = torch.full((x.shape[0], 1), task_id, dtype=torch.long)
    return model(x, task_id=task_id, prompt_id=prompt_id, train=True)


def hide_eval_forward(model: nn.Module, original: nn.Module, x: Tensor, task_id: int) -> Dict[str, Tensor]:
    """The HiDe / NoRGa evaluation call: TII through ``original_model``, then the model."""
    return model(x, task_id=task_id, prompt_id=tii_prompt_id(original, x))


# ------------------------------------------------------------------------- generic-adapter models
class TinyRoute(nn.Module):
    """A route module whose ``forward(x, expert=None)`` names the routed keyword."""

    def forward(self, x: Tensor, expert: Optional[Tensor] = None) -> Tensor:
        return x


class UnnamedRoute(nn.Module):
    """A route module whose ``forward(x)`` takes no routed keyword."""

    def forward(self, x: Tensor) -> Tensor:
        return x


class Tiny(nn.Module):
    """``query`` -> ``route`` -> ``head`` on 4 features: the smallest model the generic adapter wires."""

    def __init__(self, route: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.query, self.route, self.head = nn.Linear(4, 4), route or TinyRoute(), nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.route(self.query(x)))
