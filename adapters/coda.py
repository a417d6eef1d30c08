"""CODA-Prompt as FlyGCL ships it (``models.codaprompt.CodaPrompt``): a pool of prompt components, one block
of ``num_pt_per_task`` per task, mixed per sample by attention weights. Training on task ``t`` uses the
components ``[0, (t+1)·pt)`` (the earlier blocks detached, so a block stops changing after its task);
inference uses the window of the current ``task_count``.

Routing: the routed task ``e`` gives the sample the component window ``[0, (e+1)·pt)``, the one its task
was trained with; the attention weights inside the window are CODA's own. The samples of a batch are
grouped by routed task and the model's own forward runs once per group with ``task_count = e`` (never once
per sample); nothing else changes. One ensemble bank per task on ``model.backbone.fc``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError

from ._handle import Retrofit
from ._options import RetrofitOptions
from ._registry import register_family
from ._wiring import SeamError, Wiring, backbone_of, count_experts, find_head, merge_groups, missing_seam, step_counter

__all__ = ["retrofit"]

_WHAT = "FlyGCL's CodaPrompt: task_count, num_pt_per_task, e_k_<layer> component keys, forward(inputs)"


@register_family("coda_prompt", "codaprompt")
def retrofit(
    model: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: Optional[int] = None,
    start_expert: Optional[Callable[[int], None]] = None,
    router_dim: Optional[int] = None,
) -> Retrofit:
    """Retrofit FlyGCL's CODA-Prompt model.

    Args:
        num_experts: tasks (default ``model.task_num``).
        start_expert: the method's own expert start; default ``model.process_task_count()`` up to the
            expert (what FlyGCL's trainer calls at each task end: the next block is re-initialised).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """
    owner = "fly_modules.adapters.coda_prompt"
    inner = getattr(model, "prompt", None)
    if isinstance(inner, nn.Module) and hasattr(inner, "task_count") and not hasattr(model, "pos_e_prompt"):
        raise SeamError(
            f"{owner}: {type(model).__name__} keeps CODA-Prompt's components in a separate `prompt` module "
            f"({type(inner).__name__}, called inside the ViT's blocks: the Mammoth / LAMDA-PILOT layout), which this "
            "family does not wire; only FlyGCL's CodaPrompt (components on the model, forward(inputs)) is supported. "
            "The same mapping applies (a routed task t gets the component window [0, (t+1)*pt) of prompt.task_count), "
            "but it is not implemented or verified for this layout"
        )
    layers = getattr(model, "pos_e_prompt", None)
    if not isinstance(layers, Tensor) or not all(hasattr(model, f"e_k_{int(i)}") for i in layers):
        raise missing_seam("coda_prompt", model, "pos_e_prompt` and `e_k_<layer>", _WHAT)
    if not isinstance(getattr(model, "num_pt_per_task", None), int) or model.num_pt_per_task < 1:
        raise missing_seam("coda_prompt", model, "num_pt_per_task", "components per task, an int >= 1")
    counter = step_counter(model)
    if counter is None or counter.attribute != "task_count":
        raise missing_seam("coda_prompt", model, "task_count` and `process_task_count()", _WHAT)
    backbone = backbone_of(model, "coda_prompt", "the ViT the prompts are inserted into", forward_features=True)
    num_experts = count_experts(num_experts, getattr(model, "task_num", None), "coda_prompt", "tasks")
    components = int(getattr(model, f"e_k_{int(layers[0])}").shape[0])
    if num_experts * model.num_pt_per_task > components:
        raise InvalidParameterError(
            f"{owner}: num_experts={num_experts} tasks of {model.num_pt_per_task} components need "
            f"{num_experts * model.num_pt_per_task}, the pool holds {components}"
        )
    head_owner, head_name = find_head(backbone, "coda_prompt")
    wiring = Wiring.create(
        model, "coda_prompt", options, classifier=getattr(head_owner, head_name), num_experts=num_experts,
        num_banks=num_experts, banks_of_expert=lambda expert: [int(expert)], start_expert=start_expert,
        counter=counter, router_dim=router_dim,
    )
    handle = wiring.handle
    if not options.router and not options.ensemble:
        return handle
    if options.router:
        wiring.query_class_token(model, backbone)  # CODA's own query
    original = model.forward

    def windowed(inputs: Tensor, expert: int, *args: Any, **kwargs: Any) -> Any:
        """The model's own forward with the component window of ``expert``."""
        saved = model.task_count
        model.__dict__["task_count"] = int(expert)
        try:
            wiring.batch.eval_banks = torch.full((inputs.shape[0],), int(expert), dtype=torch.long, device=inputs.device)
            return original(inputs, *args, **kwargs)
        finally:
            model.__dict__["task_count"] = saved

    def forward(inputs: Tensor, *args: Any, **kwargs: Any) -> Any:
        if not wiring.active:
            return original(inputs, *args, **kwargs)
        if handle.training:
            wiring.batch_seen(inputs.shape[0])
            current = torch.full((inputs.shape[0],), int(model.task_count), dtype=torch.long, device=inputs.device)
            handle.note_trained(current)
            wiring.banks_seen(current)
            return original(inputs, *args, **kwargs)
        experts = None
        if options.router and handle.routing_active():
            experts = wiring.route(wiring.pop_query(inputs.shape[0]))
        wiring.batch.eval_query = None
        if experts is None:
            return windowed(inputs, int(model.task_count), *args, **kwargs)
        handle.observed["routed"] = experts
        parts, rows = [], []
        for expert in torch.unique(experts).tolist():
            index = (experts == expert).nonzero().squeeze(1)
            parts.append(windowed(inputs[index], expert, *args, **kwargs))
            rows.append(index)
        return merge_groups(parts, rows)

    handle.install.set_attribute(model, "forward", forward)
    if options.ensemble:
        wiring.swap_head(head_owner, head_name)
    return handle
