"""The paper's studies, each a few declarative lines (:class:`benchmarks.studies.registry.Study`).

A study that trains per point names its points here; its table, JSON and figure are the points' table
(:mod:`benchmarks.studies.sweep_table`), beside the paper's numbers where :mod:`benchmarks.studies.paper_sweeps`
has them. ``--sweep NAME=v1,...`` makes the same kind of study of any one protocol setting on the fly.
"""

from __future__ import annotations

from typing import Dict, Tuple

from fly_modules.ensemble import AGGREGATION_RULES

from ..core.head_sets import PAPER_HEAD_SETS
from .registry import REGISTRY, Study, SweepPoint, register
from .router_set import ROUTERS

__all__ = ["TASKS_EXPERTS_POINTS", "points_of", "study_descriptions"]

#: the methods of the paper's mask and ratio tables that this repository has (CODA-P is not one of them)
TABLE_METHODS = ("l2p", "dualprompt", "mvp", "misa", "flyprompt")


def points_of(field: str, texts: Tuple[str, ...], label: str = "{}", *fixed: Tuple[str, str]) -> Tuple[SweepPoint, ...]:
    """One point per value of ``field`` (command-line text), labelled ``label.format(text)``, with ``fixed``."""
    return tuple(SweepPoint(label.format(text), ((field, text), *fixed)) for text in texts)


def _tasks_experts() -> Tuple[SweepPoint, ...]:
    """5, 10, 20 sessions, each with task-correlated experts (one per session) and 5, 10, 20 self-triggered ones."""
    points = []
    for tasks in ("5", "10", "20"):
        points.append(SweepPoint(f"{tasks} tasks, {tasks} experts (task-correlated)", (
            ("num_sessions", tasks), ("num_experts", tasks), ("expert_schedule", "session"))))
        points += [SweepPoint(f"{tasks} tasks, {experts} experts (self-triggered)", (
            ("num_sessions", tasks), ("num_experts", experts), ("expert_schedule", "budget")))
            for experts in ("5", "10", "20")]
    return tuple(points)


TASKS_EXPERTS_POINTS = _tasks_experts()

register(Study("routers", "the five routers on REAR's expanded features, scored in the routed variants of one "
                          "training", paper="appendix: routing algorithms on random expanded features", variants=("router", "both"),
               scored=(("routers", tuple(ROUTERS)),)))
register(Study("aggregations", "the six TE2 aggregation rules, scored in the ensemble variants of one training",
               paper="Tab. 5; appendix: aggregation methods, all backbones", variants=("ensemble", "both"),
               scored=(("aggregations", tuple(AGGREGATION_RULES)),)))
register(Study("cost", "parameters, BWT and seconds per batch of every method (python -m benchmarks.studies.cost)",
               paper="Tab. 7 (cost) and its appendix extension", command="benchmarks.studies.command:run_cost_command"))
register(Study("components", "RanPAC†, the linear probe with and without EMA heads, FlyPrompt with and without them",
               paper="Tab. 3 (ablation of the components)", methods="benchmarks.studies.components_table:STUDY_METHODS",
               variants="benchmarks.studies.components_table:STUDY_VARIANTS",
               table="benchmarks.studies.components_table:write_components"))
register(Study("rear_m", "A_auc against REAR's width M (lambda: the backbone's), with the router's storage of each M",
               paper="Fig. 5 (a-c); appendix: hyperparameter figures", methods=("flyprompt",),
               variants=("router",), points=points_of("expansion_dim", ("1000", "2000", "5000", "10000", "20000")),
               figure="storage"))
register(Study("rear_lambda", "A_auc against REAR's ridge lambda (M = 10^4)",
               paper="Fig. 5 (d-f); appendix: hyperparameter figures", methods=("flyprompt",),
               variants=("router",), fixed=(("expansion_dim", "10000"),),
               points=points_of("ridge", ("1e2", "1e3", "1e4", "1e5", "1e6", "1e7", "1e8")), figure="line"))
register(Study("decays", "the online head alone and with EMA copies of decays 0.9, 0.99, 0.999 and their "
                         "combinations, scored on one training with all three", paper="Tab. 6; appendix: EMA decays, all backbones",
               methods=("flyprompt",), variants=("ensemble", "both"), fixed=(("decays", "0.9,0.99,0.999"),),
               scored=(("heads", PAPER_HEAD_SETS),)))
register(Study("ratios", "the stream's ratios: r_D 0 / 0.5 / 1 with r_B 0.1, r_B 0.1 / 0.3 / 0.5 with r_D 0.5",
               paper="appendix: r_D and r_B variants", methods=TABLE_METHODS, variants=("baseline",),
               points=(points_of("disjoint_ratio", ("0", "0.5", "1"), "r_D={}", ("blurry_ratio", "0.1"))
                       + points_of("blurry_ratio", ("0.3", "0.5"), "r_B={}", ("disjoint_ratio", "0.5")))))
register(Study("masks", "the training logit mask: none, random, seen-class, batch seen-class",
               paper="appendix: logit mask strategies", methods=TABLE_METHODS, variants=("baseline",),
               points=points_of("train_mask", ("none", "random", "seen", "batch"))))
register(Study("tasks_experts", "5 / 10 / 20 sessions with task-correlated experts against 5 / 10 / 20 "
                                "self-triggered experts (sample budget w = N_train / experts)",
               paper="appendix: numbers of tasks and experts (CIFAR-100)", methods=("mvp", "misa", "flyprompt"),
               variants=("baseline",), points=TASKS_EXPERTS_POINTS))


def study_descriptions() -> Dict[str, str]:
    """``{name: description}`` of every registered study (this module's, registered on import), for ``--help``."""
    return {name: study.description for name, study in REGISTRY.items()}
