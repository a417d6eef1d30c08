"""Every command's flags are checked by rules, and the defaults of the shared parameters are the table's.

The walk finds every command of ``benchmarks/`` (each module with a ``main(argv)``), reads its parser
without running it, and gives each value flag values its rule refuses (derived from the rule: below its
minimum, not a number, ...): each must end in one line on stderr and exit status 2, before any work. A
flag parsed by a bare ``int`` or ``float`` (which takes ``--threads 0`` or ``--expansion-dim -5``) fails it.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import math
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
from command_walk import BENCHMARKS, COMMANDS, outcome, parser_of
from fly_modules.adapters import RetrofitOptions, retrofit

from benchmarks.core.protocol import Protocol
from benchmarks.flags import Parser, add_common_flag, add_flag, add_shared_flag
from benchmarks.methods.flyprompt import FlyPrompt
from benchmarks.studies.components_cost import CostSetting
from fly_modules import AnalyticRouter, TemporalEnsembleHead, aggregate_logits
from fly_modules._validation import (
    REQUIRED,
    SHARED_PARAMETERS,
    Decays,
    Integer,
    NoneOr,
    OneOf,
    Parameter,
    Real,
    Ridge,
)
from fly_modules.router import RandomExpansion

FAKE_FLYGCL = Path(__file__).resolve().parent / "fixtures" / "fake_flygcl"


def refused_values(rule: Any) -> List[str]:
    """Spellings that ``rule`` refuses, derived from it (its bounds, its type)."""
    while isinstance(rule, (Parameter, NoneOr)):
        rule = rule.rule
    if isinstance(rule, Integer):
        bounds = [str(rule.minimum - 1)] if rule.minimum is not None else []
        return ["abc", "1.5", *bounds, *([str(rule.maximum + 1)] if rule.maximum is not None else [])]
    if isinstance(rule, Real):
        lows = [str(rule.above)] if rule.above is not None and math.isfinite(rule.above) else []
        lows += [str(rule.minimum - 1)] if rule.minimum is not None and math.isfinite(rule.minimum) else []
        highs = [str(rule.below)] if rule.below is not None and math.isfinite(rule.below) else []
        highs += [str(rule.maximum + 1)] if rule.maximum is not None and math.isfinite(rule.maximum) else []
        return ["abc", "nan", *lows, *highs]
    if isinstance(rule, Ridge):
        return ["0", "-1", "nan", "abc"]
    if isinstance(rule, Decays):
        return ["1.5", "0.9,0.9", "abc"]
    if isinstance(rule, OneOf):
        return ["no-such-choice"]
    raise AssertionError(f"no refused values known for {rule!r}: add them here")


def value_flags(parser: argparse.ArgumentParser) -> Iterator[Tuple[str, argparse.Action]]:
    for action in parser._actions:
        if action.option_strings and action.nargs != 0:  # a flag that takes a value
            yield action.option_strings[-1], action


def unchecked_flags(parser: argparse.ArgumentParser) -> List[str]:
    """The flags parsed by a bare ``int`` or ``float``: no bounds, a traceback or silence where they matter."""
    return [flag for flag, action in value_flags(parser) if action.type in (int, float)]


def bad_command_lines(parser: argparse.ArgumentParser) -> Iterator[Tuple[str, str]]:
    """``(flag, flag=value)`` for every value each checked flag must refuse, every choice flag's unknown
    choice, and an unknown flag (whose error need not name it)."""
    for flag, action in value_flags(parser):
        rules = getattr(action.type, "rules", None)
        values = [v for rule in rules for v in refused_values(rule)] if rules else []
        values += ["no-such-choice"] if action.choices is not None and not values else []
        for value in dict.fromkeys(values):
            yield flag, f"{flag}={value}"
    yield "", "--no-such-flag=1"  # refused as unknown, or for a missing required argument first


def test_the_walk_finds_every_command():
    assert {"benchmarks.ablation.cli", "benchmarks.fidelity.cli", "benchmarks.fidelity.loop", "benchmarks.speed.router",
            "benchmarks.speed.vs_reference", "benchmarks.speed.router_timing", "benchmarks.gpu.suite",
            "benchmarks.proxy.pretrain", "benchmarks.upstream.cli"} <= set(COMMANDS)
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_flag_of_every_command_refuses_bad_values_in_one_line(name, monkeypatch, capsys):
    parser = parser_of(COMMANDS[name], monkeypatch)
    assert not unchecked_flags(parser), f"{name}: parse with a rule (benchmarks.flags.add_flag), not int/float"
    wrong = []
    for flag, argument in bad_command_lines(parser):
        status, error = outcome(COMMANDS[name], [argument], monkeypatch, capsys)
        one_line = error.startswith("error: ") and error.count("\n") == 1 and flag in error
        if status != 2 or not one_line:
            wrong.append(f"{argument}: exit {status}, stderr {error!r}")
    assert not wrong, f"{name}:\n" + "\n".join(wrong)


def test_the_walk_catches_a_bare_int_flag_and_an_unchecked_value(monkeypatch, capsys):
    """The two mistakes the walk exists for, planted in a command of their own."""
    def planted(argv):
        parser = Parser(prog="planted")
        parser.add_argument("--threads", type=int, default=1)
        add_flag(parser, "--repeats", Integer(minimum=1), default=3, help="rounds")
        parser.parse_args(argv)
        return 0

    assert unchecked_flags(parser_of(planted, monkeypatch)) == ["--threads"]
    assert outcome(planted, ["--threads=0"], monkeypatch, capsys)[0] == "accepted"
    status, error = outcome(planted, ["--repeats=0"], monkeypatch, capsys)
    assert status == 2 and error == "error: argument --repeats: repeats must be an int >= 1, got 0 (see --help)\n"


def test_the_three_examples_of_a_new_user_end_in_one_line(monkeypatch, capsys):
    for name, argv in [("benchmarks.speed.router_timing", ["--expansion-dim", "-5"]),
                       ("benchmarks.speed.router_timing", ["--threads", "0"]),
                       ("benchmarks.fidelity.cli", ["--flygcl", str(FAKE_FLYGCL), "--threads", "0"])]:
        status, error = outcome(COMMANDS[name], argv, monkeypatch, capsys)
        assert status == 2 and error.count("\n") == 1 and argv[-2] in error, (name, argv, error)


# ------------------------------------------------------------------------------------------- defaults
def signature_defaults(function: Callable[..., Any], names: Dict[str, str]) -> Dict[str, Any]:
    """``table name -> default`` of ``function``'s parameters ``names`` (parameter -> table name)."""
    parameters = inspect.signature(function).parameters
    return {table: parameters[parameter].default for parameter, table in names.items()}


