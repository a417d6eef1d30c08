"""The declarative adapter layer: common options, the family registry, parameter errors."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from fly_modules.adapters import (
    Retrofit,
    RetrofitOptions,
    _registry,
    generic,
    l2p,
    list_families,
    register_family,
    retrofit,
)
from fly_modules.adapters._wiring import Wiring
from torch import nn

from fly_modules import InvalidParameterError, SampleBudgetSchedule

pytest.importorskip("timm")  # the stand-in module builds timm ViTs
from upstream_standins import Tiny  # noqa: E402


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


def test_register_family_adds_a_method_with_the_common_options():
    calls = []

    def wire(model: nn.Module, options: RetrofitOptions, *, num_experts: int = 2) -> Retrofit:
        calls.append((options, num_experts))
        wiring = Wiring.create(model, "custom-test", options, classifier=model.head, num_experts=num_experts,
                               num_banks=num_experts, banks_of_expert=lambda expert: [expert])
        return wiring.handle

    public = register_family("custom-test", seam_contract=False)(wire)
    try:
        schedule = SampleBudgetSchedule(4, 3)
        handle = retrofit(Tiny(), "custom-test", num_experts=3, expansion_dim=8, schedule=schedule)
        assert calls[0][0].expansion_dim == 8 and calls[0][0].schedule is schedule and calls[0][1] == 3
        assert handle.router.expansion_dim == 8 and handle.ensemble.num_experts == 3
        assert "num_experts" in inspect.signature(public).parameters
        with pytest.raises(InvalidParameterError, match="already registered"):
            register_family("custom-test")(wire)
        with pytest.raises(InvalidParameterError, match=r"\(model, options, \*"):
            register_family("custom-bad")(lambda model, options, extra: None)
    finally:
        _registry._FAMILIES.pop("custom-test", None)
