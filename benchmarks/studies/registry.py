"""A study is a named set of runs: which protocol settings it varies and over which values (its points), which
methods and variants, which paper table or figure it sits beside, and what it scores on one training.

A study that varies a training setting (M, lambda, the ratios, the mask, sessions and experts) trains once per
point, each point in its own folder ``<output>/sweep/<setting>=<value>``, and writes one table row per point
(:mod:`benchmarks.ablation.sweep_points`); one that varies only inference (routers, aggregation rules, decay
subsets) has no points and is scored on one training, in the evaluator (``scored``). Adding a study is one
:class:`Study` in :mod:`benchmarks.studies.catalog`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

__all__ = ["REGISTRY", "Study", "SweepPoint", "register", "resolve_hook"]


@dataclass(frozen=True)
class SweepPoint:
    """One setting of a study: its row ``label`` (the paper's key) and the protocol ``changes`` it makes, as
    ``(field, command-line text)`` pairs (decays as ``0.9/0.99``)."""

    label: str
    changes: Tuple[Tuple[str, str], ...]

    @property
    def folder(self) -> str:
        """The point's results folder under ``<output>/sweep``: ``field=text,field=text``."""
        return ",".join(f"{name}={text}" for name, text in self.changes)


@dataclass(frozen=True)
class Study:
    """A named set of runs (see the module's text).

    Attributes:
        name: the ``--study`` name; ``description``: one line for ``--help``.
        paper: the paper's table or figure it sits beside.
        methods, variants: the ``--methods`` / ``--variants`` it runs unless given (``()``: the preset's), or
            the ``"module:NAME"`` of a tuple (read when used).
        fixed: protocol settings it fixes unless given, ``(field, command-line text)``.
        points: the settings it trains, one folder each; ``()``: one training.
        scored: what it scores on that training unless given, ``(sweep field, names)`` (routers,
            aggregations, heads).
        table: ``"module:function"`` writing its table from the results (``(output, results) -> markdown``),
            for a study without points; the points' table is :mod:`benchmarks.studies.sweep_table`'s.
        command: ``"module:function"`` of a study that trains nothing (``(args, given options) -> status``).
        figure: how the points' figure draws them: ``"bars"`` (one bar per point) or ``"line"`` (A_auc
            against the varied value, ``storage`` adding the router's storage of each M as bars).
    """

    name: str
    description: str
    paper: str = ""
    methods: Union[Tuple[str, ...], str] = ()
    variants: Union[Tuple[str, ...], str] = ()
    fixed: Tuple[Tuple[str, str], ...] = ()
    points: Tuple[SweepPoint, ...] = ()
    scored: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    table: Optional[str] = None
    command: Optional[str] = None
    figure: str = "bars"

    def names(self, kind: str) -> List[str]:
        """Its ``methods`` or ``variants`` (``kind``) as a list, a ``"module:NAME"`` reference read."""
        value = getattr(self, kind)
        return list(resolve_hook(value) if isinstance(value, str) else value)

    @property
    def inference_only(self) -> bool:
        """Scored on one training: no point changes what is trained."""
        return not self.points


#: study name -> :class:`Study` (filled by :mod:`benchmarks.studies.catalog`)
REGISTRY: Dict[str, Study] = {}


def register(study: Study) -> Study:
    """Add ``study`` to :data:`REGISTRY`; a second study of one name raises."""
    if study.name in REGISTRY:
        raise ValueError(f"a study named {study.name!r} is registered already")
    REGISTRY[study.name] = study
    return study


def resolve_hook(reference: str) -> Callable[..., Any]:
    """The function ``"package.module:function"`` names (imported when used: the studies' tables import
    plotting and the methods, which the command line does not need to parse its flags)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)
