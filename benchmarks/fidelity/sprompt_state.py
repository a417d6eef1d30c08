"""S-Prompt's official trainer as a run sets it up (a task's start follows the previous task's end), its
inference (each test sample routed to its nearest prototype's task), its prototypes against ours, and the
official trainer with its k-means replaced by ours (the row that isolates the k-means)."""

from __future__ import annotations

import inspect
from typing import Any, Dict, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from benchmarks.methods.prototypes import kmeans_centres

__all__ = ["OurKMeans", "load_official", "official_predict", "other_state", "setup_trainer", "setup_trainer_our_kmeans"]


class _NextTaskStarts:
    """``online_after_task(t)`` followed by ``online_before_task(t + 1)``: the official loop calls them in
    this order with nothing between (the side-by-side run calls only the first)."""

    def __init__(self, trainer: Any) -> None:
        self.after, self.before = trainer.online_after_task, trainer.online_before_task

    def __call__(self, task_id: int) -> Any:
        result = self.after(task_id)
        self.before(task_id + 1)
        return result


def setup_trainer(trainer: Any) -> None:
    """The first task started, and every task end followed by the next task's start; the model knows its
    trainer (where the official prototypes live) for :func:`other_state` and :func:`load_official`."""
    trainer.model.__dict__["fidelity_trainer"] = trainer
    trainer.online_before_task(0)
    trainer.online_after_task = _NextTaskStarts(trainer)


class OurKMeans:
    """scikit-learn's ``KMeans(n_clusters, random_state).fit(X).cluster_centers_``, computed by our k-means
    (``benchmarks.methods.prototypes.kmeans_centres``, seeded with ``random_state``)."""

    def __init__(self, n_clusters: int, random_state: int = 0, **kwargs: Any) -> None:
        self.n_clusters, self.random_state = int(n_clusters), int(random_state)

    def fit(self, points: np.ndarray) -> "OurKMeans":
        centres = kmeans_centres(torch.from_numpy(np.asarray(points)), self.n_clusters, seed=self.random_state)
        self.cluster_centers_ = centres.numpy()
        return self


class _WithOurKMeans:
    """The trainer's own ``_build_prototypes_for_task`` run with its module's ``KMeans`` set to :class:`OurKMeans`."""

    def __init__(self, trainer: Any) -> None:
        self.build = trainer._build_prototypes_for_task

    def __call__(self, task_id: int) -> Any:
        namespace = inspect.unwrap(self.build.__func__).__globals__  # through torch.no_grad's wrapper
        saved = namespace["KMeans"]
        namespace["KMeans"] = OurKMeans
        try:
            return self.build(task_id)
        finally:
            namespace["KMeans"] = saved


def setup_trainer_our_kmeans(trainer: Any) -> None:
    """:func:`setup_trainer`, and the prototypes clustered by our k-means instead of scikit-learn's."""
    setup_trainer(trainer)
    trainer._build_prototypes_for_task = _WithOurKMeans(trainer)


@torch.no_grad()
def official_predict(trainer: Any, images: Tensor) -> Tuple[Tensor, Tensor]:
    """``online_evaluate``'s decision for one batch (with the prototypes as they are): the routed tasks,
    then the model with those experts, plus the seen-class mask."""
    trainer.model_without_ddp.eval()
    tasks = trainer._route_batch_by_prototypes(images)
    return trainer.model(images, expert_ids=tasks) + trainer.mask, tasks


def _matched(official: Tensor, ours: Tensor) -> Tensor:
    """``ours`` reordered so that row ``i`` is the nearest to ``official[i]`` (k-means numbers its clusters
    arbitrarily)."""
    return ours[torch.cdist(official.double(), ours.double()).argmin(dim=1)]


@torch.no_grad()
def other_state(official: nn.Module, ours: nn.Module, images: Tensor) -> Dict[str, Tuple[Tensor, Tensor]]:
    """``prototypes task <t>`` -> ``(official, ours matched to them)`` for every task with prototypes."""
    trainer = official.fidelity_trainer
    compared = {}
    for task, theirs in sorted(trainer.task_prototypes.items()):
        mine = ours.prototypes[task, : int(ours.prototype_count[task])]
        compared[f"prototypes task {task}"] = (theirs, _matched(theirs, mine) if len(mine) else mine)
    return compared


@torch.no_grad()
def load_official(official: nn.Module, ours: nn.Module) -> None:
    """Our prototypes set to the official ones."""
    ours.prototypes.zero_()
    ours.prototype_count.zero_()
    for task, theirs in official.fidelity_trainer.task_prototypes.items():
        ours.prototypes[task, : len(theirs)] = theirs
        ours.prototype_count[task] = len(theirs)
