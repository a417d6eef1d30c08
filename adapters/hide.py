"""HiDe-Prompt / NoRGa: our reference ``hide``/``norga``, the official codebases (thu-ml/HiDe-Prompt,
Minhchuyentoancbn/MoE_PromptCL) and FlyGCL's port. The routed task replaces the loop's task identification
(TII), in two layouts:

* the official one: the task is injected as ``e_prompt(..., prompt_idx=expert[:, None])``, with one
  ensemble bank per task on ``model.head``; the router features are ``original_model``'s ``pre_logits``;
* FlyGCL's prefix models (``models.hide_norga_prefix_vit``: ``HiDePrefixModel``, ``NoRGaPrefixModel``) have
  no ``forward``: the trainer calls ``forward_gate(x)`` (the task-identification branch, ``g_mlp`` on the
  prompt-free class token) and ``forward_prompt(x, task_id, ...)`` (per-task prefixes, the prompt head).
  At inference the routed task replaces the ``task_id`` the trainer derived from the gate; the router
  features are the gate features ``h`` (what FlyGCL's ``--use_rp_gate`` collects).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError

from ._handle import Retrofit
from ._options import RetrofitOptions
from ._prompt_pools import check_assembly, install_assembly_correction
from ._registry import register_family
from ._wiring import SeamError, Wiring, count_experts, default_query, find_head, missing_seam, named_parameters

__all__ = ["retrofit"]

_WHAT = "the official HiDe-Prompt/NoRGa `EPrompt`, called with prompt_idx=..."
_WHAT_PREFIX = "FlyGCL's HiDePrefixModel / NoRGaPrefixModel: forward_gate(x) -> (logits, h), forward_prompt(x, task_id)"


@register_family("hide", "norga")
def retrofit(
    model: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: Optional[int] = None,
    original_model: Optional[nn.Module] = None,
    query_module: Optional[nn.Module] = None,
    query_from_output: Optional[Callable[[Any], Tensor]] = None,
    run_query_module: bool = True,
    start_expert: Optional[Callable[[int], None]] = None,
    router_dim: Optional[int] = None,
) -> Retrofit:
    """Retrofit a HiDe-Prompt or NoRGa model.

    Args:
        num_experts: tasks (default ``model.e_prompt.pool_size``, one prompt per task; FlyGCL's prefix
            layout: ``model.task_num``).
        original_model: the frozen/TII model whose output ``["pre_logits"]`` are the router features
            (the official layout; FlyGCL's prefix layout routes on its gate features ``h``).
        query_module, query_from_output: any other module (and output mapping) giving the router features.
        run_query_module: run that module on the model's input (once per stream batch, under ``no_grad``)
            when the loop did not run it first: NoRGa's training loop never runs ``original_model``.
            ``False``: the loop must run it before the model, or ``end_batch`` raises.
        start_expert: the method's own task start (default: nothing; the loop passes ``task_id``).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """
    owner = "fly_modules.adapters.hide"
    if _is_prefix_model(model) and not hasattr(model, "e_prompt"):
        given = [name for name, value in (("original_model", original_model), ("query_module", query_module),
                                          ("query_from_output", query_from_output)) if value is not None]
        if given:
            raise InvalidParameterError(
                f"{owner}: {type(model).__name__} (FlyGCL's prefix layout) routes on its own gate features "
                f"(forward_gate's h); {given} are options of the official HiDe-Prompt/NoRGa layout"
            )
        return _wire_prefix_model(model, options, family="hide", num_experts=num_experts,
                                 run_query_module=run_query_module, start_expert=start_expert, router_dim=router_dim)
    return _wire_official(model, options, num_experts=num_experts, original_model=original_model,
                          query_module=query_module, query_from_output=query_from_output,
                          run_query_module=run_query_module, start_expert=start_expert, router_dim=router_dim)


def _wire_official(
    model: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: Optional[int],
    original_model: Optional[nn.Module],
    query_module: Optional[nn.Module],
    query_from_output: Optional[Callable[[Any], Tensor]],
    run_query_module: bool,
    start_expert: Optional[Callable[[int], None]],
    router_dim: Optional[int],
) -> Retrofit:
    """The official layout: ``e_prompt(..., prompt_idx=...)`` routed, the banks on ``model.head``."""
    owner = "fly_modules.adapters.hide"
    prompt = getattr(model, "e_prompt", None)
    if not isinstance(prompt, nn.Module):
        raise missing_seam("hide", model, "e_prompt", _WHAT)
    if "prompt_idx" not in named_parameters(prompt.forward):
        raise missing_seam("hide", model, "e_prompt.forward(..., prompt_idx=...)", _WHAT)
    num_experts = count_experts(num_experts, getattr(prompt, "pool_size", None), "hide", "tasks")
    if query_module is not None and original_model is not None:
        raise InvalidParameterError(f"{owner}: pass either original_model or query_module, not both")
    query_module = query_module if query_module is not None else original_model
    if options.router and query_module is None:
        raise SeamError(
            f"{owner}: router=True needs the router features: pass original_model=... (its output['pre_logits']) "
            "or query_module=... and query_from_output=..."
        )
    if options.router and getattr(prompt, "batchwise_prompt", False):
        raise SeamError(
            f"{owner}: e_prompt.batchwise_prompt replaces every sample's prompt_idx by the batch's most frequent one, "
            "so a routed task per sample would be overruled; set e_prompt.batchwise_prompt = False (your "
            "--batchwise_prompt) or retrofit with router=False"
        )
    head_owner, head_name = find_head(model, "hide")
    correct = check_assembly(prompt, family="hide", router=options.router, correct=options.correct_assembly)
    wiring = Wiring.create(
        model, "hide", options, classifier=getattr(head_owner, head_name), num_experts=num_experts,
        num_banks=num_experts, banks_of_expert=lambda expert: [int(expert)], start_expert=start_expert,
        router_dim=router_dim,
    )
    handle = wiring.handle
    if correct:
        install_assembly_correction(handle, prompt)
    if not options.router and not options.ensemble:
        return handle

    def used_task(output: Any) -> Optional[Tensor]:
        index = output.get("prompt_idx") if isinstance(output, dict) else None
        return None if index is None else index[:, 0]

    if options.router:
        handle.query_source = f"the forward of {type(query_module).__name__} (original_model / query_module)"
        if run_query_module:
            wiring.run_query_when_missing(model, query_module)
        wiring.hook_query_module(query_module, query_from_output or default_query)
        wiring.hook_route_module(
            prompt, route_kwarg="prompt_idx", route_value=lambda experts, module, args, kwargs: experts.unsqueeze(1),
            query_from_call=None, banks_follow_routing=False, used_from_output=used_task,
        )

    def observe(module: nn.Module, args: Any, kwargs: Any, output: Any) -> Optional[Tensor]:
        used = used_task(output)
        if used is not None and handle.training:
            handle.note_trained(used)
        return None if handle.training else used

    wiring.hook_banks(prompt, observe)
    if options.ensemble:
        wiring.swap_head(head_owner, head_name)
    return handle


# ---------------------------------------------------------------------- FlyGCL's prefix layout
def _is_prefix_model(model: nn.Module) -> bool:
    """FlyGCL's layout: the two branches as methods, the prompt head, and no E-prompt module."""
    return callable(getattr(model, "forward_prompt", None)) and callable(getattr(model, "forward_gate", None)) \
        and isinstance(getattr(model, "prompt_head", None), nn.Module)


def _task_tensor(task_id: Any, batch: int, device: torch.device) -> Optional[Tensor]:
    """``(B,)`` task ids of a ``forward_prompt`` call (an int or a 0-d tensor is every sample's)."""
    if isinstance(task_id, Tensor):
        return task_id.reshape(-1).long().expand(batch) if task_id.numel() == 1 else task_id.reshape(-1).long()
    if isinstance(task_id, int):
        return torch.full((batch,), task_id, dtype=torch.long, device=device)
    return None


def _wire_prefix_model(
    model: nn.Module,
    options: RetrofitOptions,
    *,
    family: str,
    num_experts: Optional[int],
    run_query_module: bool,
    start_expert: Optional[Callable[[int], None]],
    router_dim: Optional[int],
) -> Retrofit:
    """Wrap ``forward_gate`` (its ``h`` is the query) and ``forward_prompt`` (the task is routed at
    inference; the banks follow the task used) as instance attributes, undone by ``remove()``."""
    if "task_id" not in named_parameters(model.forward_prompt):
        raise missing_seam(family, model, "forward_prompt(x, task_id, ...)", _WHAT_PREFIX)
    if not isinstance(model.prompt_head, nn.Linear):
        raise missing_seam(family, model, "prompt_head", "an nn.Linear, the prompt branch's classifier")
    num_experts = count_experts(num_experts, getattr(model, "task_num", None), family, "tasks")
    wiring = Wiring.create(
        model, family, options, classifier=model.prompt_head, num_experts=num_experts, num_banks=num_experts,
        banks_of_expert=lambda expert: [int(expert)], start_expert=start_expert, router_dim=router_dim,
    )
    handle = wiring.handle
    if not options.router and not options.ensemble:
        return handle
    gate, prompt = model.forward_gate, model.forward_prompt
    callee = f"{type(model).__name__}.forward_prompt"
    if options.router:
        handle.query_source = f"the gate features h of {type(model).__name__}.forward_gate"

        def forward_gate(*args: Any, **kwargs: Any) -> Any:
            output = gate(*args, **kwargs)
            if wiring.active and isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], Tensor):
                wiring.query_seen(output[1])
            return output

        handle.install.set_attribute(model, "forward_gate", forward_gate)

    def routed(x: Tensor) -> Optional[Tensor]:
        if not options.router or handle.training or not handle.routing_active():
            wiring.batch.eval_query = None
            return None
        if wiring.batch.eval_query is None and run_query_module:
            with torch.no_grad():
                wiring.batch.eval_query = gate(x)[1].detach()  # the loop did not run the gate first
        return wiring.route(wiring.pop_query(x.shape[0]))

    inside = {"prompt": False}  # a forward_prompt call is running
    # What the prefixes were built from: the task_id the branch hands to backbone.forward_features.
    seen: Dict[str, Optional[Tensor]] = {}
    backbone = getattr(model, "backbone", None)
    features = getattr(backbone, "forward_features", None)
    if callable(features) and {"use_prefix", "task_id"} <= named_parameters(features):
        def forward_features(x: Tensor, *args: Any, **kwargs: Any) -> Any:
            use_prefix = kwargs.get("use_prefix", args[0] if args else False)
            if wiring.active and use_prefix:
                seen["task"] = _task_tensor(kwargs.get("task_id", args[1] if len(args) > 1 else None),
                                            x.shape[0], x.device)
            return features(x, *args, **kwargs)

        handle.install.set_attribute(backbone, "forward_features", forward_features)

    def forward_prompt(x: Tensor, *args: Any, **kwargs: Any) -> Any:
        if not wiring.active:
            return prompt(x, *args, **kwargs)
        experts = routed(x)
        if experts is not None:
            if args:
                args = (experts, *args[1:])
            else:
                kwargs["task_id"] = experts
            handle.observed["routed"] = experts
        task_id = args[0] if args else kwargs.get("task_id")
        if not handle.training:  # the ensemble head answers inside the call: its banks must be set before it
            wiring.banks_seen(_task_tensor(task_id, x.shape[0], x.device))
        seen.clear()
        inside["prompt"] = True
        try:
            output = prompt(x, *args, **kwargs)
        finally:
            inside["prompt"] = False
        used = seen.pop("task", None)
        if used is None:
            used = _task_tensor(task_id, x.shape[0], x.device)
        if handle.training:
            wiring.batch_seen(x.shape[0])
            if used is not None:
                handle.note_trained(used)
            wiring.banks_seen(used)  # moved after the optimizer step
        elif experts is not None and handle.wants_observation:
            handle.note_routed(experts, used, callee)
        return output

    handle.install.set_attribute(model, "forward_prompt", forward_prompt)
    if options.ensemble:
        # The ensemble answers inside forward_prompt at inference only: FlyGCL's classifier alignment
        # trains prompt_head directly with the model in eval mode, which must reach the online head.
        wiring.swap_head(model, "prompt_head", is_training=lambda: handle.training or not inside["prompt"])
    return handle
