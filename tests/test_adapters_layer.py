"""The declarative adapter layer: common options, the family registry, parameter errors."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import torch
from fly_modules.adapters import (
    AdapterFamily,
    EnsembleLinear,
    Layout,
    Plan,
    Retrofit,
    RetrofitOptions,
    SeamError,
    _registry,
    generic,
    l2p,
    list_families,
    register_family,
    retrofit,
)
from torch import Tensor, nn

from fly_modules import InvalidParameterError, SampleBudgetSchedule, _compat

pytest.importorskip("timm")  # the stand-in module builds timm ViTs
from upstream_standins import Tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_retrofit_signature_lists_every_common_option_with_its_default():
    parameters = inspect.signature(retrofit).parameters
    for field in dataclasses.fields(RetrofitOptions):
        assert field.name in parameters, field.name
        assert parameters[field.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert parameters[field.name].default == field.default, field.name
    common = [name for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert common == list(RetrofitOptions.names())  # nothing else, same order


def test_family_functions_show_common_then_family_options():
    parameters = list(inspect.signature(l2p.retrofit).parameters)
    assert parameters[: 1 + len(RetrofitOptions.names())] == ["model", *RetrofitOptions.names()]
    assert {"num_experts", "slots_per_expert", "query_module"} <= set(parameters)
    assert "num_experts" in inspect.signature(generic.retrofit).parameters


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(router="yes"), "router"),
        (dict(ensemble=1.5), "ensemble"),
        (dict(expansion_dim=-1), "expansion_dim"),
        (dict(expansion_dim=True), "expansion_dim"),
        (dict(seed=1.5), "seed"),
        (dict(ridge=-1.0), "ridge"),
        (dict(ridge="large"), "ridge"),
        (dict(decays=(0.9, 0.9)), "decays"),
        (dict(decays=(1.5,)), "decays"),
        (dict(decays=()), "decays"),
        (dict(aggregate="median"), "aggregate"),
        (dict(schedule="experience"), "schedule"),
        (dict(optimizer="adam"), "optimizer"),
    ],
)
def test_invalid_common_options_raise_before_anything_changes(options, match):
    model = Tiny()
    head = model.head
    with pytest.raises(InvalidParameterError, match=match):
        retrofit(model, "generic", num_experts=2, **{"router": False, **options})
    assert model.head is head and not model._forward_hooks and not model._forward_pre_hooks
    assert "_fly_modules_retrofit" not in vars(model)


def test_unknown_method_and_unknown_family_option_name_what_is_accepted():
    with pytest.raises(InvalidParameterError, match="method must be one of"):
        retrofit(Tiny(), "coda")
    with pytest.raises(InvalidParameterError, match=r"\['slots'\] are not options of method 'generic'.*route_kwarg"):
        retrofit(Tiny(), "generic", num_experts=2, router=False, slots=3)
    assert set(list_families()) >= {"l2p", "dualprompt", "misa", "mvp", "hide", "norga", "sprompt", "coda_prompt",
                                    "codaprompt", "generic", "reference"}


def test_register_family_adds_a_family_class_with_the_common_options():
    calls = []

    class Custom(AdapterFamily):
        """A family of the test: its docstring documents the public retrofit."""

        names = ("custom-test",)
        seam_contract = False

        def recognise(self, *, num_experts: int = 2) -> Plan:
            calls.append((self.options, num_experts))
            return Plan(num_experts=num_experts, head=(self.model, "head"), layout=CountBatches(self))

    class CountBatches(Layout):
        def install_hooks(self) -> None:
            self.count_batches(self.model)

    public = register_family(Custom)
    try:
        schedule = SampleBudgetSchedule(4, 3)
        model = Tiny()
        handle = retrofit(model, "custom-test", num_experts=3, expansion_dim=8, schedule=schedule)
        assert calls[0][0].expansion_dim == 8 and calls[0][0].schedule is schedule and calls[0][1] == 3
        assert handle.router.expansion_dim == 8 and handle.ensemble.num_experts == 3
        assert isinstance(model.head, EnsembleLinear) and handle.family == "custom-test"
        assert list(inspect.signature(public).parameters)[-1] == "num_experts"
        assert "its docstring documents the public retrofit" in public.__doc__
        assert "slots_per_expert: keys per slice" in l2p.retrofit.__doc__
        with pytest.raises(InvalidParameterError, match="already registered"):
            register_family(Custom)

        class Positional(AdapterFamily):
            names = ("custom-bad",)

            def recognise(self, extra: int) -> Plan:
                raise AssertionError("never called")

        with pytest.raises(InvalidParameterError, match=r"recognise must take \(self, \*"):
            register_family(Positional)
        with pytest.raises(InvalidParameterError, match="AdapterFamily subclass"):
            register_family(type("NoNames", (AdapterFamily,), {}))
        assert "custom-bad" not in list_families()
    finally:
        _registry._FAMILIES.pop("custom-test", None)


def test_register_family_takes_only_family_classes():
    def wire(model: nn.Module, options: RetrofitOptions, *, num_experts: int = 2) -> Retrofit:
        raise AssertionError("never called")

    for registered in ("custom-function", wire):
        with pytest.raises(InvalidParameterError, match="must be an AdapterFamily subclass"):
            register_family(registered)
    assert "custom-function" not in list_families()


# ------------------------------------------------------------------- the family example of the docs
def docs_family_example() -> str:
    """The one Python block of the section "Adding a family" of docs/adapters.md."""
    section = (ROOT / "docs" / "adapters.md").read_text().split("## Adding a family", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"expected one Python block in 'Adding a family', found {len(blocks)}"
    return blocks[0]


class TaskPrompt(nn.Module):
    """Adds task ``task[b]``'s prompt to sample ``b`` (``None``: the current task's, for every sample)."""

    def __init__(self, num_tasks: int, dim: int) -> None:
        super().__init__()
        self.num_tasks, self.current_task = num_tasks, 0
        self.prompts = nn.Parameter(torch.randn(num_tasks, dim))

    def forward(self, features: Tensor, task: Optional[Tensor] = None) -> Tensor:
        if task is None:
            task = torch.full((features.shape[0],), self.current_task, dtype=torch.long)
        return torch.tanh(features + self.prompts[task])


class TaskPromptModel(nn.Module):
    """The model the docs' family describes: a frozen encoder, per-task prompts, a linear head."""

    def __init__(self, num_tasks: int = 3, dim: int = 16, classes: int = 6) -> None:
        super().__init__()
        self.encoder = nn.Linear(3 * 8 * 8, dim).requires_grad_(False)
        self.prompt = TaskPrompt(num_tasks, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.prompt(self.encoder(x.flatten(1))))