SHARED = {name: name for name in ("expansion_dim", "ridge", "seed", "decays", "aggregate")}
#: what defaults to a shared parameter, and under which names
DEFAULTED: List[Tuple[str, Dict[str, Any]]] = [
    ("AnalyticRouter", signature_defaults(AnalyticRouter, {"expansion_dim": "expansion_dim", "ridge": "ridge",
                                                           "seed": "seed"})),
    ("RandomExpansion", signature_defaults(RandomExpansion, {"out_features": "expansion_dim", "seed": "seed"})),
    ("TemporalEnsembleHead", signature_defaults(TemporalEnsembleHead, {"decays": "decays", "aggregate": "aggregate"})),
    ("aggregate_logits", signature_defaults(aggregate_logits, {"rule": "aggregate"})),
    ("retrofit", signature_defaults(retrofit, SHARED)),
    ("RetrofitOptions", {name: getattr(RetrofitOptions(), name) for name in SHARED}),
    ("Protocol", {item.name: item.default for item in fields(Protocol) if item.name in SHARED}),
    ("FlyPrompt", signature_defaults(FlyPrompt, {"router_expansion_dim": "expansion_dim", "router_ridge": "ridge",
                                                 "router_seed": "seed", "decays": "decays", "aggregate": "aggregate"})),
    ("CostSetting", {"expansion_dim": CostSetting().expansion_dim}),
]


