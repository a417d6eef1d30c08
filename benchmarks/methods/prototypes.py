"""Task prototypes, S-Prompt's own routing (docs/methods.md, "S-Prompt++"): k-means centres of a task's
L2-normalised frozen class tokens, and the task of each query's nearest centre.

The k-means is our own (torch, float64): k-means++ seeding from a seeded generator, then Lloyd iterations
until the centres move less than ``tol`` times the data's mean variance. It minimises the objective
scikit-learn's ``KMeans`` minimises, from other random draws, so its centres may differ from the official
code's on the same features.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["kmeans_centres", "normalise_rows", "nearest_task"]

#: added to a row's norm before dividing, as the official routing does
NORM_EPS = 1e-6


def normalise_rows(rows: Tensor) -> Tensor:
    """``rows / (||rows|| + 1e-6)`` row-wise."""
    return rows / (rows.norm(dim=1, keepdim=True) + NORM_EPS)


def _squared_distances(points: Tensor, centres: Tensor) -> Tensor:
    return (points.square().sum(1, keepdim=True) - 2 * points @ centres.T + centres.square().sum(1)).clamp_(min=0)


def _seed_centres(points: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """k-means++: the first centre uniformly, each next one with probability proportional to the squared
    distance to the nearest centre chosen so far."""
    first = int(torch.randint(len(points), (1,), generator=generator))
    centres = points[first : first + 1]
    nearest = _squared_distances(points, centres)[:, 0]
    for _ in range(1, k):
        total = float(nearest.sum())
        if total <= 0:  # fewer distinct points than centres: repeat the first
            index = first
        else:
            index = int(torch.multinomial(nearest / total, 1, generator=generator))
        centres = torch.cat((centres, points[index : index + 1]))
        nearest = torch.minimum(nearest, _squared_distances(points, points[index : index + 1])[:, 0])
    return centres


@torch.no_grad()
def kmeans_centres(points: Tensor, k: int, *, seed: int = 0, max_iter: int = 300, tol: float = 1e-4) -> Tensor:
    """``(k, D)`` k-means centres of ``points`` ``(N, D)``, ``N >= k``, in the points' dtype.

    A centre left without points keeps its place (scikit-learn moves it to a far point instead).
    """
    if len(points) < k:
        raise ValueError(f"kmeans_centres: {len(points)} points cannot make {k} centres; expected at least {k}")
    data = points.double()
    generator = torch.Generator(device=data.device).manual_seed(int(seed))
    centres = _seed_centres(data, k, generator)
    threshold = tol * float(data.var(dim=0, unbiased=False).mean())
    for _ in range(max_iter):
        assignment = _squared_distances(data, centres).argmin(dim=1)
        counts = torch.bincount(assignment, minlength=k)
        sums = torch.zeros_like(centres).index_add_(0, assignment, data)
        updated = torch.where(counts.unsqueeze(1) > 0, sums / counts.clamp(min=1).unsqueeze(1), centres)
        shift = float((updated - centres).square().sum())
        centres = updated
        if shift <= threshold:
            break
    return centres.to(points.dtype)


def nearest_task(queries: Tensor, prototypes: Tensor, counts: Tensor) -> Tensor:
    """``(B,)``: for each normalised query, the task whose nearest prototype is closest (Euclidean).

    ``prototypes`` ``(T, K, D)`` holds ``counts[t]`` prototypes of task ``t`` (the rest unused); a task
    without any is never chosen; ties go to the lower task.
    """
    distances = (queries[:, None, None, :] - prototypes.unsqueeze(0)).pow(2).sum(-1).sqrt()  # (B, T, K)
    unused = torch.arange(prototypes.shape[1], device=counts.device) >= counts.unsqueeze(1)
    return distances.masked_fill(unused, float("inf")).min(dim=2).values.argmin(dim=1)
