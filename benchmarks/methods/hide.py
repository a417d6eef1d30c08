"""HiDe on a frozen timm ViT (docs/protocol.md §4.7, §4.8): per-task experts chosen by a gate head,
orthogonality to old classes' prototypes, and classifier alignment at session ends. ``HiDeMethod`` is
that training for any kind of per-task expert; HiDe-Prompt's experts are prefixes, and NoRGa gates the
prefix attention scores (the LoRA and adapter experts are in ``hide_experts``). The training batch, the
inference and the decisions on the reference's quirks are in docs/methods.md, "HiDe-Prompt and NoRGa".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import check_int

from ..parallel import WHOLE_BATCH, BatchShare
from .base import MethodOutput, PromptMethod, QueryFeatures, frozen_cls, register_method
from .prefix_attention import check_prefixable_backbone, class_token_pass, prefixed_block, resolve_prefix_layers

__all__ = ["HiDeOutput", "HiDeMethod", "PrefixPrompt", "HiDePrompt", "NoRGa"]

_ROUTER_FEATURES = ("cls", "g_mlp")


# ------------------------------------------------------------------------------------ modules
class PrefixPrompt(nn.Module):
    """Per-task prefix keys and values of the prefixed layers (the official code's ``e_prompt``).

    Args:
        num_layers: number of prefixed layers L.
        num_tasks: number of tasks T (all pre-allocated).
        length: prefix length P per layer.
        num_heads, head_dim: the attention's head split.
        gated: also hold NoRGa's per-layer ``act_scale`` ``(a, b)``.
        mixed_assembly: assemble the batch as the official code does (docs/adapters.md, "Prompts that
            mix the samples of a batch"): its gather reshaped to ``(L, B, 2, ...)`` without moving the batch
            axis, so a sample gets other samples' prefixes and the key half as values. For measuring what
            that does; off by default.

    Attributes:
        prompt: ``(L, 2, T, P, H, head_dim)`` parameter, index 0 keys and 1 values, truncated normal with
            std 0.02.
        act_scale: ``(L, 2, 1, 1)`` parameter of ones (``[l, 0] = a_l``, ``[l, 1] = b_l``) when ``gated``,
            else ``None``.

    Shape:
        ``forward(task_id)``: ``task_id`` ``(B,)`` long -> ``(L, 2, B, H, P, head_dim)``.
    """

    def __init__(
        self,
        num_layers: int,
        num_tasks: int,
        length: int,
        num_heads: int,
        head_dim: int,
        *,
        gated: bool = False,
        mixed_assembly: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.num_layers, self.num_tasks, self.length = num_layers, num_tasks, length
        self.mixed_assembly = bool(mixed_assembly)
        self.num_heads, self.head_dim = num_heads, head_dim
        self.prompt = nn.Parameter(torch.empty(num_layers, 2, num_tasks, length, num_heads, head_dim, **dd))
        if gated:
            self.act_scale = nn.Parameter(torch.empty(num_layers, 2, 1, 1, **dd))
        else:
            self.register_parameter("act_scale", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.prompt, std=0.02)
        if self.act_scale is not None:
            nn.init.ones_(self.act_scale)

    def forward(self, task_id: Tensor) -> Tensor:
        prefix = self.prompt[:, :, task_id]  # (L, 2, B, P, H, head_dim)
        if self.mixed_assembly:  # the official reshape: memory relabelled as (L, B, 2, ...), read back as (L, 2, B)
            layers, dual, batch = prefix.shape[:3]
            prefix = prefix.reshape(layers, batch, dual, *prefix.shape[3:]).transpose(1, 2)
        return prefix.transpose(3, 4)

    def extra_repr(self) -> str:
        return (
            f"layers={self.num_layers}, tasks={self.num_tasks}, length={self.length}, "
            f"heads={self.num_heads}, head_dim={self.head_dim}, gated={self.act_scale is not None}"
            + (", mixed_assembly=True" if self.mixed_assembly else "")
        )


@dataclass
class HiDeOutput(MethodOutput):
    """``MethodOutput`` plus the gate branch of the same forward.

    Attributes:
        gate_logits: ``(B, C)`` ``g_head`` output (no mask).
        gate_features: ``(B, D)`` ``g_mlp`` output (the gate head's input).
    """

    gate_logits: Tensor
    gate_features: Tensor


# ------------------------------------------------------------------------------------ methods
class HiDeMethod(PromptMethod):
    """HiDe's online training for per-task experts of any kind, on a frozen timm ViT: the gate branch,
    the orthogonality terms, classifier alignment, the task identification of its inference.

    A subclass builds the experts (:meth:`build_experts`, which receives the constructor's other keyword
    arguments) and applies them (:meth:`forward_features`: one task for the whole batch, an ``int``, in
    training, or one task per sample, a ``(B,)`` long tensor).

    Args:
        backbone: a timm ``VisionTransformer`` with a class token; frozen here (``requires_grad`` off).
            Its own classifier (``head``, ``fc``, ...) is never used.
        num_classes: C, outputs of both heads (exposure-order labels).
        num_tasks: T, benchmark sessions = experts; all experts are allocated up front.
        num_experts: alias of ``num_tasks`` (give one of them).
        lam_orth: weight of the orthogonality terms (1.0).
        ca_samples_per_class: Gaussian draws per class for classifier alignment (200).
        ca_steps: SGD steps of classifier alignment per head (200; 0 disables CA).
        ca_batch_size: draws per CA step (64, the stream batch size).
        ca_lr: CA learning rate (``default_lr``, the run's lr in the reference).
        ca_momentum: CA SGD momentum (0.9).
        ca_min_var: lower clamp of the per-class variances (1e-5).
        router_features: ``"cls"`` (frozen prompt-free final-norm CLS, default) or ``"g_mlp"`` (the
            reference's drifting gate features) as ``QueryFeatures.router``.
        stats_dtype: dtype of the running class statistics (float64).
        **expert_options: the subclass's :meth:`build_experts` arguments.

    Attributes:
        head: the prompt head ``nn.Linear(D, C)`` (also ``prompt_head``); ``get_classifier()`` returns it.
        g_mlp: ``Sequential(Linear(D, D), ReLU)``; g_head: ``nn.Linear(D, C)``.
        embed_dim, router_dim: D, the width of the features and of ``QueryFeatures.router``.
        class_first_session: ``(C,)`` long buffer, session in which each class was first trained, -1 if
            never (the exposed classes are those >= 0).
        class_count: ``(C,)`` buffer; prompt_sum / prompt_sqsum / gate_sum / gate_sqsum: ``(C, D)``
            buffers (``stats_dtype``) of the per-class sums and sums of squares of each branch's features.
        sessions_completed: long scalar buffer, the number of ``on_session_end`` calls.
    """

    session_aware: ClassVar[bool] = True
    default_lr: ClassVar[float] = 0.003

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        *,
        num_tasks: Optional[int] = None,
        num_experts: Optional[int] = None,
        lam_orth: float = 1.0,
        ca_samples_per_class: int = 200,
        ca_steps: int = 200,
        ca_batch_size: int = 64,
        ca_lr: Optional[float] = None,
        ca_momentum: float = 0.9,
        ca_min_var: float = 1e-5,
        router_features: str = "cls",
        stats_dtype: torch.dtype = torch.float64,
        **expert_options: Any,
    ) -> None:
        super().__init__()
        if num_tasks is not None and num_experts is not None and num_tasks != num_experts:
            raise ValueError(f"num_tasks ({num_tasks}) and its alias num_experts ({num_experts}) disagree")
        num_tasks = num_tasks if num_tasks is not None else (num_experts if num_experts is not None else 5)
        caller = type(self).__name__
        self.num_classes = check_int(num_classes, "num_classes", caller=caller, minimum=1)
        self.num_tasks = self.num_experts = check_int(num_tasks, "num_tasks", caller=caller, minimum=1)
        self.ca_samples_per_class = check_int(ca_samples_per_class, "ca_samples_per_class", caller=caller, minimum=1)
        self.ca_steps = check_int(ca_steps, "ca_steps", caller=caller, minimum=0)
        self.ca_batch_size = check_int(ca_batch_size, "ca_batch_size", caller=caller, minimum=1)
        nonnegative = (("lam_orth", lam_orth), ("ca_min_var", ca_min_var), ("ca_momentum", ca_momentum))
        for pname, value in nonnegative:
            if not value >= 0:
                raise ValueError(f"{type(self).__name__}: {pname} must be >= 0, found {value!r}")
        if router_features not in _ROUTER_FEATURES:
            raise ValueError(f"router_features must be one of {_ROUTER_FEATURES}, found {router_features!r}")
        self.lam_orth, self.ca_min_var, self.ca_momentum = float(lam_orth), float(ca_min_var), float(ca_momentum)
        self.ca_lr = float(self.default_lr if ca_lr is None else ca_lr)
        self.router_features = router_features
        self.current_expert = 0

        self.backbone = backbone
        backbone.requires_grad_(False)
        backbone.eval()
        ref = next(backbone.parameters())
        dd = {"device": ref.device, "dtype": ref.dtype}
        dim = int(getattr(backbone, "embed_dim", None) or backbone.num_features)
        self.embed_dim = self.router_dim = dim
        # The experts are initialised before the heads: the reference's order of random draws.
        self.build_experts(dd, **expert_options)
        self.head = nn.Linear(dim, self.num_classes, **dd)
        self.g_mlp = nn.Sequential(nn.Linear(dim, dim, **dd), nn.ReLU())
        self.g_head = nn.Linear(dim, self.num_classes, **dd)
        self._register_statistics(ref.device, stats_dtype)

    def _register_statistics(self, device: torch.device, stats_dtype: torch.dtype) -> None:
        sd = {"device": device, "dtype": stats_dtype}
        self.register_buffer("class_first_session", torch.full((self.num_classes,), -1, dtype=torch.long, device=device))
        self.register_buffer("class_count", torch.zeros(self.num_classes, **sd))
        for branch in ("prompt", "gate"):
            self.register_buffer(f"{branch}_sum", torch.zeros(self.num_classes, self.embed_dim, **sd))
            self.register_buffer(f"{branch}_sqsum", torch.zeros(self.num_classes, self.embed_dim, **sd))
        self.register_buffer("sessions_completed", torch.zeros((), dtype=torch.long, device=device))

    def build_experts(self, dd: Dict[str, Any], **options: Any) -> None:
        """Create every task's experts (``dd``: the backbone's device and dtype)."""
        raise NotImplementedError

    def forward_features(self, x: Tensor, selection: Union[Tensor, int]) -> Tensor:
        """Pass with task ``selection`` (one int, or ``(B,)`` long) -> final-norm CLS ``(B, D)``."""
        raise NotImplementedError

    @classmethod
    def protocol_kwargs(cls, protocol: Any, *, seed: int, backbone: nn.Module, num_classes: int) -> Dict[str, Any]:
        kwargs = super().protocol_kwargs(protocol, seed=seed, backbone=backbone, num_classes=num_classes)
        if protocol.lr is not None:
            # Classifier alignment runs at the run's lr (docs/protocol.md §4.7); its batch stays the
            # method's 64, the paper's B (the CPU presets' smaller B is not used there).
            kwargs.setdefault("ca_lr", protocol.lr)
        return kwargs

    # ------------------------------------------------------------------------------ aliases
    @property
    def prompt_head(self) -> nn.Linear:
        """The official code's name of the prompt-branch head (the same module as ``head``)."""
        return self.head

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, num_tasks={self.num_tasks}, {self.experts_repr()}, "
            f"lam_orth={self.lam_orth}, router_features={self.router_features!r}"
        )

    def experts_repr(self) -> str:
        """The experts' settings, for ``extra_repr``."""
        return ""

    def get_extra_state(self) -> Any:
        return {"current_expert": int(self.current_expert)}

    def set_extra_state(self, state: Any) -> None:
        self.current_expert = int(state["current_expert"])

    # -------------------------------------------------------------------------------- seams
    def frozen_features(self, x: Tensor) -> Tensor:
        """Frozen prompt-free final-norm CLS."""
        return frozen_cls(self.backbone, x)

    def query_from_frozen(self, cls: Tensor) -> QueryFeatures:
        """The CLS is the gate branch's input and (by default) the router's; else g_mlp of it."""
        if self.router_features == "cls":
            return QueryFeatures(query=cls, router=cls)
        with torch.no_grad():
            return QueryFeatures(query=cls, router=self.g_mlp(cls))

    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """Task id per sample: ``expert`` if given, the current task in training, else the gate's task."""
        if expert is not None:
            return self._task_ids(expert, query.shape[0], query.device)
        if train:
            return torch.full((query.shape[0],), self.current_expert, dtype=torch.long, device=query.device)
        with torch.no_grad():
            return self.task_from_gate(self.g_head(self.g_mlp(query)))

    def expert_of(self, selection: Tensor) -> Tensor:
        return selection

    def forward(
        self,
        x: Tensor,
        *,
        expert: Optional[Tensor] = None,
        query: Optional[QueryFeatures] = None,
        task_id: Optional[Union[Tensor, int]] = None,
        parallel: BatchShare = WHOLE_BATCH,
    ) -> HiDeOutput:
        """Query pass -> gate branch -> task selection -> the experts' pass -> prompt head.

        ``task_id`` (the official code's override; one int or ``(B,)``) is an alias of ``expert``.
        Training without ``expert`` applies the current task to the whole batch (an int to
        :meth:`forward_features`: only that task's experts enter the graph).
        """
        if task_id is not None:
            if expert is not None:
                raise ValueError("give either expert or its alias task_id, not both")
            expert = self._task_ids(task_id, x.shape[0], x.device)
        if query is None:
            query = self.compute_query(x)
        gate_features = self.g_mlp(query.query.detach())
        gate_logits = self.g_head(gate_features)
        selection = self.select(query.query, train=self.training, expert=expert)
        features = self.forward_features(x, self.current_expert if self.training and expert is None else selection)
        logits = self.transform_logits(self.head(features), selection)
        return HiDeOutput(
            logits, features, query, selection, self.expert_of(selection), features.new_zeros(()),
            gate_logits, gate_features,
        )

    # ------------------------------------------------------------------- task identification
    def exposed_mask(self) -> Tensor:
        """``(C,)`` bool, the classes trained so far (``class_first_session >= 0``)."""
        return self.class_first_session >= 0

    def task_from_gate(self, gate_logits: Tensor) -> Tensor:
        """Gate argmax over the exposed classes -> first session of that class, ``(B,)`` long.

        Falls back to ``current_expert`` when no class is exposed yet.
        """
        exposed = self.exposed_mask()
        pred = gate_logits.masked_fill(~exposed, float("-inf")).argmax(dim=-1)
        task = self.class_first_session[pred]
        return torch.where(task >= 0, task, torch.full_like(task, self.current_expert))

    @torch.no_grad()
    def observe(self, target: Tensor) -> None:
        """Record the session in which each class of ``target`` is first seen (idempotent)."""
        first = self.class_first_session[target]
        current = torch.full_like(first, self.current_expert)
        self.class_first_session.index_put_((target,), torch.where(first < 0, current, first))

    # ----------------------------------------------------------------------------- training
    def loss(
        self, output: MethodOutput, target: Tensor, logit_mask: Optional[Tensor] = None,
        parallel: BatchShare = WHOLE_BATCH,
    ) -> Tensor:
        """HiDe loss of one forward; in training mode it also updates the exposure table and statistics.

        ``logit_mask`` (the batch mask) applies to the prompt logits; the gate logits are restricted to
        the exposed classes.
        """
        if not isinstance(output, HiDeOutput):
            raise TypeError(
                f"{type(self).__name__}.loss needs the HiDeOutput of its forward, got {type(output).__name__}"
            )
        if self.training:
            # Data-parallel runs update the tables with the global batch, as one process would.
            every_target = parallel.gather_rows(target)
            self.observe(every_target)
            self._update_statistics(
                parallel.gather_rows(output.features.detach()), parallel.gather_rows(output.gate_features.detach()),
                every_target,
            )
        logits = output.logits if logit_mask is None else output.logits + logit_mask
        loss = F.cross_entropy(logits, target)
        gate_logits = output.gate_logits.masked_fill(~self.exposed_mask(), float("-inf"))
        loss = loss + F.cross_entropy(gate_logits, target)
        if self.lam_orth > 0:
            old = self.old_class_mask()
            orth = self._orthogonality(output.features, self.prompt_sum, old) + self._orthogonality(
                output.gate_features, self.gate_sum, old
            )
            loss = loss + self.lam_orth * orth
        return loss + output.aux_loss

    def old_class_mask(self) -> Tensor:
        """``(C,)`` bool, classes first seen in a session before ``current_expert`` that have statistics."""
        first = self.class_first_session
        return (first >= 0) & (first < self.current_expert) & (self.class_count > 0)

    def _orthogonality(self, features: Tensor, sums: Tensor, old: Tensor) -> Tensor:
        """Mean squared projection of ``features`` on the normalised running means of the ``old`` classes."""
        means = sums / self.class_count.clamp_min(1).unsqueeze(-1)
        protos = F.normalize(means.to(features.dtype), dim=-1)
        weight = old.to(features.dtype)
        proj2 = (features @ protos.t()).square()
        return (proj2 * weight).sum() / (features.shape[0] * weight.sum()).clamp_min(1)

    @torch.no_grad()
    def _update_statistics(self, prompt_features: Tensor, gate_features: Tensor, target: Tensor) -> None:
        dtype = self.class_count.dtype
        self.class_count.index_add_(0, target, torch.ones_like(target, dtype=dtype))
        for branch, feats in (("prompt", prompt_features), ("gate", gate_features)):
            feats = feats.to(dtype)
            getattr(self, f"{branch}_sum").index_add_(0, target, feats)
            getattr(self, f"{branch}_sqsum").index_add_(0, target, feats.square())

    def class_gaussians(self, branch: str) -> Tuple[Tensor, Tensor, Tensor]:
        """Classes with >1 sample and their diagonal Gaussians ``(classes (K,), mean (K, D), var (K, D))``.

        ``branch`` is ``"prompt"`` or ``"gate"``; the variances are clamped below at ``ca_min_var``.
        """
        if branch not in ("prompt", "gate"):
            raise ValueError(f"branch must be 'prompt' or 'gate', found {branch!r}")
        classes = (self.class_count > 1).nonzero().flatten()
        count = self.class_count[classes].unsqueeze(-1)
        mean = getattr(self, f"{branch}_sum")[classes] / count
        var = (getattr(self, f"{branch}_sqsum")[classes] / count - mean.square()).clamp_min(self.ca_min_var)
        return classes, mean, var

    def classifier_alignment(self) -> None:
        """CA of ``head`` (prompt statistics) and ``g_head`` (gate statistics); global RNG."""
        if self.ca_steps == 0:
            return
        with torch.enable_grad():
            self._align(self.head, "prompt")
            self._align(self.g_head, "gate")

    def _align(self, head: nn.Linear, branch: str) -> None:
        classes, mean, var = self.class_gaussians(branch)
        if classes.numel() == 0:
            return
        dtype = head.weight.dtype
        mean, std = mean.to(dtype), var.sqrt().to(dtype)
        n = self.ca_samples_per_class
        noise = torch.randn(classes.numel(), n, self.embed_dim, device=mean.device, dtype=dtype)
        feats = (mean.unsqueeze(1) + std.unsqueeze(1) * noise).reshape(-1, self.embed_dim)
        labels = classes.repeat_interleave(n)
        optimizer = torch.optim.SGD(head.parameters(), lr=self.ca_lr, momentum=self.ca_momentum)
        batch = min(self.ca_batch_size, feats.shape[0])
        for _ in range(self.ca_steps):
            idx = torch.randint(0, feats.shape[0], (batch,), device=feats.device)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(head(feats[idx]), labels[idx]).backward()
            optimizer.step()

    # -------------------------------------------------------------------------------- hooks
    def on_expert_start(self, expert: int) -> None:
        expert = int(expert)
        if not 0 <= expert < self.num_tasks:
            raise ValueError(f"{type(self).__name__}: task {expert} out of range [0, {self.num_tasks})")
        self.current_expert = expert

    def on_session_end(self, session: int) -> None:
        """Classifier alignment of both heads; counts the completed sessions."""
        self.classifier_alignment()
        self.sessions_completed += 1

    # ------------------------------------------------------------------------------ helpers
    def _task_ids(self, ids: Union[Tensor, int], batch: int, device: torch.device) -> Tensor:
        if isinstance(ids, Tensor):
            if ids.dim() == 0:
                ids = ids.reshape(1).expand(batch)
            if ids.shape != (batch,):
                raise ValueError(f"task ids must have shape ({batch},), found {tuple(ids.shape)}")
            return ids.to(device=device, dtype=torch.long)
        ids = int(ids)
        if not 0 <= ids < self.num_tasks:
            raise ValueError(f"task id {ids} out of range [0, {self.num_tasks})")
        return torch.full((batch,), ids, dtype=torch.long, device=device)


@register_method
class HiDePrompt(HiDeMethod):
    """HiDe-Prompt: ``HiDeMethod`` whose experts are per-task prefixes of the first blocks' attention.

    Args (besides ``HiDeMethod``'s):
        prefix_length: P prefix keys/values per layer (5; 0 gives the prompt-free backbone).
        prefix_layers: the first n blocks (5, clamped to the depth) or explicit block indices.
        mixed_assembly: the official code's batch assembly of the prefixes, which mixes the samples of
            a batch (``PrefixPrompt``); for measuring its effect only.

    Attributes:
        e_prompt: ``PrefixPrompt`` holding every task's prefixes.
        prefix_layers: tuple of the prefixed block indices.
    """

    name: ClassVar[str] = "hide"
    gated: ClassVar[bool] = False

    def build_experts(
        self, dd: Dict[str, Any], *, prefix_length: int = 5, prefix_layers: Union[int, Sequence[int]] = 5,
        mixed_assembly: bool = False,
    ) -> None:
        self.prefix_length = check_int(prefix_length, "prefix_length", caller=type(self).__name__, minimum=0)
        self.prefix_layers = resolve_prefix_layers(prefix_layers, len(self.backbone.blocks))
        num_heads, head_dim = check_prefixable_backbone(self.backbone, self.prefix_layers)
        self._slot_of_layer: Dict[int, int] = {layer: s for s, layer in enumerate(self.prefix_layers)}
        self.e_prompt = PrefixPrompt(
            len(self.prefix_layers), self.num_tasks, self.prefix_length, num_heads, head_dim,
            gated=self.gated, mixed_assembly=mixed_assembly, **dd,
        )

    def experts_repr(self) -> str:
        return f"prefix_length={self.prefix_length}, prefix_layers={self.prefix_layers}"

    def forward_features(self, x: Tensor, selection: Union[Tensor, int]) -> Tensor:
        """Prefixed pass with task ``selection`` (``(B,)`` long or one int) -> final-norm CLS ``(B, D)``."""
        task_ids = self._task_ids(selection, x.shape[0], x.device)
        prefix = self.e_prompt(task_ids)  # (L, 2, B, H, P, head_dim)

        def prefixed(block: nn.Module, tokens: Tensor, slot: int) -> Tensor:
            return prefixed_block(block, tokens, prefix[slot, 0], prefix[slot, 1], gate=self._gate(slot))

        return class_token_pass(self.backbone, x, self._slot_of_layer, prefixed)

    def _gate(self, slot: int) -> Optional[Tensor]:
        return None


def _sync_gate_freeze_hook(module: "NoRGa", incompatible_keys: Any) -> None:
    module._sync_gate_freeze()


@register_method
class NoRGa(HiDePrompt):
    """NoRGa: HiDe-Prompt with non-linear residual gating of the prefix attention scores.

    Same arguments as ``HiDePrompt``. ``e_prompt.act_scale`` ``(L, 2, 1, 1)`` holds ``(a_l, b_l)``, ones at
    start, trained in the first session and frozen (``requires_grad`` off, ``.grad`` cleared) at its end;
    the freeze follows ``sessions_completed`` through ``load_state_dict``.
    """

    name: ClassVar[str] = "norga"
    gated: ClassVar[bool] = True

    def __init__(self, backbone: nn.Module, num_classes: int, **kwargs) -> None:
        super().__init__(backbone, num_classes, **kwargs)
        self.register_load_state_dict_post_hook(_sync_gate_freeze_hook)

    def _gate(self, slot: int) -> Optional[Tensor]:
        return self.e_prompt.act_scale[slot]

    def _sync_gate_freeze(self) -> None:
        frozen = bool(self.sessions_completed >= 1)
        scale = self.e_prompt.act_scale
        scale.requires_grad_(not frozen)
        if frozen:
            scale.grad = None

    def on_session_end(self, session: int) -> None:
        super().on_session_end(session)
        self._sync_gate_freeze()
