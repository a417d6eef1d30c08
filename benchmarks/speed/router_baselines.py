"""The router benchmark's inputs, the reference approach re-implemented, and the measures that compare them.

* inputs: ViT-like clustered query features (``clustered_features``, also the router-timing study's);
* the reference approach (docs/protocol.md, sections 3.5 and 6.1): a dense per-batch statistics update,
  a general LU solve and an explicit inverse, all from the same statistics as ours;
* measures: the largest eigenvalue of ``G``, the relative residual of a solution, relative differences.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


# =================================================================================== inputs
def clustered_features(
    n: int, dim: int, experts: int, *, seed: int, classes_per_expert: int = 4, device: str = "cpu"
) -> Tuple[Tensor, Tensor]:
    """ViT-like query features: a clustered Gaussian mixture passed through a final LayerNorm.

    Every sample shares a common direction (CLS tokens of a pretrained ViT are strongly correlated),
    each expert (task) has a centre, each class a sub-centre around it, plus isotropic noise; the
    final ``layer_norm`` gives every sample zero mean and unit variance over its ``dim`` entries
    (``||h|| = sqrt(dim)``, about 27.7 at ``dim=768``), the scale a ViT's final LayerNorm produces.
    Returns float32 features ``(n, dim)`` and the expert id of each sample ``(n,)``, on ``device``
    (drawn on the CPU: the same numbers on every device).
    """
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(dim, generator=generator)
    expert_centres = 0.8 * torch.randn(experts, dim, generator=generator)
    class_centres = expert_centres.repeat_interleave(classes_per_expert, 0)
    class_centres = class_centres + 0.6 * torch.randn(class_centres.shape, generator=generator)
    labels = torch.randint(experts * classes_per_expert, (n,), generator=generator)
    features = shared + class_centres[labels] + 0.7 * torch.randn(n, dim, generator=generator)
    return F.layer_norm(features, (dim,)).to(device), (labels // classes_per_expert).to(device)


# ============================================================ the reference approach, re-implemented
class DenseStatistics:
    """The reference's statistics update: dense ``G += Phi^T Phi`` and ``Q += Phi^T Y`` (here float64)."""

    def __init__(self, projection: Tensor, experts: int) -> None:
        self.projection = projection  # (dim, M), phi = relu(h @ projection)
        width = projection.shape[1]
        self.gram = torch.zeros(width, width, dtype=projection.dtype, device=projection.device)
        self.cross = torch.zeros(width, experts, dtype=projection.dtype, device=projection.device)
        self.experts = experts

    def update(self, features: Tensor, expert_ids: Tensor) -> None:
        phi = torch.relu(features.to(self.projection.dtype) @ self.projection)
        self.gram.addmm_(phi.t(), phi)
        self.cross.addmm_(phi.t(), F.one_hot(expert_ids, self.experts).to(phi.dtype))


def full_symmetric(block_lower: Tensor) -> Tensor:
    """The full symmetric matrix from storage whose lower triangle is valid (for the baselines)."""
    full = torch.tril(block_lower)
    full += torch.tril(block_lower, -1).t()
    return full


def reference_lu_solve(gram: Tensor, cross: Tensor, ridge: float) -> Tensor:
    """``(G + lambda I)^-1 Q`` with a general LU solve (the reference's ``torch.linalg.solve``).

    The system is built with one copy and an in-place diagonal add (cheaper than the reference's
    fresh identity), so the baseline is not handicapped.
    """
    system = gram.clone()
    system.diagonal().add_(ridge)
    return torch.linalg.solve(system, cross)


def reference_inv_solve(gram: Tensor, cross: Tensor, ridge: float) -> Tensor:
    """``inv(G + lambda I) @ Q`` with an explicit float64 inverse."""
    system = gram.clone()
    system.diagonal().add_(ridge)
    return torch.linalg.inv(system) @ cross


# ================================================================================ diagnostics
def largest_eigenvalue(gram: Tensor, *, iterations: int = 60, seed: int = 0) -> float:
    """Largest eigenvalue of a symmetric PSD matrix by power iteration (Rayleigh quotient)."""
    generator = torch.Generator().manual_seed(seed)
    vector = torch.rand(gram.shape[0], 1, generator=generator, dtype=gram.dtype).to(gram.device)
    value = 0.0
    for _ in range(iterations):
        product = gram @ vector
        value = float((vector * product).sum() / (vector * vector).sum())
        vector = product / product.norm()
    return value


def relative_residual(gram: Tensor, cross: Tensor, ridge: float, solution: Tensor) -> float:
    """``||Q - (G + lambda I) W||_F / ||Q||_F`` in float64 (``gram`` full and symmetric)."""
    residual = cross - gram @ solution - ridge * solution
    return float(residual.norm() / cross.norm())


def max_relative_difference(value: Tensor, reference: Tensor) -> float:
    return float((value - reference).abs().max() / reference.abs().max())


def float32_lu_solve(gram: Tensor, cross: Tensor, ridge: float) -> Tensor:
    """The reference's own precision (float32 LU), only to show the scale of the accuracy figure."""
    system = gram.float()
    system.diagonal().add_(ridge)
    return torch.linalg.solve(system, cross.float()).double()
