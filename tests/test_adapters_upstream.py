"""Family adapters on small stand-ins of the upstream codebases.

The stand-ins are written here from the *public* interface of each codebase only (attribute names and
call signatures, the design notes' ecosystem survey, section 5); their internals are deliberately minimal (no
positional embedding for prompts, prompt tuning where the original uses prefixes). Nothing upstream
is imported or copied.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

pytest.importorskip("timm")
from fly_modules.adapters import SeamError, _wiring, generic, retrofit  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

from fly_modules import SampleBudgetSchedule, SessionSchedule  # noqa: E402

D, C, E = 32, 5, 2
VIT_KW = dict(img_size=32, patch_size=8, embed_dim=D, depth=4, num_heads=2)
ROUTER = dict(expansion_dim=128, ridge=1e-4)
VARIANTS = {"baseline": (False, False), "router": (True, False), "ensemble": (False, True), "both": (True, True)}



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


# ------------------------------------------------------------------------- JH-LEE l2p-pytorch
class JLPrompt(nn.Module):
    """l2p-pytorch ``prompt.Prompt``: ``prompt`` (pool, len, D), ``prompt_key`` (pool, D), ``top_k``."""

    def __init__(self, pool_size: int, length: int, top_k: int, layers: Optional[int] = None) -> None:
        super().__init__()
        self.pool_size, self.length, self.top_k, self.embedding_key = pool_size, length, top_k, "cls"
        shape = (pool_size, length, D) if layers is None else (layers, pool_size, length, D)
        self.prompt = nn.Parameter(torch.empty(shape).uniform_(-1, 1))
        self.prompt_key = nn.Parameter(torch.empty(pool_size, D).uniform_(-1, 1))

    def forward(self, x_embed: Tensor, prompt_mask: Optional[Tensor] = None, cls_features: Optional[Tensor] = None):
        query = cls_features if cls_features is not None else x_embed.max(dim=1)[0]
        similarity = F.normalize(query, dim=-1) @ F.normalize(self.prompt_key, dim=-1).t()
        idx = similarity.topk(self.top_k, dim=1).indices if prompt_mask is None else prompt_mask
        out = {"prompt_idx": idx, "similarity": similarity}
        if self.prompt.ndim == 3:  # L2P: shallow, prepended to the patch embeddings
            prompts = self.prompt[idx].flatten(1, 2)
            out.update(total_prompt_len=prompts.shape[1], prompted_embedding=torch.cat([prompts, x_embed], dim=1))
        else:  # DualPrompt E-prompt: one group of tokens per prompt layer
            out["batched_prompt"] = self.prompt[:, idx].flatten(2, 3)
        return out


class JLL2P(nn.Module):
    """l2p-pytorch ``VisionTransformer``: ``prompt``, ``head``, ``forward(x, task_id, cls_features, train)``."""

    def __init__(self) -> None:
        super().__init__()
        self.vit = vit()
        torch.manual_seed(1)
        self.prompt = JLPrompt(pool_size=6, length=2, top_k=2)
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


# --------------------------------------------------------------------- JH-LEE dualprompt-pytorch
class JLDualPrompt(nn.Module):
    """dualprompt-pytorch: ``g_prompt``, ``e_prompt`` (EPrompt), ``head``, ``use_prompt_mask``."""

    def __init__(self) -> None:
        super().__init__()
        self.vit = vit()
        torch.manual_seed(2)
        self.g_prompt_layer_idx, self.e_prompt_layer_idx = (0, 1), (2, 3)
        self.g_prompt = nn.Parameter(torch.empty(2, 2, D).uniform_(-1, 1))
        self.e_prompt = JLPrompt(pool_size=4, length=2, top_k=1, layers=2)
        self.head = nn.Linear(D, C)
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


# --------------------------------------------------------------- Si-Blurry / MISA / FlyGCL DualPrompt
class SBPrompt(nn.Module):
    """Local ``Prompt``: ``key`` (pool, D), ``prompts``; ``forward(query, s=None, e=None)`` matches slots [s:e)."""

    def __init__(self, pool_size: int, selection_size: int, prompt_len: int, dimention: int, record: bool) -> None:
        super().__init__()
        self.pool_size, self.selection_size, self.prompt_len = pool_size, selection_size, prompt_len
        self.key = nn.Parameter(torch.empty(pool_size, dimention).uniform_(-1, 1))
        self.prompts = nn.Parameter(torch.empty(pool_size, prompt_len, dimention).uniform_(-1, 1))
        self.register_buffer("counter", torch.zeros(pool_size))
        self.record = record
        self.last_selected_indices = None

    def forward(self, query: Tensor, s: Optional[int] = None, e: Optional[int] = None, **kwargs: Any):
        keys = self.key if s is None else self.key[s:e]
        match = 1 - F.cosine_similarity(query.unsqueeze(1), keys, dim=-1)
        topk = match.topk(self.selection_size, dim=-1, largest=False).indices
        index = topk if s is None else topk + s
        if self.record:  # FlyGCL records the global indices
            self.last_selected_indices = index.detach()
        self.counter += torch.bincount(index.reshape(-1), minlength=self.pool_size)
        return match.gather(1, topk), self.prompts[index]


class SBDualPrompt(nn.Module):
    """DualPrompt model: ``backbone`` (classifier ``fc`` or ``head``), ``e_prompt``, ``g_prompt``,
    ``task_num``, ``task_count``, ``num_pt_per_task``, ``process_task_count()``, ``loss_fn``."""

    def __init__(self, flygcl: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = (FcViT(num_classes=C, **VIT_KW) if flygcl else vit(num_classes=C)).requires_grad_(False)
        self.classifier_name = "fc" if flygcl else "head"
        getattr(self.backbone, self.classifier_name).requires_grad_(True)
        torch.manual_seed(3)
        self.task_num, self.task_count, self.num_pt_per_task = E, 0, 2
        self.g_prompt = SBPrompt(1, 1, 4, D, record=False)
        self.e_prompt = SBPrompt(E * 2, 1, 4, D, record=flygcl)

    def process_task_count(self) -> None:
        self.task_count += 1

    def query(self, inputs: Tensor) -> Tensor:
        with torch.no_grad():
            return self.backbone.forward_features(inputs)[:, 0]

    def forward(self, inputs: Tensor) -> Tensor:
        query = self.query(inputs)
        start, end = self.task_count * self.num_pt_per_task, (self.task_count + 1) * self.num_pt_per_task
        if self.training:
            _, e_prompts = self.e_prompt(query, s=start, e=end)
        else:
            _, e_prompts = self.e_prompt(query)
        self.used_prompts = e_prompts.detach()  # test-only observation of the selection
        g = self.g_prompt.prompts[0].expand(inputs.shape[0], -1, -1)
        e = e_prompts[:, 0]
        prompts = {0: g[:, :2], 1: g[:, 2:], 2: e[:, :2], 3: e[:, 2:]}
        cls = prompted_blocks(self.backbone, embed(self.backbone, inputs), prompts)[:, 0]
        return getattr(self.backbone, self.classifier_name)(cls)

    def loss_fn(self, output: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(output, target)


# ------------------------------------------------------------------------------ Si-Blurry MVP
class SBMVP(nn.Module):
    """MVP model: ``backbone``, ``e_prompts``, ``key``/``mask`` (FlyGCL ``learnable_key``/``learnable_mask``),
    ``count``, ``use_last_layer``, ``use_contrastiv``, ``use_mask``, ``selection_size``,
    ``forward_features(x) -> (feature, mask)``, ``forward_head``, ``loss_fn``."""

    def __init__(self, flygcl: bool, use_last_layer: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = (FcViT(num_classes=C, **VIT_KW) if flygcl else vit(num_classes=C)).requires_grad_(False)
        self.classifier_name = "fc" if flygcl else "head"
        getattr(self.backbone, self.classifier_name).requires_grad_(True)
        torch.manual_seed(4)
        self.key_name, self.mask_name = ("learnable_key", "learnable_mask") if flygcl else ("key", "mask")
        setattr(self, self.key_name, nn.Parameter(torch.randn(E, D)))
        setattr(self, self.mask_name, nn.Parameter(torch.zeros(E, C) - 1))
        self.e_prompts = nn.Parameter(torch.randn(E, 4, D))
        self.register_buffer("count", torch.zeros(E))
        self.task_count, self.selection_size = 0, 1
        self.use_last_layer, self.use_contrastiv, self.use_mask = use_last_layer, True, True

    def process_task_count(self) -> None:
        self.task_count += 1

    def forward_features(self, inputs: Tensor, **kwargs: Any) -> Tuple[Tensor, Tensor]:
        self.backbone.eval()  # as upstream: the classifier's owner is in eval mode during training too
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
        return getattr(self.backbone, self.classifier_name)(self.backbone.fc_norm(feature))

    def forward(self, inputs: Tensor, **kwargs: Any) -> Tensor:
        feature, mask = self.forward_features(inputs)
        logits = self.forward_head(feature)
        return logits * mask if self.use_mask else logits

    def loss_fn(self, output: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(output, target) + self.similarity_loss


# ---------------------------------------------------------------------- HiDe-Prompt / NoRGa
class HDEPrompt(nn.Module):
    """Official ``EPrompt``: ``forward(x_embed, prompt_mask=None, prompt_idx=None, prompt_weight=None,
    prompt_momentum=0)``; one of the first three selects the prompts."""

    def __init__(self, layers: int, pool_size: int, length: int, gated: bool) -> None:
        super().__init__()
        self.pool_size, self.top_k = pool_size, 1
        self.prompt = nn.Parameter(0.02 * torch.randn(layers, pool_size, length, D))
        self.prompt_key = nn.Parameter(torch.empty(pool_size, D).uniform_(-1, 1))
        if gated:  # NoRGa
            self.act_scale = nn.Parameter(torch.ones(layers, 2, 1, 1))

    def forward(self, x_embed, prompt_mask=None, prompt_idx=None, prompt_weight=None, prompt_momentum=0):
        assert prompt_mask is not None or prompt_idx is not None or prompt_weight is not None
        idx = prompt_mask if prompt_mask is not None else prompt_idx
        return {"prompt_idx": idx, "batched_prompt": self.prompt[:, idx].flatten(2, 3)}


class HDModel(nn.Module):
    """Official HiDe/NoRGa ViT: ``e_prompt``, ``head``, ``forward(x, task_id=-1, prompt_id=None,
    prompt_weight=None, train=False, fc_only=False, prompt_momentum=0)`` returning a dict."""

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


# ============================================================================ the cases
class Case:
    """One codebase: how to build it, call it the codebase's way, and read its selection."""

    method = ""
    schedule = "session"

    def build(self) -> Tuple[nn.Module, Optional[nn.Module]]:
        raise NotImplementedError

    def adapter_kwargs(self, model: nn.Module, original: Optional[nn.Module]) -> Dict[str, Any]:
        return {"num_experts": E}

    def head(self, model: nn.Module) -> Tuple[nn.Module, str]:
        return model, "head"

    def forward(self, model, original, x, *, task: int = 0, query: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """``(logits, selection)``; ``query`` replaces the query features (the router's too)."""
        raise NotImplementedError

    craftable = True

    def expert_of(self, selection: Tensor) -> Tensor:
        raise NotImplementedError

    def bank_of(self, selection: Tensor, handle) -> Tensor:
        raise NotImplementedError

    def check_routed(self, model, selection: Tensor, experts: Tensor, query: Tensor) -> None:
        assert torch.equal(self.expert_of(selection), experts)

    def train_loss(self, model, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits, y)

    def transform(self, model, selection: Tensor) -> Optional[Tensor]:
        return None


class JLL2PCase(Case):
    method = "l2p"

    def __init__(self, query_module: bool = False) -> None:
        # query_module: the router reads original_model's output through a hook instead of the
        # prompt call's cls_features (so crafted cls_features no longer reach the router)
        self.query_module, self.craftable = query_module, not query_module

    def build(self):
        return JLL2P(), Original()

    def adapter_kwargs(self, model, original):
        return {"num_experts": E, **({"query_module": original} if self.query_module else {})}

    def router_features(self, model, original, x):
        with torch.no_grad():
            return original(x)["pre_logits"]

    def forward(self, model, original, x, *, task=0, query=None):
        cls = original(x)["pre_logits"] if query is None else query
        out = model(x, task_id=task, cls_features=cls, train=model.training)
        return out["logits"], out["prompt_idx"]

    def expert_of(self, selection):
        return (selection[:, 0] // 3).clamp(max=E - 1)

    bank_of = lambda self, selection, handle: self.expert_of(selection)  # noqa: E731

    def check_routed(self, model, selection, experts, query):
        keys = model.prompt.prompt_key
        for b, expert in enumerate(experts.tolist()):
            similarity = F.normalize(query[b], dim=0) @ F.normalize(keys[3 * expert : 3 * expert + 3], dim=1).t()
            assert selection[b].tolist() == (similarity.topk(2).indices + 3 * expert).tolist()


class JLDualPromptCase(Case):
    method = "dualprompt"

    def build(self):
        return JLDualPrompt(), Original()

    def forward(self, model, original, x, *, task=0, query=None):
        cls = original(x)["pre_logits"] if query is None else query
        out = model(x, task_id=task, cls_features=cls, train=model.training)
        return out["logits"], out["prompt_idx"]

    def expert_of(self, selection):  # use_prompt_mask: task t owns slot t (top_k = 1)
        return selection[:, 0]

    def bank_of(self, selection, handle):
        return selection[:, 0]


class SBDualPromptCase(Case):
    method = "dualprompt"
    schedule = "budget"

    def __init__(self, flygcl: bool, method: str = "dualprompt") -> None:
        self.flygcl, self.method = flygcl, method

    def build(self):
        return SBDualPrompt(self.flygcl), None

    def adapter_kwargs(self, model, original):
        return {}  # num_experts from task_num, slots from num_pt_per_task

    def head(self, model):
        return model.backbone, model.classifier_name

    def forward(self, model, original, x, *, task=0, query=None):
        if query is not None:
            model.query = lambda inputs: query
        try:
            logits = model(x)
        finally:
            vars(model).pop("query", None)
        prompts = model.e_prompt.prompts.detach()
        used = model.used_prompts[:, 0]
        slots = torch.stack([(prompts == row).flatten(1).all(dim=1).nonzero()[0, 0] for row in used])
        return logits, slots

    def expert_of(self, selection):
        return selection // 2

    def bank_of(self, selection, handle):
        return selection

    def check_routed(self, model, selection, experts, query):
        super().check_routed(model, selection, experts, query)
        for b, expert in enumerate(experts.tolist()):
            match = 1 - F.cosine_similarity(query[b : b + 1], model.e_prompt.key[2 * expert : 2 * expert + 2], dim=-1)
            assert int(selection[b]) == 2 * expert + int(match.argmin())


class MVPCase(Case):
    method = "mvp"
    schedule = "budget"
    craftable = False

    def __init__(self, flygcl: bool, use_last_layer: bool = True) -> None:
        self.flygcl, self.use_last_layer = flygcl, use_last_layer

    def build(self):
        return SBMVP(self.flygcl, self.use_last_layer), None

    def adapter_kwargs(self, model, original):
        return {}

    def head(self, model):
        return model.backbone, model.classifier_name

    def forward(self, model, original, x, *, task=0, query=None):
        logits = model(x)
        return logits, model.selected

    def router_features(self, model, original, x):
        """What the adapter feeds the router: final-norm class token of the query pass."""
        with torch.no_grad():
            return model.backbone.forward_features(x)[:, 0]

    def expert_of(self, selection):
        return selection

    def bank_of(self, selection, handle):
        return selection

    def train_loss(self, model, logits, y):
        return model.loss_fn(logits, y)

    def transform(self, model, selection):
        return 2 * torch.sigmoid(getattr(model, model.mask_name)[selection])


class HiDeCase(Case):
    method = "hide"
    task_of_class = torch.tensor([0, 0, 0, 1, 1])

    def __init__(self, method: str = "hide", use_generic: bool = False) -> None:
        self.method, self.use_generic = ("generic" if use_generic else method), use_generic
        self.gated = method == "norga"

    def build(self):
        return HDModel(gated=self.gated), Original()

    def adapter_kwargs(self, model, original):
        if not self.use_generic:
            return {"num_experts": E, "original_model": original}
        return dict(
            num_experts=E, query_module=original, query_from_output=lambda out: out["pre_logits"],
            route_module=model.e_prompt, route_kwarg="prompt_idx",
            route_value=lambda experts, module, args, kwargs: experts.unsqueeze(1),
            head_owner=model, head_name="head", bank_from_output=lambda out: out["prompt_idx"][:, 0],
        )

    def forward(self, model, original, x, *, task=0, query=None):
        if query is not None:  # the TII model's features are the router's
            real = original.forward
            original.forward = lambda images: {**real(images), "pre_logits": query}
        try:
            tii = original(x)
        finally:
            vars(original).pop("forward", None)
        prompt_id = self.task_of_class[tii["logits"].argmax(dim=1)].unsqueeze(1)
        out = model(x, task_id=task, prompt_id=prompt_id, train=model.training)
        return out["logits"], out["prompt_idx"][:, 0]

    def expert_of(self, selection):
        return selection

    def bank_of(self, selection, handle):
        return selection if not handle.model.training else torch.full_like(selection, handle.current_expert)


class GenericDefaultBanksCase(HiDeCase):
    """Generic seams without ``bank_from_output``: banks = routed experts, else the active bank."""

    def __init__(self) -> None:
        super().__init__(use_generic=True)

    def adapter_kwargs(self, model, original):
        kwargs = super().adapter_kwargs(model, original)
        del kwargs["bank_from_output"], kwargs["head_owner"], kwargs["head_name"]
        return kwargs

    def bank_of(self, selection, handle):
        if handle.model.training:
            return torch.full_like(selection, handle.current_expert)
        return selection if handle.routing_active() else torch.full_like(selection, handle.ensemble.active_expert)


CASES = {
    "jhlee-l2p": JLL2PCase(),
    "jhlee-l2p-query-module": JLL2PCase(query_module=True),
    "jhlee-dualprompt": JLDualPromptCase(),
    "flygcl-dualprompt": SBDualPromptCase(flygcl=True),
    "misa": SBDualPromptCase(flygcl=False, method="misa"),
    "siblurry-mvp": MVPCase(flygcl=False),
    "flygcl-mvp": MVPCase(flygcl=True, use_last_layer=False),
    "hide": HiDeCase("hide"),
    "norga": HiDeCase("norga"),
    "generic": HiDeCase(use_generic=True),
    "generic-default-banks": GenericDefaultBanksCase(),
}


def build(case: Case):
    model, original = case.build()
    return model, original


def adapt(case: Case, model, original, **kwargs):
    kwargs = {**case.adapter_kwargs(model, original), **ROUTER, **kwargs}
    if case.method == "generic":
        return generic.retrofit(model, **kwargs)
    return retrofit(model, case.method, **kwargs)


def batch(seed: int = 1, n: int = 8, shift: float = 0.0) -> Tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=gen) + shift, torch.randint(0, C, (n,), generator=gen)


def hook_counts(*modules: Optional[nn.Module]):
    return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for module in modules if module is not None
            for m in module.modules()]


