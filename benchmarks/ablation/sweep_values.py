"""``--sweep NAME=v1,v2,...``: one protocol setting over several values, each value checked by the setting's own
rule (the flag's parser: the library's ``SHARED_PARAMETERS`` rule for M, lambda, the decays, the experts) when
the command line is parsed, so a bad value ends the command in one line before anything runs.

``NAME`` is a :class:`~benchmarks.core.protocol.Protocol` field, its flag (``expansion-dim``) or one of the
paper's symbols (:data:`SWEEP_ALIASES`: ``M``, ``lambda``, ``r_D``, ...). A value of the decays lists its
decays joined by ``/`` (``decays=0.9,0.9/0.99``), as the comma separates the values.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

from benchmarks.studies.registry import SweepPoint

__all__ = ["SWEEP_ALIASES", "UNSWEEPABLE", "parse_sweep", "parser_of", "point_arguments", "sweep_field"]

#: the paper's symbols -> the protocol field they name
SWEEP_ALIASES: Dict[str, str] = {
    "M": "expansion_dim", "lambda": "ridge", "r_D": "disjoint_ratio", "r_B": "blurry_ratio", "mask": "train_mask",
    "schedule": "expert_schedule", "sessions": "num_sessions", "tasks": "num_sessions", "experts": "num_experts",
}
#: protocol fields whose values are JSON objects (commas inside a value): set them with their own flag
UNSWEEPABLE = ("model_kwargs", "method_kwargs")


def sweep_field(name: str, flags: Dict[str, Tuple[Any, str]]) -> str:
    """The protocol field ``name`` means; ``ArgumentTypeError`` naming the choices for one it does not."""
    field = SWEEP_ALIASES.get(name, name.replace("-", "_"))
    if field in UNSWEEPABLE:
        raise argparse.ArgumentTypeError(f"{name} takes a JSON object; set it with --{field.replace('_', '-')}")
    if field not in flags:
        choices = [*SWEEP_ALIASES, *(f for f in flags if f not in UNSWEEPABLE)]
        raise argparse.ArgumentTypeError(f"{name!r} is no protocol setting; expected one of {', '.join(choices)}")
    return field


def _parse_value(field: str, text: str, flags: Dict[str, Tuple[Any, str]]) -> Any:
    """``text`` as the flag of ``field`` parses it (a decays value's ``/`` read as its ``,``)."""
    kind = flags[field][0]
    text = text.replace("/", ",") if field == "decays" else text
    if isinstance(kind, tuple):
        if text not in kind:
            raise argparse.ArgumentTypeError(f"{field}: expected one of {', '.join(kind)}, got {text!r}")
        return text
    return kind(text)


def parse_sweep(text: str, flags: Dict[str, Tuple[Any, str]]) -> Tuple[SweepPoint, ...]:
    """The points of ``NAME=v1,v2,...``, every value checked by the rule of ``NAME``'s flag."""
    name, equals, values = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=v1,v2,... (e.g. M=1000,10000), got {text!r}")
    field = sweep_field(name.strip(), flags)
    texts = [value.strip() for value in values.split(",")]
    if not values.strip() or "" in texts:
        raise argparse.ArgumentTypeError(f"{name}: expected comma-separated values, got {values!r}")
    parsed = []
    for value in texts:
        try:
            parsed.append(_parse_value(field, value, flags))
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{name}={value}: {error}") from None
    for later, value in enumerate(parsed):  # compared as parsed: 1e4 and 10000 are one setting
        earlier = parsed.index(value)
        if earlier != later:
            same = "is given twice" if texts[earlier] == texts[later] else f"and {texts[later]} are one value"
            raise argparse.ArgumentTypeError(f"{name}: {texts[earlier]} {same} in {values!r}; give each value once")
    return tuple(SweepPoint(value, ((field, value),)) for value in texts)


def point_arguments(args: argparse.Namespace, point: SweepPoint, flags: Dict[str, Tuple[Any, str]],
                    base: Path) -> argparse.Namespace:
    """``args`` with the settings of ``point`` and its own output folder ``<base>/sweep/<point.folder>``."""
    changed = copy.copy(args)
    for field, text in point.changes:
        setattr(changed, field, _parse_value(field, text, flags))
    changed.output = str(base / "sweep" / point.folder)
    changed.sweep = None
    return changed


def parser_of(flags: Dict[str, Tuple[Any, str]]) -> Callable[[str], Tuple[SweepPoint, ...]]:
    """The argparse type of ``--sweep`` over the protocol flag table ``flags``."""
    return lambda text: parse_sweep(text, flags)
