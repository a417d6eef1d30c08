"""The router's fixed random expansion ``phi(h) = act(h R^T)``: a Gaussian ``R`` drawn from a seed, never trained.

Kept apart from :mod:`fly_modules.router` (which re-exports it) because it is a feature map of its own: the
routing study's routers share it (``benchmarks/studies/router_set.py``). Its precision rules: ``docs/router.md``.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validation import SHARED_PARAMETERS, Integer, OneOf, check_features, shared_default, validate_parameters

__all__ = ["RandomExpansion"]

_ACTIVATIONS = ("relu", "identity")


class RandomExpansion(nn.Module):
    r"""Fixed random expansion :math:`\phi(h) = \mathrm{act}(h R^\top)` with Gaussian ``R``.

    Args:
        in_features: width ``d`` of the input features.
        out_features: expansion width ``M``; ``0`` disables the expansion (``phi`` is the identity).
        activation: ``"relu"`` (the paper) or ``"identity"``.
        seed: seed of the private generator that draws ``R`` (i.i.d. standard normal, drawn in
            float32 on the CPU so that the same seed gives the same ``R`` on every device and dtype).
        device, dtype: where and in which dtype ``R`` is stored (the router uses its statistics dtype).

    Shape:
        - Input: ``(N, in_features)``
        - Output: ``(N, out_features)`` (``(N, in_features)`` when ``out_features == 0``)

    Attributes:
        weight: buffer ``(out_features, in_features)``, never trained; saved in the ``state_dict`` so a
            checkpoint does not depend on the random-number generator of the torch version that loads it.
    """

    #: the rules of the arguments, in the order they are checked (``out_features`` is the router's M)
    _parameter_constraints = {
        "in_features": Integer(minimum=1),
        "out_features": SHARED_PARAMETERS["expansion_dim"],
        "activation": OneOf(_ACTIVATIONS),
        "seed": SHARED_PARAMETERS["seed"],
    }

    def __init__(
        self,
        in_features: int,
        out_features: int = shared_default("expansion_dim"),
        *,
        activation: str = "relu",
        seed: int = shared_default("seed"),
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        given = validate_parameters(self._parameter_constraints, dict(
            in_features=in_features, out_features=out_features, activation=activation, seed=seed), caller="RandomExpansion")
        self.in_features, self.out_features = given["in_features"], given["out_features"]
        self.activation, self.seed = given["activation"], given["seed"]
        generator = torch.Generator(device="cpu").manual_seed(self.seed)
        weight = torch.randn(self.out_features, self.in_features, generator=generator, dtype=torch.float32)
        self.register_buffer("weight", weight.to(device=device, dtype=dtype or torch.float32))
        self._weight32: Optional[Tensor] = None  # float32 copy of a float64 weight, and what it was copied from
        self._weight32_source: Tuple[int, int] = (0, 0)
        self._row_norm, self._row_norm_source = 1.0, (0, 0)

    @property
    def output_dim(self) -> int:
        """Width of ``phi``: ``out_features``, or ``in_features`` when the expansion is disabled."""
        return self.out_features or self.in_features

    @property
    def nonnegative(self) -> bool:
        """Whether every ``phi`` entry is ``>= 0`` (ReLU): the router's Gram matrix then has no negative entry."""
        return self.activation == "relu" and self.out_features > 0

    def forward(self, features: Tensor) -> Tensor:
        """``phi`` in the weight's dtype. A float64 weight and features of lower precision are
        multiplied in float32 and widened (the weight is float32-exact, drawn in float32), which
        ``docs/router.md`` ("Precision") shows to be exact enough, unless torch is set to round
        float32 matmuls to TF32 or bfloat16; float64 features are multiplied in float64. Autocast is off
        inside (under a mixed-precision loop the product stays float32)."""
        # metadata only (shape, dtype, device): the router has read the values already
        check_features(features, self.in_features, caller="RandomExpansion", device=self.weight.device,
                       allow_empty=True, check_finite=False)
        if self.out_features == 0:
            return features.to(self.weight.dtype)
        with _without_autocast(features.device.type):  # autocast would round the float32 product
            if (
                self.weight.dtype == torch.float64 and features.dtype != torch.float64
                and _float32_matmul_is_ieee(features.device.type)
            ):
                projected = F.linear(features.float(), self._float32_weight())
            else:
                projected = F.linear(features.to(self.weight.dtype), self.weight)
        if self.activation == "relu":
            projected = torch.relu_(projected)
        return projected.to(self.weight.dtype)

    def row_norm_bound(self) -> float:
        """``max_j ||R_j||_1`` (1 when the expansion is disabled): ``|phi| <= max|h|`` times it."""
        source = (id(self.weight), _version_counter(self.weight))
        if self._row_norm_source != source:
            norm = float(self.weight.abs().sum(dim=1).max()) if self.out_features else 1.0
            # A margin for the product's rounding: a float32 dot product of length d is within d 2^-24 of exact.
            self._row_norm, self._row_norm_source = norm * (1 + self.in_features * 2.0**-22), source
        return self._row_norm

    def _float32_weight(self) -> Tensor:
        source = (id(self.weight), _version_counter(self.weight))  # a new or edited weight is copied again
        if self._weight32 is None or self._weight32_source != source or self._weight32.device != self.weight.device:
            self._weight32, self._weight32_source = self.weight.float(), source
        return self._weight32

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, activation={self.activation}, seed={self.seed}"


def _version_counter(tensor: Tensor) -> int:
    """The tensor's in-place version counter (-1 for inference tensors, which have none)."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


def _float32_matmul_is_ieee(device_type: str) -> bool:
    """Whether float32 matmuls on this device type round as IEEE float32 (not TF32 or bfloat16)."""
    backend = torch.backends.cuda.matmul if device_type == "cuda" else getattr(torch.backends.mkldnn, "matmul", None)
    precision = getattr(backend, "fp32_precision", None)  # torch >= 2.9; "none": inherit, IEEE by default
    if precision is not None:
        return precision in ("none", "ieee")
    if device_type == "cuda":
        return not torch.backends.cuda.matmul.allow_tf32
    try:
        return torch.get_float32_matmul_precision() == "highest"
    except RuntimeError:  # settings mixed between the legacy and the new API: assume reduced precision
        return False


def _without_autocast(device_type: str) -> ContextManager[object]:
    """Autocast switched off for ``device_type`` (the two types every supported torch autocasts)."""
    if device_type in ("cpu", "cuda"):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()
