"""FlyGCL's HiDe-Prompt / NoRGa port (``models.hide_norga_prefix_vit``: ``HiDePrefixModel``,
``NoRGaPrefixModel``): no ``forward``; the trainer calls ``forward_gate(x)`` (the task-identification branch,
``g_mlp`` on the prompt-free class token) and ``forward_prompt(x, task_id, ...)`` (per-task prefixes, the
prompt head). At inference the routed task replaces the ``task_id`` the trainer derived from the gate;
the router features are the gate features ``h`` (what FlyGCL's ``--use_rp_gate`` collects).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError, check_int

from ._errors import missing_seam
from ._handle import Retrofit
from ._options import RetrofitOptions
from ._signatures import named_parameters
from ._wiring import Wiring

__all__ = ["is_prefix_model", "wire_prefix_model"]

_WHAT = "FlyGCL's HiDePrefixModel / NoRGaPrefixModel: forward_gate(x) -> (logits, h), forward_prompt(x, task_id)"


def is_prefix_model(model: nn.Module) -> bool:
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


def wire_prefix_model(
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
    owner = f"fly_modules.adapters.{family}"
    if "task_id" not in named_parameters(model.forward_prompt):
        raise missing_seam(family, model, "forward_prompt(x, task_id, ...)", _WHAT)
    if not isinstance(model.prompt_head, nn.Linear):
        raise missing_seam(family, model, "prompt_head", "an nn.Linear, the prompt branch's classifier")
    if num_experts is None:
        num_experts = getattr(model, "task_num", None)
        if num_experts is None:
            raise InvalidParameterError(f"{owner}: pass num_experts (the number of tasks)")
    num_experts = check_int(num_experts, "num_experts", owner=owner, minimum=1)
    wiring = Wiring.create(
        model, family, options, classifier=model.prompt_head, num_experts=num_experts, num_banks=num_experts,
        banks_of_expert=lambda expert: [int(expert)], start_method_expert=start_expert, router_dim=router_dim,
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
            wiring.eval_query = None
            return None
        if wiring.eval_query is None and run_query_module:
            with torch.no_grad():
                wiring.eval_query = gate(x)[1].detach()  # the loop did not run the gate first
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
