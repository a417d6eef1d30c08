"""HiDe-Prompt / NoRGa: our reference ``hide``/``norga``, the official codebases (thu-ml/HiDe-Prompt,
Minhchuyentoancbn/MoE_PromptCL) and FlyGCL's port. The routed task replaces the loop's task identification
(TII): in the official layout it is injected as ``e_prompt(..., prompt_idx=expert[:, None])`` with one
ensemble bank per task on ``model.head``; FlyGCL's prefix layout is wired by ``_prefix_hide``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError, check_int

from ._assembly import check_assembly, install_assembly_correction
from ._errors import SeamError, missing_seam
from ._handle import Retrofit
from ._head import find_head
from ._options import RetrofitOptions
from ._prefix_hide import is_prefix_model, wire_prefix_model
from ._registry import register_family
from ._signatures import named_parameters
from ._wiring import Wiring, default_query

__all__ = ["retrofit"]

_WHAT = "the official HiDe-Prompt/NoRGa `EPrompt`, called with prompt_idx=..."


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
    if is_prefix_model(model) and not hasattr(model, "e_prompt"):
        given = [name for name, value in (("original_model", original_model), ("query_module", query_module),
                                          ("query_from_output", query_from_output)) if value is not None]
        if given:
            raise InvalidParameterError(
                f"{owner}: {type(model).__name__} (FlyGCL's prefix layout) routes on its own gate features "
                f"(forward_gate's h); {given} are options of the official HiDe-Prompt/NoRGa layout"
            )
        return wire_prefix_model(model, options, family="hide", num_experts=num_experts,
                                 run_query_module=run_query_module, start_expert=start_expert, router_dim=router_dim)
    prompt = getattr(model, "e_prompt", None)
    if not isinstance(prompt, nn.Module):
        raise missing_seam("hide", model, "e_prompt", _WHAT)
    if "prompt_idx" not in named_parameters(prompt.forward):
        raise missing_seam("hide", model, "e_prompt.forward(..., prompt_idx=...)", _WHAT)
    if num_experts is None:
        num_experts = getattr(prompt, "pool_size", None)
        if num_experts is None:
            raise InvalidParameterError(f"{owner}: pass num_experts (the number of tasks)")
    num_experts = check_int(num_experts, "num_experts", owner=owner, minimum=1)
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
        num_banks=num_experts, banks_of_expert=lambda expert: [int(expert)], start_method_expert=start_expert,
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
