"""DualPrompt / MISA retrofit: our reference methods, JH-LEE ``dualprompt-pytorch``, and the
Si-Blurry / MISA / FlyGCL ``DualPrompt`` models.

A model that implements the fly-modules seam contract goes to
:func:`fly_modules.adapters.reference.retrofit`. Otherwise ``model.e_prompt`` (the E-prompt pool)
tells the codebase apart:

**JH-LEE** (``e_prompt.prompt_key``, ``e_prompt.top_k``; ``model.e_prompt(x_embed, prompt_mask=...,
cls_features=...)`` returns a dict with ``prompt_idx``; classifier ``model.head``; query = the
``cls_features`` the loop passes, the ``pre_logits`` of a frozen ``original_model``). Each expert (step)
owns ``slots_per_expert`` contiguous slots: by default ``top_k`` when ``model.use_prompt_mask`` is on
(the codebase trains task ``t`` on slots ``[t*top_k, (t+1)*top_k)``), else ``pool // num_experts``.
At inference the router picks the step and the key match (cosine, ``top_k`` best) runs inside its
slots; the result is injected as ``prompt_mask``.

**Si-Blurry / MISA / FlyGCL** (``model.backbone`` a ViT whose classifier ``get_classifier()`` returns
(``fc`` in the vendored ViT, ``head`` in timm); ``model.e_prompt`` a ``Prompt`` with ``key`` ``(P, D)``
and ``prompts``, called as ``e_prompt(query, s=..., e=...)`` where ``s, e`` restrict the key match to
slots ``[s:e)``; ``task_count``, ``process_task_count()``). Step ``t`` owns slots
``[t*S, (t+1)*S)`` with ``S = model.num_pt_per_task`` (else ``pool // num_experts``). ``s, e`` are
one range per call, so at inference the E-prompt's forward is wrapped (instance attribute, undone by
``remove()``): the samples are grouped by routed step -- one call per step present in the batch, never
one per sample -- each group calls the original forward with its step's ``s, e``, and the outputs are
put back in batch order. This is exact as long as a sample's selection does not depend on the other
samples (batch-wise selection off, the default). The router is fed the ``query`` argument of the
training calls (the frozen final-norm CLS the model computes anyway).

Ensemble banks are per **slot**, as in the reference's TE2 ablation: ``pool`` banks, a step's slots
re-cloned when the step starts, the bank of a sample = its top-1 slot (JH-LEE: ``prompt_idx[:, 0]``;
Si-Blurry family: ``e_prompt.last_selected_indices`` when the module records it (FlyGCL), else the
top-1 of ``1 - cos(query, key[s:e])`` plus ``s``, the same formula as the module). The classifier
becomes a :class:`~fly_modules.adapters.generic.EnsembleLinear` (online logits in training, the
ensemble's log-probabilities at inference; ``handle.set_logit_mask``).

Experts: ``handle.start_expert(t)`` (or the schedule) re-clones step ``t``'s banks and, for the
Si-Blurry family, calls ``model.process_task_count()`` until ``model.task_count == t``. A loop that
calls ``process_task_count()`` itself should call ``handle.start_expert(model.task_count)`` after it
(the sync is idempotent) and pass no schedule.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._core import Retrofit, Schedule, SeamError, missing_seam, set_instance_attribute, undo_on_failure
from .generic import default_query, find_head, make_wiring, reference_or_none, task_count_starter
from .l2p import jhlee_prompt_module, slice_layout, wire_jhlee

__all__ = ["retrofit", "merge_groups"]

_WHAT = (
    "the E-prompt pool: JH-LEE `EPrompt` (with `prompt_key`) or Si-Blurry/MISA/FlyGCL `Prompt` (with `key` "
    "and `prompts`)"
)


# ---------------------------------------------------------------------------- group merging
def merge_groups(parts: List[Any], rows: List[Tensor], batch: int) -> Any:
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
        merged = [merge_groups([p[i] for p in parts], rows, batch) for i in range(len(first))]
        return type(first)(merged) if isinstance(first, list) else tuple(merged)
    if isinstance(first, dict):
        return {key: merge_groups([p[key] for p in parts], rows, batch) for key in first}
    return parts[-1]


# --------------------------------------------------------------------------- Si-Blurry family
def _slot_range(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Optional[int], Optional[int]]:
    s = kwargs.get("s", args[0] if len(args) > 0 else None)
    e = kwargs.get("e", args[1] if len(args) > 1 else None)
    return s, e


def _wire_siblurry(
    model: nn.Module,
    prompt: nn.Module,
    *,
    num_experts: Optional[int],
    slots_per_expert: Optional[int],
    query_module: Optional[nn.Module],
    query_from_output: Optional[Callable[[Any], Tensor]],
    start_expert: Optional[Callable[[int], None]],
    router: bool,
    ensemble: bool,
    **common: Any,
) -> Retrofit:
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        raise missing_seam("dualprompt", model, "backbone", "the ViT whose classifier is the online head")
    head_owner, head_name = find_head(backbone, "dualprompt")
    if num_experts is None:
        num_experts = getattr(model, "task_num", None)
        if num_experts is None:
            raise TypeError("fly_modules.adapters.dualprompt: pass num_experts (the number of steps)")
    num_experts = int(num_experts)
    pool = int(prompt.key.shape[0])
    size = slots_per_expert if slots_per_expert is not None else getattr(model, "num_pt_per_task", None)
    size, _ = slice_layout(pool, num_experts, size, 1, "dualprompt", remainder_to_last=False)
    if ensemble and getattr(prompt, "learnable_mask", False):
        raise SeamError(
            "fly_modules.adapters.dualprompt: e_prompt.learnable_mask multiplies the logits after the classifier, "
            "which the head ensemble cannot see; use ensemble=False or the generic adapter with your own transform"
        )

    method_start = task_count_starter(model, start_expert)

    wiring = make_wiring(
        model, "dualprompt", classifier=getattr(head_owner, head_name), num_experts=num_experts, num_banks=pool,
        banks_of_expert=lambda expert: list(range(expert * size, (expert + 1) * size)),
        start_method_expert=method_start, router=router, ensemble=ensemble,
        current_expert=int(getattr(model, "task_count", 0)), **common,
    )
    handle = wiring.handle
    if not router and not ensemble:
        return handle
    if router and query_module is not None:
        wiring.hook_query_module(query_module, query_from_output or default_query)

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

    def call(query: Tensor, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Tensor]:
        before = getattr(prompt, "last_selected_indices", None)
        output = original(query, *args, **kwargs)
        s, e = _slot_range(args, kwargs)
        return output, (top1_slot(query.detach(), s, e, before) if ensemble else None)

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not wiring.active:
            return original(*args, **kwargs)
        if args:
            query, args = args[0], args[1:]
        else:
            query = kwargs.pop(query_name)
        if handle.training:
            wiring.batch_seen(query.shape[0])
            if query_module is None:
                wiring.query_seen(query)
            output, slots = call(query, args, kwargs)
            wiring.banks_seen(slots)
            return output
        if router and query_module is not None:
            features = wiring.pop_query(query.shape[0]) if handle.routing_active() else None
            wiring.eval_query = None
        else:
            features = query
        experts = None if features is None else wiring.route(features)
        if experts is None:
            output, slots = call(query, args, kwargs)
            wiring.banks_seen(slots)
            return output
        rest = {k: v for k, v in kwargs.items() if k not in ("s", "e")}
        parts, rows, slot_parts, records = [], [], [], {}
        for expert in torch.unique(experts).tolist():
            index = (experts == expert).nonzero().squeeze(1)
            output, slots = call(query[index], (), {**rest, "s": expert * size, "e": (expert + 1) * size})
            parts.append(output)
            rows.append(index)
            slot_parts.append(slots)
            for name in ("last_selected_indices", "last_topk"):
                value = getattr(prompt, name, None)
                if isinstance(value, Tensor):
                    records.setdefault(name, []).append(value)
        merged = merge_groups(parts, rows, query.shape[0])
        for name, values in records.items():
            if len(values) == len(rows):
                setattr(prompt, name, merge_groups(values, rows, query.shape[0]))
        if ensemble:
            wiring.banks_seen(merge_groups(slot_parts, rows, query.shape[0]))
        return merged

    set_instance_attribute(handle, prompt, "forward", forward)
    if ensemble:
        wiring.swap_head(head_owner, head_name)
    return handle


# ------------------------------------------------------------------------------------ public
@undo_on_failure
def retrofit(
    model: nn.Module,
    *,
    num_experts: Optional[int] = None,
    router: bool = True,
    ensemble: bool = True,
    optimizer: Optional[torch.optim.Optimizer] = None,
    schedule: Schedule = None,
    slots_per_expert: Optional[int] = None,
    query_module: Optional[nn.Module] = None,
    query_from_output: Optional[Callable[[Any], Tensor]] = None,
    start_expert: Optional[Callable[[int], None]] = None,
    router_dim: Optional[int] = None,
    expansion_dim: int = 10_000,
    ridge: Any = 1e4,
    seed: int = 0,
    decays: Sequence[float] = (0.9, 0.99),
    aggregate: str = "softmax_max",
) -> Retrofit:
    """Retrofit a DualPrompt / MISA model; see the module docstring for what each codebase gets.

    Args:
        model: the DualPrompt or MISA model.
        num_experts: steps (required for JH-LEE; Si-Blurry family default ``model.task_num``).
        slots_per_expert: slots per step (defaults in the module docstring).
        query_module, query_from_output: read the router features from this module's output instead of
            the prompt call's query (see :func:`fly_modules.adapters.generic.retrofit`).
        start_expert: the method's own expert start (replaces the ``process_task_count`` sync).
        The other arguments are those of :func:`fly_modules.adapters.generic.retrofit`.
    """
    common: Dict[str, Any] = dict(
        optimizer=optimizer, schedule=schedule, expansion_dim=expansion_dim, ridge=ridge, seed=seed,
        decays=decays, aggregate=aggregate,
    )
    upstream_only = dict(slots_per_expert=slots_per_expert, query_module=query_module,
                         query_from_output=query_from_output, start_expert=start_expert, router_dim=router_dim)
    handle = reference_or_none(model, "dualprompt", num_experts, upstream_only, router=router, ensemble=ensemble, **common)
    if handle is not None:
        return handle
    prompt = getattr(model, "e_prompt", None)
    if not isinstance(prompt, nn.Module):
        raise missing_seam("dualprompt", model, "e_prompt", _WHAT)
    options = dict(query_module=query_module, query_from_output=query_from_output, start_expert=start_expert,
                   router=router, ensemble=ensemble, router_dim=router_dim, **common)
    if hasattr(prompt, "prompt_key"):
        prompt = jhlee_prompt_module(model, "dualprompt", "e_prompt", _WHAT)
        if num_experts is None:
            raise TypeError("fly_modules.adapters.dualprompt: pass num_experts (the number of steps)")
        pool, top_k = prompt.prompt_key.shape[0], int(prompt.top_k)
        if slots_per_expert is None and getattr(model, "use_prompt_mask", False):
            slots_per_expert = top_k
        size, owner = slice_layout(pool, int(num_experts), slots_per_expert, top_k, "dualprompt", remainder_to_last=False)
        return wire_jhlee(
            model, "dualprompt", prompt, owner, num_experts=int(num_experts), num_banks=pool,
            bank_of_slot=torch.arange(pool), banks_of_expert=lambda expert: list(range(expert * size, (expert + 1) * size)),
            **options,
        )
    if hasattr(prompt, "key") and hasattr(prompt, "prompts"):
        if not isinstance(prompt.key, Tensor):
            raise missing_seam("dualprompt", model, "e_prompt.key", "a (pool, D) tensor of keys")
        return _wire_siblurry(model, prompt, num_experts=num_experts, slots_per_expert=slots_per_expert, **options)
    raise missing_seam("dualprompt", model, "e_prompt.prompt_key` or `e_prompt.key", _WHAT)
