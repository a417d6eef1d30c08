"""MVP: our reference ``mvp`` and the Si-Blurry / MISA / FlyGCL ``MVP`` models.

The routed expert is the prompt index. MVP selects its prompt inside ``forward_features`` from the class
token of a frozen query pass; at inference the adapter replaces that token by the routed prompt's key,
so MVP's own key match selects the routed prompt. One ensemble bank per prompt.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError, check_choice

from ._handle import Retrofit
from ._options import RetrofitOptions
from ._registry import register_family
from ._wiring import SeamError, Wiring, backbone_of, ensemble_scores, find_head, missing_seam, step_counter

__all__ = ["retrofit"]

_ROUTER_FEATURES = ("cls", "query")


def _first_attribute(model: nn.Module, names: Sequence[str], what: str) -> str:
    for name in names:
        if isinstance(getattr(model, name, None), Tensor):
            return name
    raise missing_seam("mvp", model, "` or `".join(names), what)


@register_family("mvp")
def retrofit(
    model: nn.Module,
    options: RetrofitOptions,
    *,
    num_experts: Optional[int] = None,
    router_features: Optional[str] = None,
    start_expert: Optional[Callable[[int], None]] = None,
) -> Retrofit:
    """Retrofit an MVP model (reference ``mvp`` or Si-Blurry / MISA / FlyGCL ``MVP``).

    Args:
        num_experts: must equal the prompt pool size (default: it).
        router_features: ``"cls"`` (default, frozen final-norm class token) or ``"query"`` (MVP's query).
        start_expert: the method's own expert start (default: FlyGCL's ``process_task_count()`` until
            ``task_count`` reaches the expert, when the model has them).
    """
    router, ensemble = options.router, options.ensemble
    router_features = check_choice(router_features or "cls", "router_features", _ROUTER_FEATURES,
                                   owner="fly_modules.adapters.mvp")
    backbone = backbone_of(model, "mvp", "the frozen ViT MVP prompts")
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
        raise InvalidParameterError(
            f"fly_modules.adapters.mvp: the routed expert is the prompt index, so num_experts must equal the "
            f"pool size {pool}, got {num_experts}"
        )
    if router and int(getattr(model, "selection_size", 1)) != 1:
        raise InvalidParameterError("fly_modules.adapters.mvp: routing replaces a top-1 selection; selection_size must be 1")
    head_owner, head_name = find_head(backbone, "mvp")
    blocks = backbone.blocks
    query_index = len(blocks) - 1 if getattr(model, "use_last_layer", True) else len(blocks) - 2
    if query_index < 0:
        raise SeamError("fly_modules.adapters.mvp: the backbone has too few blocks for MVP's query pass")

    wiring = Wiring.create(
        model, "mvp", options, classifier=getattr(head_owner, head_name), num_experts=pool, num_banks=pool,
        banks_of_expert=lambda expert: [], start_expert=start_expert, counter=step_counter(model),
    )
    handle = wiring.handle
    handle.query_source = f"the query pass inside {type(model).__name__}.forward_features (training mode)"
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
        # The router keeps the first training query of a stream batch: later online iterations skip the extra block.
        recorded = handle.training and handle.batch.query is not None
        features = router_input(output) if router and not recorded else None
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
        handle.observed["routed"] = experts
        crafted = output.clone()
        crafted[:, 0] = getattr(model, key_name).detach()[experts].to(output.dtype)
        return crafted

    handle.install.forward_hook(blocks[query_index], on_query_block)
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
            wiring.batch.eval_banks = None if state.selection is None else state.selection.reshape(-1).long()
        return output

    handle.install.set_attribute(model, "forward_features", forward_features)

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

        handle.install.forward_hook(model, ensemble_output)
    return handle
