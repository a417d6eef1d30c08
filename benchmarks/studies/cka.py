"""Linear CKA between experts (the paper's Fig. 3 for MVP and its appendix figures for MISA and FlyPrompt).

At the end of the stream every test image goes through each trained expert, forced (the forced-expert
passes of docs/diagnostics.md), and through the parameters every expert shares alone
(``PromptMethod.common_features``: the G-prompt of MVP, DualPrompt and MISA; the bare backbone for
FlyPrompt). With ``Z_t`` the ``(n, d)`` head inputs of expert ``t`` and ``Z_com`` the common ones, the paper
compares the residuals ``Z_t - Z_com``:

    CKA(X, Y) = ||X^T Y||_F^2 / (||X^T X||_F ||Y^T Y||_F),   X, Y column-centred (Kornblith et al., 2019)

:class:`ExpertFeatureMoments` holds, in float64, the sums of the concatenated features ``[Z_1 ... Z_T Z_com]``
and of their outer products, one ``(T+1) d`` square matrix added batch by batch (summed over processes), so
no feature is stored; every pair's CKA, on the residuals and on the raw features, follows from it
(:func:`cka_matrices`). :func:`linear_cka` is the direct formula on two feature matrices, the reference
the tests compare with.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch
from torch import Tensor

__all__ = ["linear_cka", "cka_from_cross_products", "residual_cross_products", "ExpertFeatureMoments", "cka_matrices"]


def linear_cka(x: Tensor, y: Tensor) -> float:
    """Linear CKA of ``x`` ``(n, d1)`` and ``y`` ``(n, d2)`` (the same ``n`` samples, in order), in float64."""
    if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"linear_cka: expected two (n, d) matrices of the same n, got {tuple(x.shape)} and "
                         f"{tuple(y.shape)}")
    x = x.double() - x.double().mean(dim=0)
    y = y.double() - y.double().mean(dim=0)
    cross = torch.linalg.matrix_norm(x.T @ y) ** 2
    return float(cross / (torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)))


def cka_from_cross_products(blocks: Tensor) -> Tensor:
    """``(k, k)`` CKA of every pair from the centred cross-products ``blocks`` ``(k, d, k, d)``
    (``blocks[i, :, j, :] = X_i^T X_j``); NaN where a representation is constant."""
    frobenius2 = blocks.pow(2).sum(dim=(1, 3))  # ||X_i^T X_j||_F^2
    own = frobenius2.diagonal().sqrt()
    return frobenius2 / (own.unsqueeze(1) * own.unsqueeze(0))


class ExpertFeatureMoments:
    """Float64 sums of ``k`` feature blocks (the experts', then the common one) over test batches.

    ``add(blocks)`` takes ``k`` tensors ``(B, d)`` of the same samples; ``reduce(parallel)`` sums the
    processes' moments; :func:`cka_matrices` reads them.
    """

    def __init__(self, blocks: int, width: int, device: torch.device) -> None:
        self.blocks, self.width = int(blocks), int(width)
        size = self.blocks * self.width
        self.count = torch.zeros((), dtype=torch.float64, device=device)
        self.sums = torch.zeros(size, dtype=torch.float64, device=device)
        self.products = torch.zeros(size, size, dtype=torch.float64, device=device)

    def add(self, blocks: Sequence[Tensor]) -> None:
        if len(blocks) != self.blocks or any(b.shape[1:] != (self.width,) for b in blocks):
            raise ValueError(f"ExpertFeatureMoments.add: expected {self.blocks} blocks of shape (B, {self.width}), "
                             f"got {[tuple(b.shape) for b in blocks]}")
        rows = torch.cat([b.detach().to(self.products.device, torch.float64) for b in blocks], dim=1)
        self.count += rows.shape[0]
        self.sums += rows.sum(dim=0)
        self.products.addmm_(rows.T, rows)

    def reduce(self, parallel: Any) -> None:
        """Sum over the processes of a data-parallel evaluation (each scored a share of the test images)."""
        self.count, self.sums, self.products = (parallel.sum_counts(t) for t in (self.count, self.sums, self.products))

    def centred(self) -> Tensor:
        """``(k, d, k, d)`` centred cross-products ``X_i^T X_j`` of the blocks."""
        mean = self.sums / self.count
        centred = self.products - self.count * torch.outer(mean, mean)
        return centred.view(self.blocks, self.width, self.blocks, self.width)


def residual_cross_products(blocks: Tensor) -> Tensor:
    """``(T, d, T, d)`` cross-products of the residuals ``X_t - C`` from those of the blocks ``(T+1, d, T+1, d)``
    (the last block is the common one ``C``): ``X_i^T X_j - X_i^T C - C^T X_j + C^T C``, every pair at once."""
    experts, common = blocks[:-1, :, :-1, :], blocks[-1, :, -1, :]
    to_common = blocks[:-1, :, -1, :].unsqueeze(2)  # X_i^T C, the same for every j: (T, d, 1, d)
    from_common = blocks[-1, :, :-1, :].unsqueeze(0)  # C^T X_j, the same for every i: (1, d, T, d)
    return experts - to_common - from_common + common.unsqueeze(0).unsqueeze(2)


def cka_matrices(moments: ExpertFeatureMoments, experts: Sequence[int]) -> Dict[str, Any]:
    """The study's entry of a run's diagnostics: ``experts`` (the trained experts, the blocks' order),
    ``residual`` (the paper's: each expert's features minus the common representation) and ``raw`` (the
    features themselves), each a ``T x T`` CKA matrix as nested lists, and ``samples``."""
    blocks = moments.centred()
    residual = cka_from_cross_products(residual_cross_products(blocks))
    raw = cka_from_cross_products(blocks[:-1, :, :-1, :])
    return {"experts": list(experts), "residual": _rows(residual), "raw": _rows(raw), "samples": int(moments.count)}


def _rows(matrix: Tensor) -> List[List[float]]:
    return matrix.cpu().tolist()