def test_the_family_example_of_the_docs_installs_and_passes_verify():
    code = docs_family_example()
    assert len(code.splitlines()) <= 45  # shorter than the 51 lines of the page before the Layout split
    torch.manual_seed(0)
    model = TaskPromptModel()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    namespace: Dict[str, Any] = {"__name__": "docs_family_example"}
    try:
        exec(compile(code, "docs/adapters.md", "exec"), namespace)
        assert "task-prompts" in list_families()
        handle = retrofit(model, "task-prompts", optimizer=optimizer, expansion_dim=64, ridge=1.0)
        assert isinstance(model.head, EnsembleLinear) and handle.num_experts == 3
        report = handle.verify(torch.randn(6, 3, 8, 8))
        assert report.ok, str(report)
        for name in ("training follows the current expert", "ensemble banks move after an optimizer step",
                     "forcing each expert changes the logits", "batch independence, mixed experts",
                     "inference uses the ensemble"):
            assert report[name].ok is True, str(report)
        handle.remove()
        with pytest.raises(SeamError, match="has no `encoder`"):
            retrofit(nn.Sequential(nn.Linear(2, 2)), "task-prompts")
    finally:
        _registry._FAMILIES.pop("task-prompts", None)


def test_forcing_routes_the_given_experts_inside_the_block_only():
    model = Tiny()
    handle = generic.retrofit(model, num_experts=2, query_module=model.query, route_module=model.route,
                              route_kwarg="expert", expansion_dim=16, ridge=1.0)
    seen = []
    _compat.forward_pre_hook(model.route, lambda module, args, kwargs: seen.append(kwargs.get("expert")))
    model.eval()
    x = torch.randn(3, 4)
    model(x)
    assert seen == [None] and not handle.routing_active()  # the router holds no sample yet
    with handle.forcing(torch.tensor([1, 0, 1])):
        model(x)
    assert seen[1].tolist() == [1, 0, 1] and handle.record.routed.tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="inside"), handle.forcing(1):
        assert handle.routing_active()
        raise ValueError("inside")
    model(x)
    assert seen[2] is None and not handle.routing_active()
    handle.remove()