@pytest.mark.parametrize("owner, defaults", DEFAULTED, ids=[owner for owner, _ in DEFAULTED])
def test_every_default_of_a_shared_parameter_is_the_tables(owner, defaults):
    assert defaults
    for name, default in defaults.items():
        assert default == SHARED_PARAMETERS[name].default and type(default) is type(SHARED_PARAMETERS[name].default), (
            owner, name, default)


#: the paper's settings (a seed of 0 is every function's default, not a setting of the paper)
SETTINGS = ("expansion_dim", "ridge", "decays", "aggregate")
#: ``(file, parameter)``: a literal equal to the table's default that is not the shared parameter
OWN_VALUES = {("benchmarks/methods/ranpac.py", "expansion_dim")}  # RanPAC's own projection width (its paper's M)


def literal_defaults(path: Path) -> Iterator[Tuple[str, Any]]:
    """``(name, value)`` of every literal default of a parameter or a class field in ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        pairs: List[Tuple[str, ast.AST]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            positional, defaults = [*node.args.posonlyargs, *node.args.args], node.args.defaults
            pairs += [(arg.arg, default) for arg, default in zip(positional[len(positional) - len(defaults):], defaults)]
            pairs += [(arg.arg, default) for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults) if default]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            pairs.append((node.target.id, node.value))
        for name, default in pairs:
            try:
                yield name, ast.literal_eval(default)
            except ValueError:  # not a literal: read from the table, or computed
                continue


def test_the_shared_defaults_are_written_once_in_the_table():
    """No signature or field of the library, the adapters or the benchmarks spells a shared default itself."""
    repository = BENCHMARKS.parent
    copies = [f"{path.relative_to(repository)}: {name} = {value!r}"
              for root in ("fly_modules", "adapters", "benchmarks") for path in sorted((repository / root).rglob("*.py"))
              for name, value in literal_defaults(path)
              if name.removeprefix("router_") in SETTINGS
              and value == SHARED_PARAMETERS[name.removeprefix("router_")].default
              and (path.relative_to(repository).as_posix(), name) not in OWN_VALUES]
    assert not copies, "read these from the table (fly_modules._validation.shared_default):\n" + "\n".join(copies)


def test_the_tables_defaults_are_the_papers_and_pass_their_own_rules():
    paper = {"expansion_dim": 10_000, "ridge": 1e4, "seed": 0, "decays": (0.9, 0.99), "aggregate": "softmax_max"}
    assert {name: entry.default for name, entry in SHARED_PARAMETERS.items() if entry.default is not REQUIRED} == paper
    for name, default in paper.items():
        assert SHARED_PARAMETERS[name].convert(default, name) == default
    assert SHARED_PARAMETERS["num_experts"].default is REQUIRED  # each class picks its own number of experts


def test_a_shared_flag_takes_the_tables_rule_default_and_help(capsys):
    parser = Parser(prog="demo")
    add_shared_flag(parser, "expansion_dim")
    add_shared_flag(parser, "aggregate")
    add_common_flag(parser, "threads", default=2)
    assert vars(parser.parse_args([])) == {"expansion_dim": 10_000, "aggregate": "softmax_max", "threads": 2}
    assert parser.parse_args(["--expansion-dim", "0"]).expansion_dim == 0
    parser.print_help()
    shown = " ".join(capsys.readouterr().out.split())
    assert SHARED_PARAMETERS["expansion_dim"].help in shown and "(default: 10000)" in shown
    with pytest.raises(ValueError, match="none in common"):
        add_shared_flag(Parser(), "num_experts")


def test_each_class_declares_its_constraints_from_the_shared_entries():
    for owner, names in [(AnalyticRouter, ("num_experts", "expansion_dim", "ridge", "seed")),
                         (TemporalEnsembleHead, ("num_experts", "decays", "aggregate")),
                         (RetrofitOptions, ("expansion_dim", "ridge", "seed", "decays", "aggregate"))]:
        for name in names:
            assert owner._parameter_constraints[name] is SHARED_PARAMETERS[name], (owner, name)
    assert RandomExpansion._parameter_constraints["out_features"] is SHARED_PARAMETERS["expansion_dim"]
