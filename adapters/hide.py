"""HiDe-Prompt / NoRGa: our reference ``hide``/``norga``, the official codebases (thu-ml/HiDe-Prompt,
Minhchuyentoancbn/MoE_PromptCL) and FlyGCL's port. The routed task replaces the loop's task identification
(TII), in two layouts:

* the official one: the task is injected as ``e_prompt(..., prompt_idx=expert[:, None])``, with one
  ensemble bank per task on ``model.head``; the router features are ``original_model``'s ``pre_logits``;
* FlyGCL's prefix models (``models.hide_norga_prefix_vit``: ``HiDePrefixModel``, ``NoRGaPrefixModel``) have
  no ``forward``: the trainer calls ``forward_gate(x)`` (the task-identification branch, ``g_mlp`` on the
  prompt-free class token) and ``forward_prompt(x, task_id, ...)`` (per-task prefixes, the prompt head).
  At inference the routed task replaces the ``task_id`` the trainer derived from the gate; the router
  features are the gate features ``h`` (what FlyGCL's ``--use_rp_gate`` collects);
* FlyGCL's expert models (``models.hide_lora_vit.HiDeLoRAModel``, ``models.hide_adapter_vit.HiDeAdapterModel``):
  the same two branches, with per-task LoRA (``lora_expert``) or adapters (``adapter_expert``) in place of
  the prefixes, which split the batch by task and put it back in order (batch independent). The routed task
  replaces ``forward_prompt``'s ``task_id`` as above; the router features are the prompt-free final-norm
  class token of ``backbone.forward_features`` (FlyGCL gives these models no RP gate), from the same frozen
  pass as the gate's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Tuple

import torch
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError

from ._assembly import check_assembly
from ._family import AdapterFamily, Plan
from ._layout import Layout
from ._query import SharedPass, class_token, default_query
from ._registry import register_family
from ._seams import SeamError, named_parameters

__all__ = ["HiDe", "retrofit"]

_WHAT = "the official HiDe-Prompt/NoRGa `EPrompt`, called with prompt_idx=..."
_WHAT_PREFIX = "FlyGCL's HiDePrefixModel / NoRGaPrefixModel: forward_gate(x) -> (logits, h), forward_prompt(x, task_id)"
_EXPERT_MODULES = ("lora_expert", "adapter_expert")  # HiDeLoRAModel, HiDeAdapterModel


class HiDe(AdapterFamily):
    """Retrofit a HiDe-Prompt or NoRGa model.

    One ensemble bank per task; the routed task replaces the loop's task identification.

    Args:
        num_experts: tasks (default ``model.e_prompt.pool_size``, one prompt per task; FlyGCL's prefix
            layout: ``model.task_num``).
        original_model: the frozen/TII model whose output ``["pre_logits"]`` are the router features
            (the official layout; FlyGCL's prefix layout routes on its gate features ``h``, its LoRA and adapter
            models on the prompt-free class token).
        query_module, query_from_output: any other module (and output mapping) giving the router features.
        run_query_module: run that module on the model's input (once per stream batch, under ``no_grad``)
            when the loop did not run it first: NoRGa's training loop never runs ``original_model``.
            ``False``: the loop must run it before the model, or ``end_batch`` raises.
        start_expert: the method's own task start (default: nothing; the loop passes ``task_id``).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """

    names = ("hide", "norga")

    def recognise(
        self,
        *,
        num_experts: Optional[int] = None,
        original_model: Optional[nn.Module] = None,
        query_module: Optional[nn.Module] = None,
        query_from_output: Optional[Callable[[Any], Tensor]] = None,
        run_query_module: bool = True,
        start_expert: Optional[Callable[[int], None]] = None,
        router_dim: Optional[int] = None,
    ) -> Plan:
        if _PrefixModel.matches(self.model):
            expert_model = _ExpertModel.matches(self.model)
            given = [name for name, value in (("original_model", original_model), ("query_module", query_module),
                                              ("query_from_output", query_from_output)) if value is not None]
            if given:
                raise InvalidParameterError(
                    f"{self.caller}: {type(self.model).__name__} (FlyGCL's layout) routes on "
                    f"{'the prompt-free class token' if expert_model else 'its own gate features (forward_gate h)'}; "
                    f"{given} are options of the official HiDe-Prompt/NoRGa layout"
                )
            layout = _ExpertModel(self, run_query_module) if expert_model else _PrefixModel(self, run_query_module)
        else:
            if query_module is not None and original_model is not None:
                raise InvalidParameterError(f"{self.caller}: pass either original_model or query_module, not both")
            query_module = query_module if query_module is not None else original_model
            layout = _Official(self, query_module, query_from_output or default_query, run_query_module)
        return dataclasses.replace(layout.plan(num_experts), start_expert=start_expert, router_dim=router_dim)


