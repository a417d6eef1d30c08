"""DualPrompt / MISA: our reference methods, JH-LEE ``dualprompt-pytorch``, and the Si-Blurry-lineage
``DualPrompt`` models (FlyGCL, MISA: routed through ``e_prompt.forward(query, s, e)``; Si-Blurry:
ensemble only, its ``Prompt.forward(query, **kwargs)`` has no slot range to route).

Each expert (step) owns ``slots_per_expert`` contiguous E-prompt slots; the router picks the step and
the method's own key match runs inside its slots. Ensemble banks are per slot.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError, check_int

from ._errors import SeamError, missing_seam
from ._handle import Retrofit
from ._head import find_head
from ._jhlee import jhlee_prompt_module, slice_layout, wire_jhlee
from ._options import RetrofitOptions
from ._registry import register_family
from ._signatures import named_parameters, require_keyword
from ._steps import expert_starter, step_counter
from ._wiring import Wiring, default_query

__all__ = ["retrofit"]

_WHAT = (
    "the E-prompt pool: JH-LEE `EPrompt` (with `prompt_key`) or Si-Blurry/MISA/FlyGCL `Prompt` (with `key` "
    "and `prompts`)"
)
_UNROUTABLE = (
    "this E-prompt selects by a pool-wide key match in training as well, so no step owns a prompt and there is "
    "no expert for the router to pick (Si-Blurry's DualPrompt); retrofit it with router=False (the ensemble "
    "works: one bank per prompt), or give the model a step-restricted selection"
)


def _merge_groups(parts: List[Any], rows: List[Tensor]) -> Any:
    """Put per-group outputs (tensors, tuples, lists, dicts of them) back in batch order.

    ``rows[g]`` holds the batch positions of group ``g``. A tensor whose first dimension is not its
    group's size is taken as a squeezed batch dimension of a one-sample group (``x[idx].squeeze()``
    in the upstream code); anything that is not a tensor is taken from the last group.
    """
    first = parts[0]
    if isinstance(first, Tensor):
        shaped = []
        for part, index in zip(parts, rows):
            if part.ndim == 0 or part.shape[0] != index.numel():
                if index.numel() != 1:
                    raise ValueError(
                        f"cannot merge a per-group output of shape {tuple(part.shape)} for a group of {index.numel()} samples"
                    )
                part = part.unsqueeze(0)
            shaped.append(part)
        order = torch.cat(rows).to(first.device)
        return torch.cat(shaped)[torch.argsort(order)]
    if isinstance(first, (tuple, list)):
        merged = [_merge_groups([p[i] for p in parts], rows) for i in range(len(first))]
        return type(first)(merged) if isinstance(first, list) else tuple(merged)
    if isinstance(first, dict):
        return {key: _merge_groups([p[key] for p in parts], rows) for key in first}
    return parts[-1]


def _slot_range(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Optional[int], Optional[int]]:
    s = kwargs.get("s", args[0] if len(args) > 0 else None)
    e = kwargs.get("e", args[1] if len(args) > 1 else None)
    return s, e


def _wire_key_pool(
    model: nn.Module,
    prompt: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: Optional[int],
    slots_per_expert: Optional[int],
    query_module: Optional[nn.Module],
    query_from_output: Optional[Callable[[Any], Tensor]],
    start_expert: Optional[Callable[[int], None]],
    router_dim: Optional[int],
) -> Retrofit:
    """The Si-Blurry lineage: ``e_prompt(query[, s, e])`` wrapped so that inference calls run once per
    routed step present in the batch (never once per sample) with that step's ``s, e``."""
    owner_name = "fly_modules.adapters.dualprompt"
    routable = {"s", "e"} <= named_parameters(prompt.forward)
    if options.router:
        callee = f"{type(prompt).__name__}.forward"
        require_keyword(prompt.forward, "s", family="dualprompt", callee=callee, why=_UNROUTABLE)
        require_keyword(prompt.forward, "e", family="dualprompt", callee=callee, why=_UNROUTABLE)
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        raise missing_seam("dualprompt", model, "backbone", "the ViT whose classifier is the online head")
    head_owner, head_name = find_head(backbone, "dualprompt")
    if num_experts is None:
        num_experts = getattr(model, "task_num", None)
        if num_experts is None:
            raise InvalidParameterError(f"{owner_name}: pass num_experts (the number of steps)")
    num_experts = check_int(num_experts, "num_experts", owner=owner_name, minimum=1)
    pool = int(prompt.key.shape[0])
    size = slots_per_expert if slots_per_expert is not None else getattr(model, "num_pt_per_task", None)
    size, _ = slice_layout(pool, num_experts, size, 1, "dualprompt", remainder_to_last=False)
    if options.ensemble and getattr(prompt, "learnable_mask", False):
        raise SeamError(
            f"{owner_name}: e_prompt.learnable_mask multiplies the logits after the classifier, which the head "
            "ensemble cannot see; use ensemble=False or the generic adapter with your own transform"
        )
    counter = step_counter(model) if routable else None  # Si-Blurry's own `task_id` is never read
    wiring = Wiring.create(
        model, "dualprompt", options, classifier=getattr(head_owner, head_name), num_experts=num_experts,
        num_banks=pool, banks_of_expert=lambda expert: list(range(expert * size, (expert + 1) * size)),
        start_method_expert=expert_starter(counter, start_expert), router_dim=router_dim,
        current_expert=counter.read() if counter is not None else 0, step_counter=counter,
    )
    handle = wiring.handle
    if not options.router and not options.ensemble:
        return handle
    if options.router and query_module is not None:
        handle.query_source = f"the forward of {type(query_module).__name__} (query_module)"
        wiring.hook_query_module(query_module, query_from_output or default_query)
    elif options.router:
        handle.query_source = f"the query argument of the {type(prompt).__name__} calls"

    original = prompt.forward
    parameters = list(inspect.signature(original).parameters)
    query_name = parameters[0] if parameters else "query"

    def top1_slot(query: Tensor, s: Optional[int], e: Optional[int], before: Any) -> Tensor:
        recorded = getattr(prompt, "last_selected_indices", None)
        if isinstance(recorded, Tensor) and recorded is not before:
            return recorded[:, 0]
        keys = prompt.key if s is None else prompt.key[s:e]
        match = 1 - F.cosine_similarity(query.unsqueeze(1), keys, dim=-1)
        return match.topk(1, dim=-1, largest=False).indices[:, 0] + (0 if s is None else int(s))

    def used_experts(output: Any, experts: Tensor) -> Optional[Tensor]:
        """The step of the prompt each sample's output holds (any equal pool row inside the routed
        step counts: tiled prompt files repeat rows)."""
        chosen = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
        if not isinstance(chosen, Tensor) or chosen.ndim != 4:
            return None
        hit = (chosen[:, 0].flatten(1).unsqueeze(1) == prompt.prompts.detach().flatten(1).unsqueeze(0)).all(-1)
        slot_step = torch.arange(pool, device=hit.device) // size
        inside = (hit & (slot_step.unsqueeze(0) == experts.unsqueeze(1))).any(1)
        first_hit = torch.where(hit.any(1), slot_step[hit.float().argmax(1)], torch.full_like(experts, -1))
        return torch.where(inside, experts, first_hit)

    def call(query: Tensor, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Tensor, Optional[int]]:
        before = getattr(prompt, "last_selected_indices", None)
        output = original(query, *args, **kwargs)
        s, e = _slot_range(args, kwargs)
        return output, top1_slot(query.detach(), s, e, before), s

    def train_forward(query: Tensor, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        wiring.batch_seen(query.shape[0])
        if query_module is None:
            wiring.query_seen(query)
        output, slots, start = call(query, args, kwargs)
        if routable:  # Si-Blurry's pool-wide selection ties no prompt to a step
            handle.note_trained(torch.full_like(slots, int(start) // size) if start is not None else slots // size)
        wiring.banks_seen(slots)
        return output

    def routed_forward(query: Tensor, experts: Tensor, kwargs: Dict[str, Any]) -> Any:
        rest = {k: v for k, v in kwargs.items() if k not in ("s", "e")}
        parts, rows, slot_parts, records = [], [], [], {}
        for expert in torch.unique(experts).tolist():
            index = (experts == expert).nonzero().squeeze(1)
            output, slots, _ = call(query[index], (), {**rest, "s": expert * size, "e": (expert + 1) * size})
            parts.append(output)
            rows.append(index)
            slot_parts.append(slots)
            for name in ("last_selected_indices", "last_topk"):
                value = getattr(prompt, name, None)
                if isinstance(value, Tensor):
                    records.setdefault(name, []).append(value)
        merged = _merge_groups(parts, rows)
        for name, values in records.items():
            if len(values) == len(rows):
                setattr(prompt, name, _merge_groups(values, rows))
        if options.ensemble:
            wiring.banks_seen(_merge_groups(slot_parts, rows))
        handle.observed["routed"] = experts
        if handle.wants_observation:
            handle.note_routed(experts, used_experts(merged, experts), f"{type(prompt).__name__}.forward")
        return merged

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not wiring.active:
            return original(*args, **kwargs)
        if args:
            query, args = args[0], args[1:]
        else:
            query = kwargs.pop(query_name)
        if handle.training:
            return train_forward(query, args, kwargs)
        if options.router and query_module is not None:
            features = wiring.pop_query(query.shape[0]) if handle.routing_active() else None
            wiring.eval_query = None
        else:
            features = query if options.router else None
        experts = None if features is None else wiring.route(features)
        if experts is None:
            output, slots, _ = call(query, args, kwargs)
            wiring.banks_seen(slots)
            return output
        return routed_forward(query, experts, kwargs)

    handle.install.set_attribute(prompt, "forward", forward)
    if options.ensemble:
        wiring.swap_head(head_owner, head_name)
    return handle


@register_family("dualprompt", "misa")
def retrofit(
    model: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: Optional[int] = None,
    slots_per_expert: Optional[int] = None,
    query_module: Optional[nn.Module] = None,
    query_from_output: Optional[Callable[[Any], Tensor]] = None,
    start_expert: Optional[Callable[[int], None]] = None,
    router_dim: Optional[int] = None,
) -> Retrofit:
    """Retrofit a DualPrompt or MISA model.

    Args:
        num_experts: steps (required for JH-LEE; Si-Blurry lineage default ``model.task_num``).
        slots_per_expert: slots per step (JH-LEE: ``top_k`` with ``use_prompt_mask``, else
            ``pool // num_experts``; Si-Blurry lineage: ``model.num_pt_per_task``).
        query_module, query_from_output: read the router features from this module's output instead of
            the prompt call's query.
        start_expert: the method's own expert start; default: moving the model's step counter
            (FlyGCL ``process_task_count()`` up to the expert, MISA ``task_id``).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """
    prompt = getattr(model, "e_prompt", None)
    if not isinstance(prompt, nn.Module):
        raise missing_seam("dualprompt", model, "e_prompt", _WHAT)
    family_options = dict(query_module=query_module, query_from_output=query_from_output, start_expert=start_expert,
                          router_dim=router_dim)
    if hasattr(prompt, "prompt_key"):
        prompt = jhlee_prompt_module(model, "dualprompt", "e_prompt", _WHAT)
        if num_experts is None:
            raise InvalidParameterError("fly_modules.adapters.dualprompt: pass num_experts (the number of steps)")
        num_experts = check_int(num_experts, "num_experts", owner="fly_modules.adapters.dualprompt", minimum=1)
        pool, top_k = prompt.prompt_key.shape[0], int(prompt.top_k)
        if slots_per_expert is None and getattr(model, "use_prompt_mask", False):
            slots_per_expert = top_k
        size, owner = slice_layout(pool, num_experts, slots_per_expert, top_k, "dualprompt", remainder_to_last=False)
        return wire_jhlee(
            model, "dualprompt", prompt, owner, options, num_experts=num_experts, num_banks=pool,
            ties_training=bool(getattr(model, "use_prompt_mask", False)),
            bank_of_slot=torch.arange(pool), banks_of_expert=lambda expert: list(range(expert * size, (expert + 1) * size)),
            **family_options,
        )
    if hasattr(prompt, "key") and hasattr(prompt, "prompts"):
        if not isinstance(prompt.key, Tensor):
            raise missing_seam("dualprompt", model, "e_prompt.key", "a (pool, D) tensor of keys")
        return _wire_key_pool(model, prompt, options, num_experts=num_experts, slots_per_expert=slots_per_expert,
                              **family_options)
    raise missing_seam("dualprompt", model, "e_prompt.prompt_key` or `e_prompt.key", _WHAT)
