"""One :class:`Case` per (codebase, family) pair of the stand-ins: how to build the model, call it the way
the codebase's own loop does, and read which prompt it selected."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fly_modules.adapters import generic, retrofit
from flygcl_standins import (
    FlyGCLExpertModel,
    FlyGCLPrefixModel,
    FlyGCLSPrompt,
    prefix_eval_forward,
    prefix_train_forward,
    sprompt_eval_forward,
)
from generic_standins import PGPL2P, HiDePETLoRA, InfLoRASiNet, SPromptsSiNet, hide_pet_eval_forward
from torch import Tensor, nn
from upstream_standins import (
    JLL2P,
    MVP,
    TASK_OF_CLASS,
    E,
    FlyGCLDualPrompt,
    FlyGCLL2P,
    FlyGCLMVP,
    HDModel,
    JLDualPrompt,
    MISADualPrompt,
    Original,
    hide_eval_forward,
    hide_train_forward,
    jhlee_forward,
    norga_train_forward,
)

from fly_modules import _compat

ROUTER = dict(expansion_dim=128, ridge=1e-4)


class Case:
    """One codebase: how to build it, call it the codebase's way, and read its selection."""

    method = ""
    schedule = "session"
    craftable = True

    def build(self) -> Tuple[nn.Module, Optional[nn.Module]]:
        raise NotImplementedError

    def adapter_kwargs(self, model: nn.Module, original: Optional[nn.Module]) -> Dict[str, Any]:
        return {"num_experts": E}

    def head(self, model: nn.Module) -> Tuple[nn.Module, str]:
        return model, "head"

    def forward(self, model, original, x, *, task: int = 0, query: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """``(logits, selection)``; ``query`` replaces the query features (the router's too)."""
        raise NotImplementedError

    def router_features(self, model, original, x) -> Tensor:
        """What the adapter feeds the router (read by the tests of non-craftable cases): by default the
        final-norm class token of the query pass of the model's ``backbone``."""
        with torch.no_grad():
            return model.backbone.forward_features(x)[:, 0]

    def expert_of(self, selection: Tensor) -> Tensor:
        """The expert of each sample's selection: by default the selected prompt is the expert."""
        return selection

    def bank_of(self, selection: Tensor, handle) -> Tensor:
        """The ensemble bank of each sample's selection: by default the selection itself."""
        return selection

    def check_routed(self, model, selection: Tensor, experts: Tensor, query: Tensor) -> None:
        assert torch.equal(self.expert_of(selection), experts)

    def train_loss(self, model, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits, y)

    def transform(self, model, selection: Tensor) -> Optional[Tensor]:
        return None

    def advance(self, model: nn.Module, handle) -> None:
        """What the loop does at a session start besides ``handle.start_session`` (nothing by default)."""


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
        out = jhlee_forward(model, original, x, task, cls_features=query)
        return out["logits"], out["prompt_idx"]

    def expert_of(self, selection):
        return (selection[:, 0] // 3).clamp(max=E - 1)

    bank_of = lambda self, selection, handle: self.expert_of(selection)  # noqa: E731

    def check_routed(self, model, selection, experts, query):
        keys = model.prompt.prompt_key
        for b, expert in enumerate(experts.tolist()):
            similarity = F.normalize(query[b], dim=0) @ F.normalize(keys[3 * expert : 3 * expert + 3], dim=1).t()
            assert selection[b].tolist() == (similarity.topk(2).indices + 3 * expert).tolist()


class PGPL2PCase(JLL2PCase):
    """PGP's L2P through the generic seams, as its harness wires it: the query is ``original_model``'s
    ``pre_logits``, the route ``Prompt.forward``'s ``prompt_mask`` (expert ``e`` = slots ``[2e, 2e + 2)``), the
    classifier ``head``; banks: the current expert in training, the routed one at inference."""

    method = "generic"

    def __init__(self) -> None:
        super().__init__(query_module=True)

    def build(self):
        return PGPL2P(), Original()

    def adapter_kwargs(self, model, original):
        return dict(num_experts=E, query_module=original, route_module=model.prompt, route_kwarg="prompt_mask",
                    route_value=lambda experts, module, args, kwargs: experts[:, None] * 2 + torch.arange(2))

    def expert_of(self, selection):
        return selection[:, 0] // 2

    check_routed = Case.check_routed

    def bank_of(self, selection, handle):
        if handle.model.training:
            return torch.full_like(selection[:, 0], handle.current_expert)
        routed = handle.routing_active()
        return self.expert_of(selection) if routed else torch.full_like(selection[:, 0], handle.ensemble.active_expert)


class HiDePETLoRACase(Case):
    """HiDe-PET's HiDe-LoRA through the generic seams, as its harness wires it: the query is
    ``original_model``'s ``pre_logits``, the route the model's own ``task_id`` (one id per sample). Their
    training never runs ``original_model``; the user's line gives ``end_batch`` its features, here the same
    pass run before the training call (its hook records them)."""

    method = "generic"
    craftable = False

    def build(self):
        return HiDePETLoRA(), Original()

    def adapter_kwargs(self, model, original):
        return dict(num_experts=E, query_module=original, route_module=model, route_kwarg="task_id")

    def router_features(self, model, original, x):
        with torch.no_grad():
            return original(x)["pre_logits"]

    def forward(self, model, original, x, *, task=0, query=None):
        if model.training:
            with torch.no_grad():
                original(x)  # the user's line: the query pass their training loop does not run
            out = model(x, task_id=task, train=True)
        else:
            out = hide_pet_eval_forward(model, original, x)
        return out["logits"], model.last_task_ids

    def bank_of(self, selection, handle):
        if handle.model.training:
            return torch.full_like(selection, handle.current_expert)
        return selection if handle.routing_active() else torch.full_like(selection, handle.ensemble.active_expert)


class JLDualPromptCase(Case):
    method = "dualprompt"

    def build(self):
        return JLDualPrompt(), Original()

    def forward(self, model, original, x, *, task=0, query=None):
        out = jhlee_forward(model, original, x, task, cls_features=query)
        return out["logits"], out["prompt_idx"]

    def expert_of(self, selection):  # use_prompt_mask: task t owns slot t (top_k = 1)
        return selection[:, 0]

    def bank_of(self, selection, handle):
        return selection[:, 0]


def _used_slots(pool: torch.Tensor, used: Tensor) -> Tensor:
    """Slot of the pool row each sample's first selected prompt equals."""
    return (used[:, 0].flatten(1).unsqueeze(1) == pool.detach().flatten(1).unsqueeze(0)).all(-1).float().argmax(1)


def _with_query(model: nn.Module, x: Tensor, query: Optional[Tensor]) -> Tensor:
    """``model(x)`` with its frozen query replaced by ``query`` (the router's features too)."""
    if query is not None:
        model.query = lambda inputs: query
    try:
        return model(x)
    finally:
        vars(model).pop("query", None)


class KeyPoolCase(Case):
    """FlyGCL DualPrompt, or a MISA DualPrompt whose gather was patched (``prompts[i + s]``)."""

    method = "dualprompt"
    schedule = "budget"

    def __init__(self, make: type, method: str = "dualprompt") -> None:
        self.make, self.method = make, method

    def build(self):
        return self.make(), None

    def adapter_kwargs(self, model, original):
        return {}  # num_experts from task_num, slots from num_pt_per_task

    def head(self, model):
        return model.backbone, "fc"

    def forward(self, model, original, x, *, task=0, query=None):
        return _with_query(model, x, query), _used_slots(model.e_prompt.prompts, model.used_prompts)

    def expert_of(self, selection):
        return selection // 2

    def check_routed(self, model, selection, experts, query):
        super().check_routed(model, selection, experts, query)
        for b, expert in enumerate(experts.tolist()):
            match = 1 - F.cosine_similarity(query[b : b + 1], model.e_prompt.key[2 * expert : 2 * expert + 2], dim=-1)
            assert int(selection[b]) == 2 * expert + int(match.argmin())


class FlyGCLL2PCase(KeyPoolCase):
    """FlyGCL L2P: 6 keys, 2 slices of 3, top-2 inside the routed slice; one bank per slice."""

    method = "l2p"

    def __init__(self) -> None:
        super().__init__(FlyGCLL2P, "l2p")

    def adapter_kwargs(self, model, original):
        return {"num_experts": E}

    def forward(self, model, original, x, *, task=0, query=None):
        return _with_query(model, x, query), model.prompt.last_selected_indices

    def expert_of(self, selection):
        return selection[:, 0] // 3

    def bank_of(self, selection, handle):
        return selection[:, 0] // 3

    def check_routed(self, model, selection, experts, query):
        Case.check_routed(self, model, selection, experts, query)
        keys = model.prompt.key
        for b, expert in enumerate(experts.tolist()):
            match = 1 - F.cosine_similarity(query[b : b + 1], keys[3 * expert : 3 * expert + 3], dim=-1)
            assert selection[b].tolist() == (match.topk(2, largest=False).indices + 3 * expert).tolist()


class MVPCase(Case):
    method = "mvp"
    schedule = "budget"
    craftable = False

    def __init__(self, flygcl: bool, use_last_layer: bool = True) -> None:
        self.flygcl, self.use_last_layer = flygcl, use_last_layer

    def build(self):
        return (FlyGCLMVP(self.use_last_layer) if self.flygcl else MVP(False, self.use_last_layer)), None

    def adapter_kwargs(self, model, original):
        return {}

    def head(self, model):
        return model.backbone, "fc" if self.flygcl else "head"

    def forward(self, model, original, x, *, task=0, query=None):
        logits = model(x)
        return logits, model.selected

    def train_loss(self, model, logits, y):
        return model.loss_fn(logits, y)

    def transform(self, model, selection):
        return 2 * torch.sigmoid(getattr(model, model.mask_name)[selection])


class HiDeCase(Case):
    """HiDe-Prompt (TII through original_model in training and at evaluation) and NoRGa (its training
    loop passes ``prompt_id=task_id`` and never runs original_model)."""

    method = "hide"
    task_of_class = TASK_OF_CLASS

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
            if model.training and self.gated:
                out = norga_train_forward(model, x, task)
            elif model.training:
                out = hide_train_forward(model, original, x, task)
            else:
                out = hide_eval_forward(model, original, x, task)
        finally:
            vars(original).pop("forward", None)
        return out["logits"], out["prompt_idx"][:, 0]

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


class SPromptCase(Case):
    """FlyGCL S-Prompts: ``model(x)`` in training (the task counter's prompts), ``model(x, expert_ids=...)``
    at evaluation; the expert used is what ``experts`` was called with."""

    method = "sprompt"
    schedule = "budget"
    craftable = False

    def build(self):
        return FlyGCLSPrompt(), None

    def adapter_kwargs(self, model, original):
        return {}  # num_experts from experts.num_experts

    def head(self, model):
        return model.backbone, "fc"

    def forward(self, model, original, x, *, task=0, query=None):
        logits = model(x) if model.training else sprompt_eval_forward(model, x)
        return logits, model.experts.last_expert_ids


class PrefixCase(Case):
    """FlyGCL's HiDe-Prompt / NoRGa port: the trainer's two branches, no ``forward``."""

    schedule = "session"
    craftable = False

    def __init__(self, method: str) -> None:
        self.method, self.gated = method, method == "norga"

    def build(self):
        return FlyGCLPrefixModel(self.gated), None

    def adapter_kwargs(self, model, original):
        return {}  # num_experts from task_num

    def head(self, model):
        return model, "prompt_head"

    def forward(self, model, original, x, *, task=0, query=None):
        logits = prefix_train_forward(model, x, task) if model.training else prefix_eval_forward(model, x)
        return logits, model.backbone.last_task_ids

    def router_features(self, model, original, x):
        with torch.no_grad():
            return model.g_mlp(model.backbone.forward_features(x, use_prefix=False))


class ExpertModelCase(PrefixCase):
    """FlyGCL's HiDe-LoRA / HiDe-Adapter: the two branches of the prefix port, per-task LoRA or adapter
    experts in place of the prefixes; the router reads the prompt-free class token."""

    def __init__(self, adapter: bool) -> None:
        super().__init__("hide")
        self.adapter = adapter

    def build(self):
        return FlyGCLExpertModel(self.adapter), None

    def forward(self, model, original, x, *, task=0, query=None):
        logits = prefix_train_forward(model, x, task) if model.training else prefix_eval_forward(model, x)
        return logits, model.experts.last_expert_ids

    router_features = Case.router_features


CASES: Dict[str, Case] = {
    "jhlee-l2p": JLL2PCase(),
    "jhlee-l2p-query-module": JLL2PCase(query_module=True),
    "jhlee-dualprompt": JLDualPromptCase(),
    "pgp-l2p-generic": PGPL2PCase(),
    "hide-pet-lora-generic": HiDePETLoRACase(),
    "flygcl-dualprompt": KeyPoolCase(FlyGCLDualPrompt),
    "misa-patched-gather": KeyPoolCase(lambda: MISADualPrompt(fixed_gather=True), method="misa"),
    "flygcl-l2p": FlyGCLL2PCase(),
    "siblurry-mvp": MVPCase(flygcl=False),
    "flygcl-mvp": MVPCase(flygcl=True, use_last_layer=False),
    "hide": HiDeCase("hide"),
    "norga": HiDeCase("norga"),
    "generic": HiDeCase(use_generic=True),
    "generic-default-banks": GenericDefaultBanksCase(),
    "flygcl-sprompt": SPromptCase(),
    "flygcl-hide": PrefixCase("hide"),
    "flygcl-norga": PrefixCase("norga"),
    "flygcl-hide-lora": ExpertModelCase(adapter=False),
    "flygcl-hide-adapter": ExpertModelCase(adapter=True),
}


class PoolLearnerCase:
    """A learner whose network keeps one classifier per task in ``classifier_pool`` and trains in eval mode
    (S-Prompts' and InfLoRA's ``train_function``), retrofitted through the generic seams as their harnesses do:
    the pool as the head, ``train_in_eval=True``. ``start_task`` is the learner's task start (``update_fc``, only
    the task's parts trainable), ``train_step`` its training iteration with the user's lines, ``evaluate`` its
    ``_eval_cnn`` call."""

    router = True

    def build(self) -> nn.Module:
        raise NotImplementedError

    def options(self, net: nn.Module) -> Dict[str, Any]:
        return dict(num_experts=E, head_owner=net, head_name="classifier_pool", train_in_eval=True, optimizer="auto")

    def start_task(self, net: nn.Module, task: int) -> torch.optim.Optimizer:
        net.update_fc(0)
        current = tuple(f"{part}.{net.numtask - 1}" for part in self.trained_parts)
        for name, parameter in net.named_parameters():
            parameter.requires_grad_(name.startswith(current))
        return torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)

    def train_step(self, net: nn.Module, handle: Any, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor) -> float:
        net.eval()
        if handle is not None:
            self.before_training_forward(net, x)
        loss = F.cross_entropy(net(x)["logits"], y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if handle is not None:
            handle.end_batch()
        return loss.item()

    def before_training_forward(self, net: nn.Module, x: Tensor) -> None:
        """The user's line in ``train_function`` before the training forward (none by default)."""

    def evaluate(self, net: nn.Module, x: Tensor) -> Tensor:
        raise NotImplementedError

    def verify_forward(self, net: nn.Module):
        raise NotImplementedError


class SPromptsSiNetCase(PoolLearnerCase):
    """S-Prompts' ``SiNet``: the query the prompt-free pass of ``image_encoder`` (``extract_vector``'s, which
    their training never runs: the user's line runs it under ``no_grad`` before the training forward), the route
    ``interface``'s ``selection``."""

    trained_parts = ("classifier_pool", "prompt_pool")

    def build(self):
        return SPromptsSiNet()

    def options(self, net):
        return dict(super().options(net), query_module=net.image_encoder, route_module=net, route_method="interface",
                    route_kwarg="selection",
                    query_when=lambda args, kwargs: len(args) < 2 and kwargs.get("instance_tokens") is None)

    def before_training_forward(self, net, x):
        with torch.no_grad():
            net.extract_vector(x)

    def evaluate(self, net, x, selection: Optional[Tensor] = None):
        """``_eval_cnn``: the prompt-free features, their nearest domain (here domain 0, the router's choice once
        routed), ``interface``."""
        with torch.no_grad():
            net.extract_vector(x)
            return net.interface(x, torch.zeros(x.shape[0], dtype=torch.long) if selection is None else selection)

    def verify_forward(self, net):
        def forward(x):
            if net.training:
                self.before_training_forward(net, x)
                return net(x)["logits"]
            net.extract_vector(x)
            return net.interface(x, torch.zeros(x.shape[0], dtype=torch.long))
        return forward


class InfLoRASiNetCase(PoolLearnerCase):
    """InfLoRA's ``SiNet``: nothing to route (every sample uses every task's LoRA), the ensemble over the pool."""

    router = False
    trained_parts = ("classifier_pool",)

    def build(self):
        return InfLoRASiNet()

    def options(self, net):
        return dict(super().options(net), router=False)

    def evaluate(self, net, x):
        with torch.no_grad():
            return net.interface(x)

    def verify_forward(self, net):
        return lambda x: net(x)["logits"] if net.training else net.interface(x)


POOL_CASES: Dict[str, PoolLearnerCase] = {
    "sprompts-sinet-generic": SPromptsSiNetCase(),
    "inflora-sinet-generic": InfLoRASiNetCase(),
}


def adapt(case: Case, model, original, **kwargs):
    kwargs = {**case.adapter_kwargs(model, original), **ROUTER, **kwargs}
    if case.method == "generic":
        return generic.retrofit(model, **kwargs)
    return retrofit(model, case.method, **kwargs)


def batch(seed: int = 1, n: int = 8, shift: float = 0.0) -> Tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=gen) + shift, torch.randint(0, 5, (n,), generator=gen)


def hook_counts(*modules: Optional[nn.Module]):
    return [_compat.hook_counts(m) for module in modules if module is not None
            for m in module.modules()]


def trainable(model: nn.Module):
    return [p for p in model.parameters() if p.requires_grad]

