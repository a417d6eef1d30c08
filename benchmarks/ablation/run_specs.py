"""Every result a sweep asks for: each method's variants on each dataset and seed."""

from __future__ import annotations

from typing import List, Sequence

from ..core.protocol import RunSpec
from ..core.variants import variants_for
from ..methods import method_class

__all__ = ["run_specs"]


def run_specs(methods: Sequence[str], variants: Sequence[str], datasets: Sequence[str], seeds: Sequence[int]) -> List[RunSpec]:
    """Every result of a sweep: each method's variants for ``variants`` (:func:`benchmarks.core.variants.variants_for`)."""
    specs = []
    for dataset in datasets:
        for seed in seeds:
            for method in methods:
                for variant in variants_for(method_class(method), variants):
                    specs.append(RunSpec(method, variant, dataset, seed))
    return specs
