"""HiDe-Prompt / NoRGa retrofit: our reference ``hide``/``norga`` and the official codebases
(thu-ml/HiDe-Prompt, Minhchuyentoancbn/MoE_PromptCL).

A model that implements the fly-modules seam contract goes to
:func:`fly_modules.adapters.reference.retrofit`. Otherwise the adapter recognises the official layout:
``model(x, task_id=-1, prompt_id=None, prompt_weight=None, train=False, fc_only=False,
prompt_momentum=0)`` returning a dict, the E-prompt ``model.e_prompt`` called as
``e_prompt(x_embed, prompt_mask=None, prompt_idx=None, prompt_weight=None, prompt_momentum=0)``
(one of the three selects the prompts; the returned dict holds ``prompt_idx``), the prompt head
``model.head``. Task identification (TII) is done by the loop: a trained ``original_model``'s class
prediction is mapped to a task and passed as ``prompt_id``.

* ``router=True``: at inference the routed task replaces the TII task: a forward pre-hook on
  ``model.e_prompt`` injects ``prompt_idx = expert[:, None]`` (the call's own ``prompt_id`` is
  overridden). The router features are those the user chooses: by default the ``pre_logits`` of
  ``original_model`` (pass it; its forward runs anyway for TII, before ``model``), or the output of
  ``query_module`` through ``query_from_output``. The router target is the current task. Training is
  untouched.
* ``ensemble=True``: one bank per task on the prompt head ``model.head`` only (the TII head is not
  touched). Training moves the current task's bank; at inference each sample uses the bank of the task
  its prompt came from (``prompt_idx[:, 0]`` of the E-prompt's output: the routed task, or the TII task
  without the router). ``handle.start_expert(t)`` re-clones bank ``t``; the reference clones the next
  bank after classifier alignment at the end of a task, so call it after your CA step (or pass a
  ``SessionSchedule`` and call ``start_session`` after CA).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from torch import Tensor, nn

from ._core import Retrofit, Schedule, SeamError, missing_seam, undo_on_failure
from .generic import default_query, find_head, make_wiring, reference_or_none

__all__ = ["retrofit"]


@undo_on_failure
def retrofit(
    model: nn.Module,
    *,
    num_experts: Optional[int] = None,
    original_model: Optional[nn.Module] = None,
    query_module: Optional[nn.Module] = None,
    query_from_output: Optional[Callable[[Any], Tensor]] = None,
    router: bool = True,
    ensemble: bool = True,
    optimizer: Optional[torch.optim.Optimizer] = None,
    schedule: Schedule = None,
    start_expert: Optional[Callable[[int], None]] = None,
    router_dim: Optional[int] = None,
    expansion_dim: int = 10_000,
    ridge: Any = 1e4,
    seed: int = 0,
    decays: Sequence[float] = (0.9, 0.99),
    aggregate: str = "softmax_max",
) -> Retrofit:
    """Retrofit a HiDe-Prompt / NoRGa model; see the module docstring.

    Args:
        model: the HiDe-Prompt or NoRGa model.
        num_experts: tasks (default ``model.e_prompt.pool_size``, one prompt per task).
        original_model: the frozen/TII model whose output ``["pre_logits"]`` are the router features.
        query_module, query_from_output: any other module (and output mapping) giving the router features.
        start_expert: the method's own task start (default: nothing; the loop passes ``task_id``).
        The other arguments are those of :func:`fly_modules.adapters.generic.retrofit`.
    """
    common: Dict[str, Any] = dict(
        optimizer=optimizer, schedule=schedule, expansion_dim=expansion_dim, ridge=ridge, seed=seed,
        decays=decays, aggregate=aggregate,
    )
    upstream_only = dict(original_model=original_model, query_module=query_module,
                         query_from_output=query_from_output, start_expert=start_expert, router_dim=router_dim)
    handle = reference_or_none(model, "hide", num_experts, upstream_only, router=router, ensemble=ensemble, **common)
    if handle is not None:
        return handle
    what = "the official HiDe-Prompt/NoRGa `EPrompt`, called with prompt_idx=..."
    prompt = getattr(model, "e_prompt", None)
    if not isinstance(prompt, nn.Module):
        raise missing_seam("hide", model, "e_prompt", what)
    if "prompt_idx" not in inspect.signature(prompt.forward).parameters:
        raise missing_seam("hide", model, "e_prompt.forward(..., prompt_idx=...)", what)
    if num_experts is None:
        num_experts = getattr(prompt, "pool_size", None)
        if num_experts is None:
            raise TypeError("fly_modules.adapters.hide: pass num_experts (the number of tasks)")
    if query_module is not None and original_model is not None:
        raise TypeError("fly_modules.adapters.hide: pass either original_model or query_module, not both")
    query_module = query_module if query_module is not None else original_model
    if router and query_module is None:
        raise SeamError(
            "fly_modules.adapters.hide: router=True needs the router features: pass original_model=... (its "
            "output['pre_logits']) or query_module=... and query_from_output=..."
        )
    head_owner, head_name = find_head(model, "hide")
    wiring = make_wiring(
        model, "hide", classifier=getattr(head_owner, head_name), num_experts=int(num_experts),
        num_banks=int(num_experts), banks_of_expert=lambda expert: [int(expert)], start_method_expert=start_expert,
        router=router, ensemble=ensemble, router_dim=router_dim, **common,
    )
    handle = wiring.handle
    if not router and not ensemble:
        return handle
    if router:
        wiring.hook_query_module(query_module, query_from_output or default_query)
        wiring.hook_route_module(
            prompt, route_kwarg="prompt_idx", route_value=lambda experts, module, args, kwargs: experts.unsqueeze(1),
            query_from_call=None, banks_follow_routing=False,
        )
    if ensemble:
        def banks(module: nn.Module, args: Any, kwargs: Any, output: Any) -> Optional[Tensor]:
            if handle.training or not isinstance(output, dict) or output.get("prompt_idx") is None:
                return None
            return output["prompt_idx"][:, 0]

        wiring.hook_banks(prompt, banks)
        wiring.swap_head(head_owner, head_name)
    return handle
