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

from ._family import AdapterFamily, Plan
from ._layout import Layout
from ._registry import register_family
from ._seams import named_parameters, step_counter

__all__ = ["SPrompt", "retrofit"]

_WHAT = "FlyGCL's S-Prompts: model.forward(inputs, expert_ids=None) and model.experts(backbone, inputs, expert_ids)"


def _expert_ids(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tensor]:
    """``expert_ids`` of a call ``experts(backbone, inputs, expert_ids)``."""
    value = kwargs.get("expert_ids", args[2] if len(args) > 2 else None)
    return value if isinstance(value, Tensor) else None


class SPrompt(AdapterFamily):
    """Retrofit FlyGCL's S-Prompts model.

    The routed task is ``expert_ids`` of ``model.forward``; the banks are the prompt sets used.

    Args:
        num_experts: tasks (default ``model.experts.num_experts``, FlyGCL's ``task_num``).
        start_expert: the method's own expert start; default ``model.process_task_count()`` up to the
            expert (what FlyGCL's trainer calls at each task end).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """

    names = ("sprompt",)

    def recognise(self, *, num_experts: Optional[int] = None, start_expert: Optional[Callable[[int], None]] = None,
                  router_dim: Optional[int] = None) -> Plan:
        model = self.model
        experts = getattr(model, "experts", None)
        if not isinstance(experts, nn.Module) or not isinstance(getattr(experts, "prompts", None), Tensor):
            raise self.missing_seam("experts", _WHAT)
        if not {"backbone", "inputs", "expert_ids"} <= named_parameters(experts.forward):
            raise self.missing_seam("experts.forward(backbone, inputs, expert_ids)", _WHAT)
        if "expert_ids" not in named_parameters(model.forward):
            raise self.missing_seam("forward(inputs, expert_ids=None)", _WHAT)
        backbone = self.backbone_of("the ViT the prompts are inserted into", forward_features=True)
        num_experts = self.count_experts(num_experts, getattr(experts, "num_experts", None), "tasks")
        if num_experts > experts.prompts.shape[1]:
            raise InvalidParameterError(
                f"{self.caller}: num_experts={num_experts} but model.experts.prompts holds "
                f"{experts.prompts.shape[1]} prompt sets"
            )
        return Plan(head=self.find_head(backbone), num_experts=num_experts, layout=_ExpertIds(self, backbone, experts),
                    start_expert=start_expert, counter=step_counter(model), router_dim=router_dim)


class _ExpertIds(Layout):
    """The routed task as ``model.forward``'s ``expert_ids``; the banks are the prompt sets ``model.experts`` used."""

    def __init__(self, family: SPrompt, backbone: nn.Module, experts: nn.Module) -> None:
        super().__init__(family)
        self.backbone, self.experts = backbone, experts

    def install_hooks(self) -> None:
        if self.options.router:
            self.query_class_token(self.backbone)
            self.route_keyword(self.model, "expert_ids")
        self.count_batches(self.model)
        self.read_banks(self.experts, self.observe)

    def observe(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> Optional[Tensor]:
        """The prompt sets a call of ``model.experts`` used: trained, or checked against the routed ones."""
        used = _expert_ids(args, kwargs)
        if used is None:
            return None
        record = self.record
        if record.training:
            record.seen(trained=used)
        else:
            injected = record.injected  # set by the routing pre-hook of this forward
            if injected is not None and record.wants_observation:
                record.used_by_routed(injected, used, f"{type(module).__name__}.forward")
        return used


retrofit = register_family(SPrompt)
