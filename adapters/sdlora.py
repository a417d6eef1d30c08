"""SD-LoRA as FlyGCL ships it (``models.sdlora.SDLoRAModel``): LoRA on the attention ``qkv`` with one
direction per task and learned magnitudes, every task's direction up to ``task_count`` combined for every
sample. Nothing selects experts per sample, so the router has nothing to route: ``router=True`` is refused.
The ensemble works: one bank per task on ``model.backbone.fc``, the bank of ``task_count`` trained (the task
whose direction and magnitudes train), ``process_task_count()`` advancing the task when an expert starts.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from ._family import AdapterFamily, Plan
from ._layout import Layout
from ._registry import register_family
from ._seams import SeamError, step_counter

__all__ = ["SDLoRA", "retrofit", "ROUTER_REFUSAL"]

_WHAT = "FlyGCL's SDLoRAModel: forward(inputs, **kwargs), task_count advanced by process_task_count(), backbone.fc"

#: Why ``router=True`` is refused (also the reason a reference method's ``router_refusal`` gives).
ROUTER_REFUSAL = ("SD-LoRA combines every task's LoRA directions for every sample: there is no per-sample choice "
                  "of experts for a router to make")


class SDLoRA(AdapterFamily):
    """Retrofit FlyGCL's SD-LoRA model with the temporal ensemble (the router is refused).

    Args:
        num_experts: tasks, one ensemble bank each (default ``model.task_num``).
        start_expert: the method's own task start; default ``model.process_task_count()`` up to the task
            (what FlyGCL's trainer calls at each task end).
    """

    names = ("sdlora",)

    def recognise(self, *, num_experts: Optional[int] = None,
                  start_expert: Optional[Callable[[int], None]] = None) -> Plan:
        model = self.model
        if self.options.router:
            raise SeamError(f"{self.caller}: router=True refused for {type(model).__name__}: "
                            f"{ROUTER_REFUSAL}; retrofit it with router=False (the ensemble works)")
        counter = step_counter(model)
        if counter is None or counter.attribute != "task_count":
            raise self.missing_seam("process_task_count()", _WHAT)
        backbone = self.backbone_of("the ViT carrying the LoRA directions and the classifier")
        num_experts = self.count_experts(num_experts, getattr(model, "task_num", None), "tasks")
        return Plan(head=self.find_head(backbone), num_experts=num_experts, layout=_TaskCount(self), counter=counter,
                    start_expert=start_expert)


class _TaskCount(Layout):
    """Every sample of a call uses the task ``task_count``."""

    def install_hooks(self) -> None:
        self.install.forward_pre_hook(self.model, self.observe, with_kwargs=True)

    def observe(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Every sample of a call uses the task ``task_count``: its bank trains, or answers at inference
        (set before the call: the classifier runs inside it)."""
        images = args[0] if args and isinstance(args[0], Tensor) else kwargs.get("inputs")
        if isinstance(images, Tensor):
            task = torch.full((images.shape[0],), int(module.task_count), dtype=torch.long, device=images.device)
            self.record.seen(images.shape[0], banks=task, trained=task)


retrofit = register_family(SDLoRA)
