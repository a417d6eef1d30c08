"""S-Prompts as FlyGCL ships it (``models.sprompt.SPrompt``): one prompt set per task (an expert), chosen
per sample by the ``expert_ids`` argument of ``model.forward(inputs, expert_ids=None)``; ``None`` means the
training task ``model.task_count``. Its trainer picks ``expert_ids`` at evaluation by nearest task prototype
(k-means of prompt-free class tokens); the router replaces that choice. One ensemble bank per task on
``model.backbone.fc``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError

from ._handle import Retrofit
from ._options import RetrofitOptions
from ._registry import register_family
from ._wiring import Wiring, backbone_of, count_experts, find_head, missing_seam, named_parameters, step_counter

__all__ = ["retrofit"]

_WHAT = "FlyGCL's S-Prompts: model.forward(inputs, expert_ids=None) and model.experts(backbone, inputs, expert_ids)"


def _expert_ids(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tensor]:
    """``expert_ids`` of a call ``experts(backbone, inputs, expert_ids)``."""
    value = kwargs.get("expert_ids", args[2] if len(args) > 2 else None)
    return value if isinstance(value, Tensor) else None


@register_family("sprompt")
def retrofit(
    model: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: Optional[int] = None,
    start_expert: Optional[Callable[[int], None]] = None,
    router_dim: Optional[int] = None,
) -> Retrofit:
    """Retrofit FlyGCL's S-Prompts model.

    Args:
        num_experts: tasks (default ``model.experts.num_experts``, FlyGCL's ``task_num``).
        start_expert: the method's own expert start; default ``model.process_task_count()`` up to the
            expert (what FlyGCL's trainer calls at each task end).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """
    owner = "fly_modules.adapters.sprompt"
    experts = getattr(model, "experts", None)
    if not isinstance(experts, nn.Module) or not isinstance(getattr(experts, "prompts", None), Tensor):
        raise missing_seam("sprompt", model, "experts", _WHAT)
    if not {"backbone", "inputs", "expert_ids"} <= named_parameters(experts.forward):
        raise missing_seam("sprompt", model, "experts.forward(backbone, inputs, expert_ids)", _WHAT)
    if "expert_ids" not in named_parameters(model.forward):
        raise missing_seam("sprompt", model, "forward(inputs, expert_ids=None)", _WHAT)
    backbone = backbone_of(model, "sprompt", "the ViT the prompts are inserted into", forward_features=True)
    num_experts = count_experts(num_experts, getattr(experts, "num_experts", None), "sprompt", "tasks")
    if num_experts > experts.prompts.shape[1]:
        raise InvalidParameterError(
            f"{owner}: num_experts={num_experts} but model.experts.prompts holds {experts.prompts.shape[1]} prompt sets"
        )
    head_owner, head_name = find_head(backbone, "sprompt")
    wiring = Wiring.create(
        model, "sprompt", options, classifier=getattr(head_owner, head_name), num_experts=num_experts,
        num_banks=num_experts, banks_of_expert=lambda expert: [int(expert)], start_expert=start_expert,
        counter=step_counter(model), router_dim=router_dim,
    )
    handle = wiring.handle
    if not options.router and not options.ensemble:
        return handle
    callee = f"{type(experts).__name__}.forward"
    if options.router:
        wiring.query_class_token(model, backbone)
        wiring.hook_route_module(model, route_kwarg="expert_ids", route_value=None, query_from_call=None,
                                 banks_follow_routing=False)
    wiring.hook_batch_size(model)

    def observe(module: nn.Module, args: Any, kwargs: Any, output: Any) -> Optional[Tensor]:
        used = _expert_ids(args, kwargs)
        if used is None:
            return None
        if handle.training:
            handle.note_trained(used)
        else:
            injected = wiring.batch.injected  # set by the routing pre-hook of this forward
            if injected is not None and handle.wants_observation:
                handle.note_routed(injected, used, callee)
        return used

    wiring.hook_banks(experts, observe)
    if options.ensemble:
        wiring.swap_head(head_owner, head_name)
    return handle
