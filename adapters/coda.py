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

from ._family import AdapterFamily, Plan
from ._groups import expert_groups, merge_groups
from ._layout import Layout
from ._registry import register_family
from ._seams import SeamError, step_counter

__all__ = ["CodaPrompt", "retrofit"]

_WHAT = "FlyGCL's CodaPrompt: task_count, num_pt_per_task, e_k_<layer> component keys, forward(inputs)"


class CodaPrompt(AdapterFamily):
    """Retrofit FlyGCL's CODA-Prompt model.

    The model's own forward, once per routed-task group with ``task_count`` set to the task.

    Args:
        num_experts: tasks (default ``model.task_num``).
        start_expert: the method's own expert start; default ``model.process_task_count()`` up to the
            expert (what FlyGCL's trainer calls at each task end: the next block is re-initialised).
        router_dim: width of the router features (default the classifier's ``in_features``).
    """

    names = ("coda_prompt", "codaprompt")

    def recognise(self, *, num_experts: Optional[int] = None, start_expert: Optional[Callable[[int], None]] = None,
                  router_dim: Optional[int] = None) -> Plan:
        model = self.model
        self.refuse_framework_layout()
        layers = getattr(model, "pos_e_prompt", None)
        if not isinstance(layers, Tensor) or not all(hasattr(model, f"e_k_{int(i)}") for i in layers):
            raise self.missing_seam("pos_e_prompt` and `e_k_<layer>", _WHAT)
        if not isinstance(getattr(model, "num_pt_per_task", None), int) or model.num_pt_per_task < 1:
            raise self.missing_seam("num_pt_per_task", "components per task, an int >= 1")
        counter = step_counter(model)
        if counter is None or counter.attribute != "task_count":
            raise self.missing_seam("task_count` and `process_task_count()", _WHAT)
        backbone = self.backbone_of("the ViT the prompts are inserted into", forward_features=True)
        num_experts = self.count_experts(num_experts, getattr(model, "task_num", None), "tasks")
        components = int(getattr(model, f"e_k_{int(layers[0])}").shape[0])
        if num_experts * model.num_pt_per_task > components:
            raise InvalidParameterError(
                f"{self.caller}: num_experts={num_experts} tasks of {model.num_pt_per_task} components need "
                f"{num_experts * model.num_pt_per_task}, the pool holds {components}"
            )
        return Plan(head=self.find_head(backbone), num_experts=num_experts, layout=_Windows(self, backbone),
                    start_expert=start_expert, counter=counter, router_dim=router_dim)

    def refuse_framework_layout(self) -> None:
        inner = getattr(self.model, "prompt", None)
        if isinstance(inner, nn.Module) and hasattr(inner, "task_count") and not hasattr(self.model, "pos_e_prompt"):
            raise SeamError(
                f"{self.caller}: {type(self.model).__name__} keeps CODA-Prompt's components in a separate `prompt` module "
                f"({type(inner).__name__}, called inside the ViT's blocks: the Mammoth / LAMDA-PILOT layout), which "
                "this family does not wire; only FlyGCL's CodaPrompt (components on the model, forward(inputs)) is "
                "supported. The same mapping applies (a routed task t gets the component window [0, (t+1)*pt) of "
                "prompt.task_count), but it is not implemented or verified for this layout"
            )



class _Windows(Layout):
    """The model's own forward, once per routed-task group with its component window."""

    def __init__(self, family: CodaPrompt, backbone: nn.Module) -> None:
        super().__init__(family)
        self.backbone, self.original = backbone, family.model.forward

    def install_hooks(self) -> None:
        if self.options.router:
            self.query_class_token(self.backbone)  # CODA's own query
        self.install.set_attribute(self.model, "forward", self.forward)

    def windowed(self, inputs: Tensor, expert: int, *args: Any, **kwargs: Any) -> Any:
        """The model's own forward with the component window of ``expert``."""
        model = self.model
        saved = model.task_count
        model.task_count = int(expert)  # the attribute the model's forward reads its window from
        try:
            self.record.seen(banks=torch.full((inputs.shape[0],), int(expert), dtype=torch.long, device=inputs.device))
            return self.original(inputs, *args, **kwargs)
        finally:
            model.task_count = saved

    def forward(self, inputs: Tensor, *args: Any, **kwargs: Any) -> Any:
        record = self.record
        if record.training:
            current = torch.full((inputs.shape[0],), int(self.model.task_count), dtype=torch.long, device=inputs.device)
            record.seen(inputs.shape[0], banks=current, trained=current)
            return self.original(inputs, *args, **kwargs)
        experts = None
        if self.options.router and record.routing_active():
            experts = record.route(record.pop_query(inputs.shape[0]))
        record.eval_query = None
        if experts is None:
            return self.windowed(inputs, int(self.model.task_count), *args, **kwargs)
        parts, rows = [], []
        for expert, index in expert_groups(experts):
            parts.append(self.windowed(inputs[index], expert, *args, **kwargs))
            rows.append(index)
        return merge_groups(parts, rows)


retrofit = register_family(CodaPrompt)
