"""MVP: our reference ``mvp`` and the Si-Blurry / MISA / FlyGCL ``MVP`` models.

The routed expert is the prompt index. MVP selects its prompt inside ``forward_features`` from the class
token of a frozen query pass; at inference the adapter replaces that token by the routed prompt's key,
so MVP's own key match selects the routed prompt. One ensemble bank per prompt.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fly_modules._validation import InvalidParameterError, check_choice

from ._family import AdapterFamily, Plan
from ._head import ensemble_scores
from ._layout import Layout
from ._registry import register_family
from ._seams import SeamError, missing_seam, step_counter

__all__ = ["MVP", "retrofit"]

_ROUTER_FEATURES = ("cls", "query")


def _first_attribute(model: nn.Module, names: Sequence[str], what: str) -> str:
    for name in names:
        if isinstance(getattr(model, name, None), Tensor):
            return name
    raise missing_seam(model, "` or `".join(names), what, family="mvp")


@dataclasses.dataclass
class _Forward:
    """What one ``forward_features`` call of the model hands to the next hook.

    Attributes:
        armed: the query block's hook acts on its next call (the query pass of this forward).
        selection: ``(B,)`` the prompt each sample used (routed, or MVP's own key match).
        mvp_mask: MVP's class mask of the inference forward (multiplies the ensemble members).
        head_input: the features the ensembled head received at inference.
    """

    armed: bool = False
    selection: Optional[Tensor] = None
    mvp_mask: Optional[Tensor] = None
    head_input: Optional[Tensor] = None


class MVP(AdapterFamily):
    """Retrofit an MVP model (reference ``mvp`` or Si-Blurry / MISA / FlyGCL ``MVP``).

    The routed expert is the prompt index: the query pass's class token becomes the routed prompt's key.

    Args:
        num_experts: must equal the prompt pool size (default: it).
        router_features: ``"cls"`` (default, frozen final-norm class token) or ``"query"`` (MVP's query).
        start_expert: the method's own expert start (default: FlyGCL's ``process_task_count()`` until
            ``task_count`` reaches the expert, when the model has them).
    """

    names = ("mvp",)

    def recognise(
        self,
        *,
        num_experts: Optional[int] = None,
        router_features: Optional[str] = None,
        start_expert: Optional[Callable[[int], None]] = None,
    ) -> Plan:
        model = self.model
        router_features = check_choice(router_features or "cls", "router_features", _ROUTER_FEATURES,
                                       caller=self.caller)
        backbone = self.backbone_of("the frozen ViT MVP prompts")
        for name in ("patch_embed", "blocks", "norm"):
            if not hasattr(backbone, name):
                raise self.missing_seam(f"backbone.{name}", "part of the ViT MVP's query pass runs through")
        if not isinstance(getattr(model, "e_prompts", None), Tensor):
            raise self.missing_seam("e_prompts", "MVP's E-prompt pool")
        if not callable(getattr(model, "forward_features", None)):
            raise self.missing_seam("forward_features", "MVP's prompted pass returning (feature, mask)")
        key_name = _first_attribute(model, ("key", "learnable_key"), "MVP's prompt keys")
        _first_attribute(model, ("mask", "learnable_mask"), "MVP's learnable class mask")  # a seam check only
        pool = int(getattr(model, key_name).shape[0])
        if num_experts is not None and int(num_experts) != pool:
            raise InvalidParameterError(
                f"{self.caller}: the routed expert is the prompt index, so num_experts must equal the "
                f"pool size {pool}, got {num_experts}"
            )
        if self.options.router and int(getattr(model, "selection_size", 1)) != 1:
            raise InvalidParameterError(f"{self.caller}: routing replaces a top-1 selection; selection_size must be 1")
        blocks = backbone.blocks
        query_index = len(blocks) - 1 if getattr(model, "use_last_layer", True) else len(blocks) - 2
        if query_index < 0:
            raise SeamError(f"{self.caller}: the backbone has too few blocks for MVP's query pass")
        layout = _QueryPass(self, backbone, router_features, key_name, query_index)
        return Plan(head=self.find_head(backbone), num_experts=pool, layout=layout, banks_of_expert=_no_banks,
                    start_expert=start_expert, counter=step_counter(model))


def _no_banks(expert: int) -> Sequence[int]:
    return []  # one bank per prompt: no bank is re-cloned when an expert starts


class _QueryPass(Layout):
    """MVP's query pass: its class token becomes the routed prompt's key, so MVP's own key match selects the
    routed prompt; the ensemble answers in place of the model's output, times MVP's class mask."""

    def __init__(self, family: MVP, backbone: nn.Module, router_features: str, key_name: str,
                 query_index: int) -> None:
        super().__init__(family)
        self.backbone, self.router_features, self.key_name = backbone, router_features, key_name
        self.query_index = query_index
        self.original_features: Callable[..., Any] = family.model.forward_features

    @property
    def call(self) -> _Forward:
        """This layout's part of the record: what one ``forward_features`` call hands to the next hook."""
        return self.record.own

    def install_hooks(self) -> None:
        self.record.own = _Forward()
        self.record.query_source = f"the query pass inside {type(self.model).__name__}.forward_features (training mode)"
        self.install.forward_hook(self.backbone.blocks[self.query_index], self.on_query_block)
        self.install.set_attribute(self.model, "forward_features", self.forward_features)

    # ---------------------------------------------------------------------------------- the query pass
    def own_selection(self, query: Tensor) -> Tensor:
        """MVP's own top-1 key match (scaled by its use counts with ``use_contrastiv``)."""
        model = self.model
        distance = 1 - F.cosine_similarity(query.unsqueeze(1), getattr(model, self.key_name), dim=-1)
        count = getattr(model, "count", None)
        if getattr(model, "use_contrastiv", False) and isinstance(count, Tensor):
            distance = distance * (count + 1)
        return distance.topk(1, dim=1, largest=False).indices[:, 0]

    @torch.no_grad()
    def router_input(self, tokens: Tensor) -> Tensor:
        if self.router_features == "query":
            return tokens[:, 0]
        blocks = self.backbone.blocks
        if self.query_index != len(blocks) - 1:
            tokens = blocks[-1](tokens)
        return self.backbone.norm(tokens[:, :1])[:, 0]

    def on_query_block(self, block: nn.Module, args: Any, output: Tensor) -> Optional[Tensor]:
        call, record, ensemble = self.call, self.record, self.options.ensemble
        if not call.armed:
            return None
        call.armed = False
        query = output[:, 0]
        # The router keeps the first training query of a stream batch: later online iterations skip the extra block.
        recorded = record.training and record.query is not None
        features = self.router_input(output) if self.options.router and not recorded else None
        if record.training:
            if features is not None:
                record.seen(query=features)
            if ensemble and not isinstance(getattr(self.model, "count", None), Tensor):
                call.selection = self.own_selection(query.detach())
            return None
        experts = record.route(features) if features is not None else None
        if experts is None:
            call.selection = self.own_selection(query.detach()) if ensemble else None
            return None
        call.selection = experts
        crafted = output.clone()
        crafted[:, 0] = getattr(self.model, self.key_name).detach()[experts].to(output.dtype)
        return crafted

    def forward_features(self, *args: Any, **kwargs: Any) -> Any:
        call, record, ensemble = self.call, self.record, self.options.ensemble
        count = getattr(self.model, "count", None)
        before = count.detach().clone() if record.training and ensemble and isinstance(count, Tensor) else None
        call.armed, call.selection = True, None
        try:
            output = self.original_features(*args, **kwargs)
        finally:
            call.armed = False
        if record.training:
            images = args[0] if args else next(iter(kwargs.values()), None)
            grown = None
            if ensemble:
                grown = (self.model.count - before > 0).nonzero().squeeze(1) if before is not None else call.selection
            record.seen(images.shape[0] if isinstance(images, Tensor) else None, banks=grown)
        elif ensemble:
            call.mvp_mask = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            record.eval_banks = None if call.selection is None else call.selection.reshape(-1).long()
        return output

    # -------------------------------------------------------------------------------------- the head
    def swap_head(self) -> None:
        """The head keeps its input at inference; the model's output is replaced by the ensemble of the
        members, multiplied by MVP's class mask (a per-sample transform the head alone cannot see)."""
        self.replace_head(*self.family.plan.head, scorer=self.keep_input)
        self.install.forward_hook(self.model, self.ensemble_output)

    def keep_input(self, x: Tensor) -> Tensor:
        self.call.head_input = x
        return self.handle.ensemble.online(x)

    def ensemble_output(self, module: nn.Module, args: Any, output: Tensor) -> Optional[Tensor]:
        call, handle = self.call, self.handle
        if handle.record.training:
            return None
        features, call.head_input = call.head_input, None
        mvp_mask, call.mvp_mask = call.mvp_mask, None
        if features is None:
            return None
        banks = handle.record.pop_banks(features.shape[0])
        transform = None
        if getattr(self.model, "use_mask", False) and isinstance(mvp_mask, Tensor):
            scale = mvp_mask.reshape(features.shape[0], -1).unsqueeze(1)
            transform = lambda members: members * scale  # noqa: E731
        return ensemble_scores(handle.ensemble, features, banks, handle.logit_mask, transform)


retrofit = register_family(MVP)