# ------------------------------------------------------------------------------- the official layout
class _Official(Layout):
    """``e_prompt(..., prompt_idx=...)`` routed with ``prompt_idx=expert[:, None]``, the banks on ``model.head``."""

    def __init__(self, family: HiDe, query_module: Optional[nn.Module], query_from_output: Callable[[Any], Tensor],
                 run_query_module: bool) -> None:
        super().__init__(family)
        self.query_module, self.query_from_output = query_module, query_from_output
        self.run_query_module = run_query_module
        self.prompt: nn.Module = None  # type: ignore[assignment]  (set by plan)

    def plan(self, num_experts: Optional[int]) -> Plan:
        model, options = self.model, self.options
        prompt = getattr(model, "e_prompt", None)
        if not isinstance(prompt, nn.Module):
            raise self.family.missing_seam("e_prompt", _WHAT)
        if "prompt_idx" not in named_parameters(prompt.forward):
            raise self.family.missing_seam("e_prompt.forward(..., prompt_idx=...)", _WHAT)
        num_experts = self.family.count_experts(num_experts, getattr(prompt, "pool_size", None), "tasks")
        if options.router and self.query_module is None:
            raise SeamError(
                f"{self.caller}: router=True needs the router features: pass original_model=... (its output['pre_logits']) "
                "or query_module=... and query_from_output=..."
            )
        if options.router and getattr(prompt, "batchwise_prompt", False):
            raise SeamError(
                f"{self.caller}: e_prompt.batchwise_prompt replaces every sample's prompt_idx by the batch's most frequent "
                "one, so a routed task per sample would be overruled; set e_prompt.batchwise_prompt = False (your "
                "--batchwise_prompt) or retrofit with router=False"
            )
        corrections = check_assembly(prompt, family=self.family.family, router=options.router, correct=options.correct_assembly)
        self.prompt = prompt
        return Plan(head=self.family.find_head(), num_experts=num_experts, layout=self, corrections=corrections)

    @staticmethod
    def used_task(output: Any) -> Optional[Tensor]:
        index = output.get("prompt_idx") if isinstance(output, dict) else None
        return None if index is None else index[:, 0]

    def observe(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> Optional[Tensor]:
        """The task a call used: trained (training) or its ensemble bank (inference)."""
        used, training = self.used_task(output), self.record.training
        if used is not None and training:
            self.record.seen(trained=used)
        return None if training else used

    def install_hooks(self) -> None:
        if self.options.router:
            if self.run_query_module:
                self.run_query_when_missing(self.query_module)
            self.read_query(self.query_module, self.query_from_output, "original_model / query_module")
            self.route_keyword(self.prompt, "prompt_idx", value=lambda experts, *call: experts.unsqueeze(1),
                               used_from_output=self.used_task)
        self.read_banks(self.prompt, self.observe)


# ---------------------------------------------------------------------- FlyGCL's prefix layout


def _task_tensor(task_id: Any, batch: int, device: torch.device) -> Optional[Tensor]:
    """``(B,)`` task ids of a ``forward_prompt`` call (an int or a 0-d tensor is every sample's)."""
    if isinstance(task_id, Tensor):
        return task_id.reshape(-1).long().expand(batch) if task_id.numel() == 1 else task_id.reshape(-1).long()
    if isinstance(task_id, int):
        return torch.full((batch,), task_id, dtype=torch.long, device=device)
    return None


@dataclasses.dataclass
class _PromptCall:
    """The prefix and expert models' part of the record: the running ``forward_prompt`` call.

    Attributes:
        in_prompt: a ``forward_prompt`` call is running (the ensembled head answers only inside one).
        prefix_task: the ``(B,)`` task the running call built its prefixes from (what the branch hands
            to ``backbone.forward_features``), ``None`` until seen.
        kept: the expert models' shared prompt-free pass, kept for its second reader (:class:`SharedPass`).
    """

    in_prompt: bool = False
    prefix_task: Optional[Tensor] = None
    kept: Optional[Tuple[Any, ...]] = None


class _PrefixModel(Layout):
    """Wraps ``forward_gate`` (its ``h`` is the query) and ``forward_prompt`` (the task is routed at
    inference; the banks follow the task used) as instance attributes, undone by ``remove()``.

    Its part of the record is a :class:`_PromptCall` (:attr:`call`).
    """

    def __init__(self, family: HiDe, run_query_module: bool) -> None:
        super().__init__(family)
        self.run_query_module = run_query_module
        model = self.model
        self.gate, self.prompt = model.forward_gate, model.forward_prompt
        self.callee = f"{type(model).__name__}.forward_prompt"
        self.features: Optional[Callable[..., Any]] = None

    @classmethod
    def matches(cls, owner: Any) -> bool:
        """FlyGCL's layout: the two branches as methods, the prompt head, and no E-prompt module."""
        return callable(getattr(owner, "forward_prompt", None)) and callable(getattr(owner, "forward_gate", None)) \
            and isinstance(getattr(owner, "prompt_head", None), nn.Module) and not hasattr(owner, "e_prompt")

    def plan(self, num_experts: Optional[int]) -> Plan:
        model = self.model
        if "task_id" not in named_parameters(model.forward_prompt):
            raise self.family.missing_seam("forward_prompt(x, task_id, ...)", _WHAT_PREFIX)
        if not isinstance(model.prompt_head, nn.Linear):
            raise self.family.missing_seam("prompt_head", "an nn.Linear, the prompt branch's classifier")
        num_experts = self.family.count_experts(num_experts, getattr(model, "task_num", None), "tasks")
        return Plan(head=(model, "prompt_head"), num_experts=num_experts, layout=self)

    @property
    def call(self) -> _PromptCall:
        """This layout's part of the record: the running ``forward_prompt`` call."""
        return self.record.own

    def install_hooks(self) -> None:
        model = self.model
        self.record.own = _PromptCall()
        if self.options.router:
            self.record.query_source = f"the gate features h of {type(model).__name__}.forward_gate"
            self.install.set_attribute(model, "forward_gate", self.forward_gate)
        features = getattr(getattr(model, "backbone", None), "forward_features", None)
        if callable(features) and {"use_prefix", "task_id"} <= named_parameters(features):
            self.features = features
            self.install.set_attribute(model.backbone, "forward_features", self.forward_features)
        self.install.set_attribute(model, "forward_prompt", self.forward_prompt)

    def swap_head(self) -> None:
        # The ensemble answers inside forward_prompt at inference only: FlyGCL's classifier alignment
        # trains prompt_head directly with the model in eval mode, which must reach the online head.
        record = self.record
        self.replace_head(self.model, "prompt_head", is_training=lambda: record.training or not record.own.in_prompt)

    def forward_gate(self, *args: Any, **kwargs: Any) -> Any:
        output = self.gate(*args, **kwargs)
        if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], Tensor):
            self.record.seen(query=output[1])
        return output

    def forward_features(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        use_prefix = kwargs.get("use_prefix", args[0] if args else False)
        if use_prefix:
            self.call.prefix_task = _task_tensor(kwargs.get("task_id", args[1] if len(args) > 1 else None),
                                            x.shape[0], x.device)
        return self.features(x, *args, **kwargs)

    def routed(self, x: Tensor) -> Optional[Tensor]:
        """The routed tasks of an inference call (``None``: not routed)."""
        record = self.record
        if not self.options.router or record.training or not record.routing_active():
            record.eval_query = None
            return None
        if record.eval_query is None and self.run_query_module:
            with torch.no_grad():
                record.eval_query = self.gate(x)[1].detach()  # the loop did not run the gate first
        return record.route(record.pop_query(x.shape[0]))

    def forward_prompt(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        record, call = self.record, self.call
        experts = self.routed(x)
        if experts is not None:
            if args:
                args = (experts, *args[1:])
            else:
                kwargs["task_id"] = experts
        task_id = args[0] if args else kwargs.get("task_id")
        if not record.training:  # the ensemble head answers inside the call: its banks must be set before it
            record.seen(banks=_task_tensor(task_id, x.shape[0], x.device))
        call.prefix_task, call.in_prompt = None, True
        try:
            output = self.prompt(x, *args, **kwargs)
        finally:
            call.in_prompt = False
        used, call.prefix_task = call.prefix_task, None
        if used is None:
            used = _task_tensor(task_id, x.shape[0], x.device)
        if record.training:
            record.seen(x.shape[0], banks=used, trained=used)  # the banks move after the optimizer step
        elif experts is not None and record.wants_observation:
            record.used_by_routed(experts, used, self.callee)
        return output


# --------------------------------------------------------------------- FlyGCL's expert models
class _ExpertModel(_PrefixModel):
    """FlyGCL's ``HiDeLoRAModel`` / ``HiDeAdapterModel``: ``forward_prompt`` wrapped as in the prefix
    layout, the task used read from the expert module's call, and the router features the prompt-free
    class token of the frozen pass ``backbone.forward_features(x)``, which the model's gate runs too: the
    two share one pass (:class:`SharedPass`, through the wrapped ``backbone.forward_features``). In
    training the retrofit runs it at the stream batch's first ``forward_prompt`` and the gate's call that
    follows takes it; at inference (and in training when the loop runs the gate first) the gate's pass is
    kept for the ``forward_prompt`` that follows (one whose loop did not run the gate first runs its own)."""

    def __init__(self, family: HiDe, run_query_module: bool) -> None:
        if not run_query_module:
            raise InvalidParameterError(
                f"{family.caller}: {type(family.model).__name__} has no call the router features can be read from (its "
                "gate runs g_mlp on them), so the retrofit computes them; leave run_query_module=True"
            )
        super().__init__(family, run_query_module)
        self.experts: nn.Module = None  # type: ignore[assignment]  (set by plan)
        self.backbone: nn.Module = None  # type: ignore[assignment]  (set by plan)
        self.shared: SharedPass = None  # type: ignore[assignment]  (set by install, router on)

    @classmethod
    def matches(cls, owner: Any) -> bool:
        """The prefix layout with per-task LoRA or adapters in place of the prefixes."""
        return super().matches(owner) and any(isinstance(getattr(owner, name, None), nn.Module)
                                              for name in _EXPERT_MODULES)

    def plan(self, num_experts: Optional[int]) -> Plan:
        model = self.model
        self.experts = next(getattr(model, name) for name in _EXPERT_MODULES if isinstance(getattr(model, name, None),
                                                                                         nn.Module))
        self.backbone = self.family.backbone_of("the frozen ViT the experts run in", forward_features=True)
        return super().plan(num_experts)

    def install_hooks(self) -> None:
        self.record.own = _PromptCall()
        if self.options.router:
            self.record.query_source = "the prompt-free class token of model.backbone.forward_features (the pass " \
                "of forward_gate, or one run by the retrofit)"
            self.shared = SharedPass(self.backbone, self.call)
            self.install.set_attribute(self.backbone, "forward_features", self.forward_features)
            self.install.add_undo(self.shared.clear)
        self.install.forward_pre_hook(self.experts, self.experts_called, with_kwargs=True)
        self.install.set_attribute(self.model, "forward_prompt", self.forward_prompt)

    def experts_called(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """``experts(backbone, inputs, expert_ids)``: the tasks the running call really uses."""
        ids = kwargs.get("expert_ids", args[2] if len(args) > 2 else None)
        if self.call.in_prompt and isinstance(ids, Tensor):
            self.call.prefix_task = ids.detach().reshape(-1).long()

    def forward_features(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        """The backbone's prompt-free pass (the gate's): the retrofit's when it ran it for this very call;
        kept for a ``forward_prompt`` that follows and needs the router features (routed inference, or a
        stream batch's first training forward in a loop that runs the gate first)."""
        record = self.record
        if args or kwargs or not isinstance(x, Tensor):
            return self.shared.features(x, *args, **kwargs)
        return self.shared.run(x, keep=record.query is None if record.training else record.routing_active())

    def query(self, x: Tensor, *, keep: bool) -> Tensor:
        """The router features of ``x``, from the shared pass (kept for the gate's call when ``keep``)."""
        with torch.no_grad():
            return class_token(self.shared.run(x, keep=keep)).detach().clone()

    def routed(self, x: Tensor) -> Optional[Tensor]:
        record = self.record
        if not self.options.router or record.training or not record.routing_active():
            return None
        return record.route(self.query(x, keep=False))

    def forward_prompt(self, x: Tensor, *args: Any, **kwargs: Any) -> Any:
        record = self.record
        if self.options.router and record.training and record.query is None:
            record.seen(query=self.query(x, keep=True))  # the stream batch's first training forward
        return super().forward_prompt(x, *args, **kwargs)


retrofit = register_family(HiDe)
