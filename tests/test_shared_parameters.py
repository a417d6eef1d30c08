"""The parameters the router, the ensemble, the retrofit's options and the cross-ablation's command line
share are checked by one table, ``fly_modules._validation.SHARED_PARAMETERS``: each entry reaches every
layer that takes the parameter (the same values refused, with the same message), and every parameter two
layers share is in the table."""

from __future__ import annotations

import inspect
import math
from dataclasses import fields

import pytest
from fly_modules.adapters import RetrofitOptions
from tiny_sweep import TINY
from torch import nn

from benchmarks.ablation import cli
from benchmarks.ablation.arguments import UsageError, build_parser
from benchmarks.core.protocol import Protocol
from fly_modules import AnalyticRouter, InvalidParameterError, TemporalEnsembleHead
from fly_modules._validation import SHARED_PARAMETERS


def build_router(**kwargs):
    return AnalyticRouter(4, **kwargs)


def build_ensemble(**kwargs):
    return TemporalEnsembleHead(nn.Linear(4, 3), **kwargs)


#: layer -> (caller in its messages, the parameters it takes, a call with one of them)
LIBRARY = {
    "AnalyticRouter": ("AnalyticRouter", set(inspect.signature(AnalyticRouter).parameters), build_router),
    "TemporalEnsembleHead": ("TemporalEnsembleHead", set(inspect.signature(TemporalEnsembleHead).parameters),
                             build_ensemble),
    "RetrofitOptions": ("fly_modules.adapters.retrofit", set(RetrofitOptions.names()), RetrofitOptions),
}
COMMAND_LINE = {item.name for item in fields(Protocol)}

#: values each rule refuses, with their command-line spelling (None: a value a command line cannot spell)
REFUSED = {
    "num_experts": [(-1, "-1"), (1.5, "1.5"), (True, None)],
    "expansion_dim": [(-1, "-1"), (2.5, "2.5"), (math.nan, "nan"), (True, None)],
    "ridge": [(0, "0"), (-1.0, "-1.0"), (math.nan, "nan"), (math.inf, "inf"), ("gcv", "gcv"), (True, None)],
    "seed": [(1.5, "1.5"), ("0", None), (True, None)],
    "decays": [((), None), ((0.9, 0.9), "0.9,0.9"), ((1.5,), "1.5"), ((0.0, 0.5), "0.0,0.5"), ((1, 0.5), "1,0.5"),
               (0.9, None), ("0.9", None)],
    "aggregate": [("median", "median"), (1, None)],
}
#: values each rule accepts, as the library keeps them, with their command-line spelling
ACCEPTED = {
    "num_experts": [(1, "1"), (3, "3")],
    "expansion_dim": [(0, "0"), (16, "16")],
    "ridge": [(1.0, "1"), (1e4, "1e4"), ("auto", "auto")],
    "seed": [(0, None), (7, None)],
    "decays": [((0.9,), "0.9"), ((0.5, 0.99), "0.5,0.99")],
    "aggregate": [("softmax_max", "softmax_max"), ("mean", "mean")],
}


def table_message(name, value) -> str:
    with pytest.raises(InvalidParameterError) as refused:
        SHARED_PARAMETERS[name].convert(value, name)
    return str(refused.value)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_every_parameter_two_layers_share_is_in_the_table():
    layers = [parameters for _, parameters, _ in LIBRARY.values()] + [COMMAND_LINE]
    shared = {name for i, one in enumerate(layers) for other in layers[i + 1:] for name in one & other}
    assert shared == set(SHARED_PARAMETERS)
    assert set(REFUSED) == set(ACCEPTED) == set(SHARED_PARAMETERS)


@pytest.mark.parametrize("layer", sorted(LIBRARY))
def test_each_library_layer_refuses_what_the_table_refuses_with_its_message(layer):
    caller, parameters, build = LIBRARY[layer]
    names = sorted(parameters & set(SHARED_PARAMETERS))
    assert names, layer
    for name in names:
        for value, _ in REFUSED[name]:
            with pytest.raises(InvalidParameterError) as refused:
                build(**{name: value})
            assert str(refused.value) == f"{caller}: {table_message(name, value)}", (layer, name, value)
        for value, _ in ACCEPTED[name]:
            build(**{name: value})


def test_the_command_line_refuses_what_the_library_refuses_with_its_message():
    names = sorted(COMMAND_LINE & set(SHARED_PARAMETERS))
    assert names == ["aggregate", "decays", "expansion_dim", "num_experts", "ridge"]
    parser = build_parser()
    for name in names:
        for value, text in REFUSED[name]:
            if text is None:
                continue
            with pytest.raises(UsageError) as refused:
                parser.parse_args([flag(name), text])
            assert str(refused.value) == f"argument {flag(name)}: {table_message(name, value)} (see --help)"
        for value, text in ACCEPTED[name]:
            parsed = getattr(parser.parse_args([flag(name), text]), name)
            assert parsed == value and type(parsed) is type(value), (name, text, parsed)


def test_the_command_line_refuses_no_expert_before_any_data(no_work, tmp_path):
    """A method needs one expert: the command line's own rule on top of the library's (which allows 0)."""
    with pytest.raises(UsageError, match="num_experts must be an int >= 1, got 0"):
        build_parser().parse_args(["--num-experts", "0"])
    build_router(num_experts=0)


def test_no_expansion_trains_the_router_end_to_end(tmp_path, capsys):
    """``--expansion-dim 0`` (ridge regression on the query features) through a routed training."""
    output = tmp_path / "out"
    status = cli.main([*TINY, "--variants", "router", "--expansion-dim", "0", "--output", str(output)])
    assert status == 0, capsys.readouterr().err
    assert len(list((output / "runs").rglob("*.json"))) == 1
    assert not (output / "failures").exists()
