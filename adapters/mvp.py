"""MVP retrofit: our reference ``mvp`` and the Si-Blurry / FlyGCL ``MVP`` models.

A model that implements the fly-modules seam contract goes to
:func:`fly_modules.adapters.reference.retrofit`. Otherwise the adapter recognises the Si-Blurry layout
(FlyGCL's renamed attributes in brackets): ``model.backbone`` (a timm-style ViT with ``patch_embed``,
``blocks``, ``norm``; classifier ``head`` [``fc``] through ``get_classifier()``), ``model.e_prompts``,
keys ``model.key`` [``learnable_key``] ``(P, D)``, class mask ``model.mask`` [``learnable_mask``]
``(P, C)``, the selection counter ``model.count``, ``model.use_last_layer`` / ``use_contrastiv`` /
``use_mask``, and ``forward_features(x) -> (feature, mask)``, ``forward_head(feature)``,
``forward(x) = forward_head(...) * mask``. MVP selects its prompt *inside* ``forward_features``:
the query is the class token of a frozen prompt-free pass (``blocks[:-1]``, or all blocks with
``use_last_layer``; no final norm), matched against the keys with distances scaled by ``count + 1``.

How the seams are reached (all undone by ``handle.remove()``):

* ``forward_features`` is wrapped (instance attribute), so every call path is seen, including
  training loops that call ``forward_features``/``forward_head`` directly. During the call, a forward
  hook on the query block sees its *first* output (the query pass; the prompted pass comes later).
* **router**: the routed expert *is* the prompt index (``num_experts`` = pool size = steps). The router
  is fed, per training batch, the final-norm class token of that same query pass (``backbone.norm`` of
  it; with ``use_last_layer=False`` the last block runs on those tokens once more), or MVP's own query
  with ``router_features="query"`` (FlyGCL's choice). At inference the query block's class token is
  replaced by the routed prompt's key, so the method's own key match selects the routed prompt (its
  distance is 0, every other key's is positive unless two keys are parallel); the instance mask and
  prompt follow that index. Needs ``selection_size == 1``. Training-time selection is untouched.
* **ensemble**: one bank per prompt, all cloned from the online head at retrofit time and never
  re-cloned (``banks_of_expert`` is empty, as in the reference TE2 ablation). Training: the banks of
  every prompt the forward selected (the entries of ``count`` that grew) move after each optimizer
  step. Inference: the bank of the routed prompt (router on), else of MVP's own selection (recomputed
  from the recorded query with the same count-scaled formula). The classifier is wrapped (online logits
  in training, untouched at inference) and a forward hook on the model replaces ``model(x)``'s output
  at inference by the ensemble of ``[online, copies]``, each member multiplied by MVP's instance mask
  (the one ``forward_features`` returned) when ``use_mask``, plus ``handle.logit_mask``, aggregated, as
  log-probabilities for the softmax rules. Inference must go through ``model(x)``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._core import Retrofit, Schedule, SeamError, missing_seam, set_instance_attribute, undo_on_failure
from .generic import ensemble_scores, find_head, make_wiring, reference_or_none, task_count_starter

__all__ = ["retrofit"]

_ROUTER_FEATURES = ("cls", "query")


def _first_attribute(model: nn.Module, names: Sequence[str], what: str) -> str:
    for name in names:
        if isinstance(getattr(model, name, None), Tensor):
            return name
    raise missing_seam("mvp", model, "` or `".join(names), what)


@undo_on_failure
def retrofit(
    model: nn.Module,
    *,
    num_experts: Optional[int] = None,
    router: bool = True,
    ensemble: bool = True,
    optimizer: Optional[torch.optim.Optimizer] = None,
    schedule: Schedule = None,
    router_features: Optional[str] = None,
    start_expert: Optional[Callable[[int], None]] = None,
    expansion_dim: int = 10_000,
    ridge: Any = 1e4,
    seed: int = 0,
    decays: Sequence[float] = (0.9, 0.99),
    aggregate: str = "softmax_max",
) -> Retrofit:
    """Retrofit an MVP model (reference ``mvp`` or Si-Blurry / FlyGCL ``MVP``); see the module docstring.

    Args:
        model: the MVP model.
        num_experts: must equal the prompt pool size (default: it).
        router_features: ``"cls"`` (default, frozen final-norm class token) or ``"query"`` (MVP's query).
        start_expert: the method's own expert start (default: ``process_task_count()`` until
            ``task_count`` reaches the expert, when the model has them).
        The other arguments are those of :func:`fly_modules.adapters.generic.retrofit`.
    """
    common: Dict[str, Any] = dict(
        optimizer=optimizer, schedule=schedule, expansion_dim=expansion_dim, ridge=ridge, seed=seed,
        decays=decays, aggregate=aggregate,
    )
    upstream_only = dict(router_features=router_features, start_expert=start_expert)
    handle = reference_or_none(model, "mvp", num_experts, upstream_only, router=router, ensemble=ensemble, **common)
    if handle is not None:
        return handle
    router_features = router_features or "cls"
    if router_features not in _ROUTER_FEATURES:
        raise ValueError(f"fly_modules.adapters.mvp: router_features must be one of {_ROUTER_FEATURES}, got {router_features!r}")
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        raise missing_seam("mvp", model, "backbone", "the frozen ViT MVP prompts")
    for name in ("patch_embed", "blocks", "norm"):
        if not hasattr(backbone, name):
            raise missing_seam("mvp", model, f"backbone.{name}", "part of the ViT MVP's query pass runs through")
    if not isinstance(getattr(model, "e_prompts", None), Tensor):
        raise missing_seam("mvp", model, "e_prompts", "MVP's E-prompt pool")
    if not callable(getattr(model, "forward_features", None)):
        raise missing_seam("mvp", model, "forward_features", "MVP's prompted pass returning (feature, mask)")
    key_name = _first_attribute(model, ("key", "learnable_key"), "MVP's prompt keys")
    _first_attribute(model, ("mask", "learnable_mask"), "MVP's learnable class mask")  # a seam check only
    pool = int(getattr(model, key_name).shape[0])
    if num_experts is not None and int(num_experts) != pool:
        raise ValueError(
            f"fly_modules.adapters.mvp: the routed expert is the prompt index, so num_experts must equal the "
            f"pool size {pool}, got {num_experts}"
        )
    if router and int(getattr(model, "selection_size", 1)) != 1:
        raise ValueError("fly_modules.adapters.mvp: routing replaces a top-1 selection; selection_size must be 1")
    head_owner, head_name = find_head(backbone, "mvp")
    blocks = backbone.blocks
    query_index = len(blocks) - 1 if getattr(model, "use_last_layer", True) else len(blocks) - 2
    if query_index < 0:
        raise SeamError("fly_modules.adapters.mvp: the backbone has too few blocks for MVP's query pass")

    method_start = task_count_starter(model, start_expert)

    wiring = make_wiring(
        model, "mvp", classifier=getattr(head_owner, head_name), num_experts=pool, num_banks=pool,
        banks_of_expert=lambda expert: [], start_method_expert=method_start, router=router, ensemble=ensemble,
        router_dim=None, current_expert=int(getattr(model, "task_count", 0)), **common,
    )
    handle = wiring.handle
    if not router and not ensemble:
        return handle
    added_ensemble = handle.ensemble
    state = SimpleNamespace(armed=False, selection=None, mvp_mask=None, head_input=None)

    def own_selection(query: Tensor) -> Tensor:
        keys = getattr(model, key_name)
        distance = 1 - F.cosine_similarity(query.unsqueeze(1), keys, dim=-1)
        count = getattr(model, "count", None)
        if getattr(model, "use_contrastiv", False) and isinstance(count, Tensor):
            distance = distance * (count + 1)
        return distance.topk(1, dim=1, largest=False).indices[:, 0]

    @torch.no_grad()
    def router_input(tokens: Tensor) -> Tensor:
        if router_features == "query":
            return tokens[:, 0]
        if query_index != len(blocks) - 1:
            tokens = blocks[-1](tokens)
        return backbone.norm(tokens[:, :1])[:, 0]

    def on_query_block(block: nn.Module, args: Any, output: Tensor) -> Optional[Tensor]:
        if not state.armed or not wiring.active:
            return None
        state.armed = False
        query = output[:, 0]
        features = router_input(output) if router else None
        if handle.training:
            if features is not None:
                wiring.query_seen(features)
            if ensemble and not isinstance(getattr(model, "count", None), Tensor):
                state.selection = own_selection(query.detach())
            return None
        experts = wiring.route(features) if features is not None else None
        if experts is None:
            state.selection = own_selection(query.detach()) if ensemble else None
            return None
        state.selection = experts
        crafted = output.clone()
        crafted[:, 0] = getattr(model, key_name).detach()[experts].to(output.dtype)
        return crafted

    handle.add_handle(blocks[query_index].register_forward_hook(on_query_block))
    original_features = model.forward_features

    def forward_features(*args: Any, **kwargs: Any) -> Any:
        if not wiring.active:
            return original_features(*args, **kwargs)
        count = getattr(model, "count", None)
        before = count.detach().clone() if handle.training and ensemble and isinstance(count, Tensor) else None
        state.armed, state.selection = True, None
        try:
            output = original_features(*args, **kwargs)
        finally:
            state.armed = False
        if handle.training:
            images = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(images, Tensor):
                wiring.batch_seen(images.shape[0])
            if ensemble:
                grown = (model.count - before > 0).nonzero().squeeze(1) if before is not None else state.selection
                wiring.banks_seen(grown)
        elif ensemble:
            state.mvp_mask = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            wiring.eval_banks = None if state.selection is None else state.selection.reshape(-1).long()
        return output

    set_instance_attribute(handle, model, "forward_features", forward_features)

    if ensemble:
        def keep_input(x: Tensor) -> Tensor:
            state.head_input = x
            return added_ensemble.online(x)

        wiring.swap_head(head_owner, head_name, scorer=keep_input)

        def ensemble_output(module: nn.Module, args: Any, output: Tensor) -> Optional[Tensor]:
            if not wiring.active or handle.training:
                return None
            features, state.head_input = state.head_input, None
            mvp_mask, state.mvp_mask = state.mvp_mask, None
            if features is None:
                return None
            banks = wiring.pop_banks(features.shape[0])
            transform = None
            if getattr(model, "use_mask", False) and isinstance(mvp_mask, Tensor):
                scale = mvp_mask.reshape(features.shape[0], -1).unsqueeze(1)
                transform = lambda members: members * scale  # noqa: E731
            return ensemble_scores(added_ensemble, features, banks, handle.logit_mask, transform)

        handle.add_handle(model.register_forward_hook(ensemble_output))
    return handle