def trainable(model: nn.Module):
    return [p for p in model.parameters() if p.requires_grad]


# ================================================================================== tests
@pytest.mark.parametrize("name", list(CASES))
def test_baseline_variant_is_bit_identical(name):
    case = CASES[name]
    model, original = build(case)
    reference = copy.deepcopy(model)
    before = hook_counts(model, original)
    adapt(case, model, original, router=False, ensemble=False)
    assert hook_counts(model, original) == before
    x, _ = batch()
    for mode in (True, False):
        model.train(mode), reference.train(mode)
        got, want = case.forward(model, original, x), case.forward(reference, original, x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _clusters(n: int, seed: int) -> Tuple[Tensor, Tensor]:
    direction = F.normalize(torch.randn(D, generator=torch.Generator().manual_seed(0)), dim=0)
    gen = torch.Generator().manual_seed(seed)
    return 0.1 * torch.randn(n, D, generator=gen) + 3 * direction, 0.1 * torch.randn(n, D, generator=gen) - 3 * direction


@pytest.mark.parametrize("name", list(CASES))
def test_router_picks_the_inference_selection_and_leaves_training_alone(name):
    case = CASES[name]
    model, original = build(case)
    reference = copy.deepcopy(model)
    handle = adapt(case, model, original, router=True, ensemble=False)
    x, _ = batch(n=4)
    model.train(), reference.train()
    got, want = case.forward(model, original, x), case.forward(reference, original, x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    handle.end_batch()
    assert handle.router.num_samples == 4
    handle.router.reset_statistics()
    expected = torch.tensor([0, 1, 1, 0])
    if case.craftable:
        zero, one = _clusters(16, seed=1)
        handle.router.update(zero, 0)
        handle.router.update(one, 1)
        probe_zero, probe_one = _clusters(2, seed=2)
        query = torch.stack([probe_zero[0], probe_one[0], probe_one[1], probe_zero[1]])
    else:
        features = case.router_features(model, original, x)
        handle.router.update(features, expected)
        query = None
        assert torch.equal(handle.router.route(features), expected)
    model.eval()
    _, selection = case.forward(model, original, x, query=query)
    case.check_routed(model, selection, expected, query if query is not None else features)


def assert_closed_form(ensemble, w0: Tensor, history: Dict[int, list]) -> None:
    for bank, weights in history.items():
        n = len(weights)
        for j, d in enumerate(ensemble.decays.tolist()):
            expected = d**n * w0 + sum((1 - d) * d ** (n - i) * w for i, w in enumerate(weights, start=1))
            torch.testing.assert_close(ensemble.ema_weight[bank, j], expected, rtol=0, atol=1e-6)
    assert any(history.values())


def _naive_scores(case, model, selection, features, handle, mask):
    ensemble = handle.ensemble
    banks = case.bank_of(selection, handle)
    scale = case.transform(model, selection)
    rows = []
    for b in range(features.shape[0]):
        f, bank = features[b], int(banks[b])
        members = torch.stack([ensemble.online(f)] + [
            ensemble.ema_weight[bank, j] @ f + ensemble.ema_bias[bank, j] for j in range(ensemble.num_decays)
        ])
        if scale is not None:
            members = members * scale[b]
        rows.append((members + mask).softmax(dim=-1).amax(dim=0).log())
    return torch.stack(rows)


@pytest.mark.parametrize("name", list(CASES))
def test_ensemble_training_logits_ema_closed_form_and_inference(name):
    case = CASES[name]
    model, original = build(case)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(trainable(model), lr=0.5)
    owner, attribute = case.head(model)
    head = getattr(owner, attribute)
    handle = adapt(case, model, original, router=False, ensemble=True, optimizer=optimizer)
    ensemble = handle.ensemble
    wrapper = getattr(owner, attribute)
    assert ensemble.online is head and wrapper is not head and wrapper.weight is head.weight
    assert set(model.state_dict()) == set(reference.state_dict())
    x, y = batch()
    model.train(), reference.train()
    got, want = case.forward(model, original, x), case.forward(reference, original, x)
    assert torch.equal(got[0], want[0])
    # EMA closed form: a bank trained at steps with online weights W_1..W_n holds
    # d^n W_0 + sum_i (1 - d) d^(n - i) W_i; the others still hold W_0
    w0 = ensemble.online.weight.detach().clone()
    history = {bank: [] for bank in range(ensemble.num_experts)}
    for _ in range(3):
        logits, selection = case.forward(model, original, x)
        loss = case.train_loss(model, logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for bank in torch.unique(case.bank_of(selection, handle)).tolist():
            history[bank].append(ensemble.online.weight.detach().clone())
    assert_closed_form(ensemble, w0, history)
    # inference: log of max over [online, copies of the sample's bank] of softmax(member + mask)
    captured = {}
    probe = wrapper.register_forward_pre_hook(lambda module, args: captured.setdefault("x", args[0]))
    mask = torch.zeros(C)
    mask[-1] = float("-inf")
    handle.set_logit_mask(mask)
    model.eval()
    scores, selection = case.forward(model, original, x)
    probe.remove()
    naive = _naive_scores(case, model, selection, captured["x"], handle, mask)
    torch.testing.assert_close(scores, naive)
    assert torch.isneginf(scores[:, -1]).all()


@pytest.mark.parametrize("name", list(CASES))
def test_undo_restores_modules_and_removes_every_hook(name):
    case = CASES[name]
    model, original = build(case)
    reference = copy.deepcopy(model)
    owner, attribute = case.head(model)
    head = getattr(owner, attribute)
    optimizer = torch.optim.Adam(trainable(model), lr=1e-3)
    before = hook_counts(model, original)
    handle = adapt(case, model, original, optimizer=optimizer)
    assert getattr(owner, attribute) is not head and len(optimizer._optimizer_step_post_hooks) == 1
    handle.remove()
    handle.remove()
    assert getattr(owner, attribute) is head and owner._modules[attribute] is head
    assert hook_counts(model, original) == before and len(optimizer._optimizer_step_post_hooks) == 0
    for module in model.modules():
        assert "forward" not in vars(module) and "forward_features" not in vars(module)
    x, _ = batch()
    for mode in (True, False):
        model.train(mode), reference.train(mode)
        assert torch.equal(case.forward(model, original, x)[0], case.forward(reference, original, x)[0])


def online_run(case: Case, router: bool, ensemble: bool) -> Tensor:
    model, original = build(case)
    optimizer = torch.optim.Adam(trainable(model), lr=1e-3)
    schedule = SessionSchedule(E) if case.schedule == "session" else SampleBudgetSchedule(16, E)
    handle = adapt(case, model, original, router=router, ensemble=ensemble, optimizer=optimizer, schedule=schedule)
    seen = torch.full((C,), float("-inf"))
    for session in range(2):
        handle.start_session(session)
        for step in range(2):
            x, y = batch(seed=10 * session + step, shift=2.0 * session)
            y = y % 3 + 2 * session
            seen[y] = 0
            model.train()
            for _ in range(2):
                logits, _ = case.forward(model, original, x, task=handle.current_expert)
                loss = case.train_loss(model, logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            # the baseline variant installs no hook: it needs the batch size for the sample budget
            handle.end_batch(x.shape[0] if not (router or ensemble) else None)
    assert handle.current_expert == 1
    if hasattr(model, "task_count"):
        assert model.task_count == 1
    model.eval()
    handle.set_logit_mask(seen)
    logits, _ = case.forward(model, original, batch(seed=99)[0])
    if router:
        assert handle.router.num_samples == 32 and bool((handle.router.counts > 0).all())
    if ensemble:
        assert int(handle.ensemble.num_updates.sum()) > 0
        assert bool((logits.argmax(dim=1).unsqueeze(1) == (seen == 0).nonzero().squeeze(1)).any(dim=1).all())
    handle.remove()
    return logits


@pytest.mark.parametrize("name", list(CASES))
def test_online_run_in_every_variant(name):
    for variant, (router, ensemble) in VARIANTS.items():
        logits = online_run(CASES[name], router, ensemble)
        assert logits.shape == (8, C), variant
        assert not torch.isnan(logits).any(), variant


# ----------------------------------------------------------------------------- unknown structure
class Bare(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(D, C)


def test_unknown_structure_raises_seam_error_naming_the_attribute():
    cases = [
        ("l2p", Bare(), "`prompt`"),
        ("dualprompt", Bare(), "`e_prompt`"),
        ("misa", Bare(), "`e_prompt`"),
        ("mvp", Bare(), "`backbone`"),
        ("hide", Bare(), "`e_prompt`"),
        ("norga", Bare(), "`e_prompt`"),
    ]
    for method, model, attribute in cases:
        with pytest.raises(SeamError, match=r"generic\.retrofit") as info:
            retrofit(model, method, num_experts=E)
        assert attribute in str(info.value), (method, str(info.value))
    keyless = Bare()
    keyless.prompt = nn.Linear(2, 2)
    with pytest.raises(SeamError, match=r"prompt\.prompt_key"):
        retrofit(keyless, "l2p", num_experts=E)
    old_style = Bare()
    old_style.e_prompt = nn.Linear(2, 2)
    with pytest.raises(SeamError, match=r"prompt_idx"):
        retrofit(old_style, "hide", num_experts=E)
    with pytest.raises(SeamError, match="route_module"):
        generic.retrofit(Bare(), num_experts=E, query_module=nn.Identity())
    with pytest.raises(SeamError, match="head_name"):
        generic.retrofit(Bare(), num_experts=E, head_owner=Bare(), head_name="classifier", router=False)


def test_hide_router_needs_router_features():
    model, _ = HiDeCase().build()
    with pytest.raises(SeamError, match="original_model"):
        retrofit(model, "hide", num_experts=E)


def test_set_instance_attribute_undo_puts_modules_parameters_and_attributes_back():
    from fly_modules.adapters._handle import Retrofit

    owner = Bare()
    owner.scale = 2.0
    head, weight = owner.head, owner.head.weight
    handle = Retrofit(owner, router=None, ensemble=None, schedule=None, start_method_expert=lambda e: None,
                      banks_of_expert=lambda e: [e])
    handle.install.set_attribute(owner, "head", nn.Identity())
    handle.install.set_attribute(head, "weight", nn.Parameter(torch.zeros_like(weight)))
    handle.install.set_attribute(owner, "scale", 3.0)
    handle.install.set_attribute(owner, "forward", lambda x: x)
    assert isinstance(owner.head, nn.Identity) and owner.scale == 3.0 and "forward" in vars(owner)
    handle.remove()
    assert owner.head is head and owner._modules["head"] is head and "head" not in vars(owner)
    assert head.weight is weight and head._parameters["weight"] is weight
    assert owner.scale == 2.0 and "forward" not in vars(owner)
    with pytest.raises(ValueError, match=r"\(C,\) or \(B, C\)"):
        handle.set_logit_mask(torch.zeros(1, 2, 3))


# ------------------------------------------------------------------ handle safety (generic adapter)
class _Route(nn.Module):
    def forward(self, x: Tensor, expert: Optional[Tensor] = None) -> Tensor:
        return x


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.route, self.head = nn.Linear(4, 4), _Route(), nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.route(self.query(x)))


def _tiny_retrofit(model: _Tiny, **kwargs: Any):
    options = dict(num_experts=2, query_module=model.query, route_module=model.route, route_kwarg="expert",
                   expansion_dim=16, ridge=1.0)
    return generic.retrofit(model, **{**options, **kwargs})


def test_a_model_is_retrofitted_at_most_once_at_a_time():
    model = _Tiny()
    head = model.head
    first = _tiny_retrofit(model)
    with pytest.raises(RuntimeError, match="already retrofitted"):
        _tiny_retrofit(model)
    _tiny_retrofit(copy.deepcopy(model)).remove()  # a copy is another model
    first.remove()
    assert model.head is head
    second = _tiny_retrofit(model)  # allowed again once the first is removed
    second.remove()
    assert model.head is head and not model.route._forward_pre_hooks and not model.query._forward_hooks


def test_a_failed_retrofit_leaves_the_model_as_it_was(monkeypatch):
    model = _Tiny()
    head = model.head

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("seam failed half way")

    monkeypatch.setattr(_wiring.Wiring, "swap_head", broken)  # after the hooks are installed
    with pytest.raises(RuntimeError, match="half way"):
        _tiny_retrofit(model)
    monkeypatch.undo()
    assert model.head is head and not model.query._forward_hooks and not model.route._forward_pre_hooks
    _tiny_retrofit(model).remove()  # and it can be retrofitted afterwards


def test_expert_ids_are_checked_before_anything_changes():
    model = _Tiny()
    with pytest.raises(ValueError, match="schedule starts 4 experts but only 2"):
        _tiny_retrofit(model, schedule=SampleBudgetSchedule(4, 4))
    handle = _tiny_retrofit(model)
    for bad in (-1, 2, True, 1.0):
        with pytest.raises(ValueError, match=r"\[0, 2\)"):
            handle.start_expert(bad)
        assert handle.current_expert == 0 and handle.ensemble.num_experts == 2
    handle.start_expert(torch.tensor(1))  # any integer index works
    assert handle.current_expert == 1


def test_a_rejected_router_update_keeps_the_batch():
    model = _Tiny().train()
    handle = _tiny_retrofit(model)
    model(torch.full((4, 4), float("nan")))  # NaN query features
    with pytest.raises(ValueError, match="NaN"):
        handle.end_batch()
    assert handle._pending_query is not None and handle.router.num_samples == 0
    handle.discard_batch()
    model(torch.randn(4, 4))
    handle.end_batch()
    assert handle.router.num_samples == 4
