"""The analytic router (REAR, FlyPrompt section 3.1): a forward-only ridge classifier over experts.

It keeps two sums over the stream, ``G = sum phi^T phi`` and ``Q = sum phi^T onehot(expert)`` of a
fixed random expansion ``phi(h) = relu(h R^T)``, and routes with ``W = (G + lambda I)^-1 Q``. It never
stores a sample nor sees a gradient; any split of the stream, merge of routers or sum across processes
gives the same ``W`` as one fit on all the data. What is computed, in which precision, when it warns
and what a checkpoint holds: ``docs/router.md``.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Dict, Literal, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from . import _blocked, _ridge, _router_state, _warm
from ._checkpoint import check_settings, checkpoint_entries, holds_any
from ._ridge import RouterSolveError
from ._validation import (
    SHARED_PARAMETERS,
    Integer,
    InvalidParameterError,
    NoneOr,
    NotFittedError,
    OneOf,
    PositiveReals,
    check_expert_ids,
    check_features,
    check_int,
    finite_peak,
    shared_constraints,
    shared_default,
    validate_parameters,
)
from .distributed import all_gather_update
from .expansion import RandomExpansion, _version_counter

__all__ = ["RandomExpansion", "AnalyticRouter", "RouterSolveError", "RouterConditioningWarning"]

_SOLVERS = ("auto", "mixed", "cholesky", "eigh")
# A solution whose a-priori relative error bound, cond(G + ridge I) * unit roundoff, exceeds this is
# reported with a RouterConditioningWarning (the weights may have fewer than two correct digits).
_UNRELIABLE_ERROR_BOUND = 1e-2
# Features whose largest magnitude lies in this range are expanded with a float32 product when they
# are not float64 themselves: |phi| <= max|h| * d * max|R| stays far inside float32's normal range.
_FLOAT32_PRODUCT_RANGE = (1e-20, 1e20)


class RouterConditioningWarning(RuntimeWarning):
    """The ridge system is so ill-conditioned that the routing weights may be inaccurate."""


class AnalyticRouter(nn.Module):
    r"""Ridge-regression router over random-expanded features (REAR, FlyPrompt section 3.1).

    ``update`` accumulates :math:`G = \sum \phi^\top\phi` and :math:`Q = \sum \phi^\top Y` (``Y`` the
    one-hot expert of each sample); ``forward`` returns :math:`\phi(h)\,(G + \lambda I)^{-1} Q`, the
    scores of the experts created so far; ``route`` returns the best expert among those that have
    received samples (the reference implementation can route to experts that were never trained).

    Args:
        in_features: width of the query features (the frozen, prompt-free CLS token).
        num_experts: experts declared up front; more can be added with ``add_expert()``.
        expansion_dim: width ``M`` of the random expansion (10,000 in the paper; ``0`` = plain ridge).
        ridge: ``lambda > 0``, or ``"auto"`` to choose it by generalised cross-validation from the
            statistics alone (one eigendecomposition of ``G``; no stored samples).
        ridge_grid: candidate values for ``ridge="auto"``; default 49 log-spaced values spanning
            ``1e-6`` to ``1e6`` times the mean eigenvalue of ``G``.
        activation: ``"relu"`` (paper) or ``"identity"``.
        seed: seed of the random expansion.
        solver: ``"auto"`` (by device and ``M``: a float64 Cholesky on GPUs with full-rate float64
            and for ``M`` below 3,072 on a CPU, otherwise mixed precision with float64 fallback),
            ``"mixed"``, ``"cholesky"`` (in ``stats_dtype``) or ``"eigh"``. ``ridge="auto"`` always
            uses ``"eigh"``. With ``"auto"``/``"mixed"`` on a CPU from ``M = 3,072`` a solve may start
            from the last one (``docs/router.md``, "Warm solves"), with the same float64 accuracy.
        stats_dtype: dtype of the expansion, the statistics and the solution (float64 by default). The sums
            are float64; on a CPU from ``M = 2,048`` rows that are float32 numbers (float32 features) are
            multiplied by a float32 GEMM before they are added (``docs/router.md``, "Fold precision").
        device: device of all buffers.
        fold_rows: expanded rows buffered before they are added to ``G`` and ``Q`` in one rank-k update;
            ``None`` (default) chooses from ``M`` and the device (``docs/router.md``, "Blocked updates"),
            ``1`` adds every batch at once. :meth:`flush` folds the pending rows; solves, ``merge_`` and
            the collectives call it first; ``state_dict`` saves them as they wait.

    Shape:
        - features: ``(N, in_features)``, any floating dtype (lower than float64: expanded with a
          float32 product, ``docs/router.md``, "Precision")
        - scores: ``(N, num_experts)`` in ``stats_dtype``

    Warns:
        RouterConditioningWarning: when a solve's estimated condition number makes the weights unreliable.

    Attributes:
        expansion: the :class:`RandomExpansion` (buffer ``expansion.weight``, ``(M, in_features)``).
        gram: buffer ``(M, M)`` in ``stats_dtype``; its lower triangle is ``G``'s, the entries above
            the diagonal are unspecified and never read (see :meth:`gram_matrix`). It holds the folded rows
            only: code that reads it (or ``cross``) itself calls :meth:`flush` first.
        cross: buffer ``(M, num_experts)`` in ``stats_dtype``; ``Q``.
        counts: buffer ``(num_experts,)`` long; samples accumulated per expert.
        ridge_: the ridge used by the last solve (the chosen value when ``ridge="auto"``).
        solver_: the solver actually used by the last solve: ``"mixed"``, ``"cholesky"``, ``"eigh"``, or
            ``"warm"`` (started from the last solution and factor, ``docs/router.md``, "Warm solves").
        solve_steps_: float64 residual products of the last solve (mixed or warm refinement).

    .. note::
        The checkpoint holds the statistics (with the rows not yet folded), the expansion and the settings (``ridge``, ``ridge_grid``,
        ``solver``, ``activation``, ``seed``); loading one saved with other settings raises
        :class:`InvalidParameterError` and changes nothing (``docs/router.md``, "Checkpoints"). The
        cached solution is not saved: a loaded router solves again on first use. ``.half()`` leaves
        the statistics in float32/float64. An in-place torch op on ``gram``, ``cross`` or ``counts``
        invalidates the cached solution; ``torch.distributed`` collectives do not bump the version
        counter it watches, so sum routers with :func:`fly_modules.distributed.all_reduce_statistics`.

    Examples::

        >>> router = AnalyticRouter(16, num_experts=2, expansion_dim=64, ridge=1.0)
        >>> h = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
        >>> router.update(h[:16] + 2, 0)
        >>> router.update(h[16:] - 2, torch.ones(16, dtype=torch.long))
        >>> router(h).shape
        torch.Size([32, 2])
        >>> router.route(h[:3] + 2)
        tensor([0, 0, 0])
    """

    # 2: the settings (ridge, ridge_grid, solver, activation, seed) are saved as extra state.
    # 3: the rows waiting to be folded are saved as they wait (pending_phi, pending_ids), not folded.
    _version = 3
    #: the rules of the arguments, in the order they are checked (the expansion checks its own)
    _parameter_constraints = {
        "fold_rows": NoneOr(Integer(minimum=1)),
        **shared_constraints("num_experts", "expansion_dim", "seed"),
        "stats_dtype": OneOf((torch.float32, torch.float64)),
        "ridge": SHARED_PARAMETERS["ridge"],
        "ridge_grid": NoneOr(PositiveReals()),
        "solver": OneOf(_SOLVERS),
    }

    def __init__(
        self,
        in_features: int,
        num_experts: int = 0,
        *,
        expansion_dim: int = shared_default("expansion_dim"),
        ridge: Union[float, Literal["auto"]] = shared_default("ridge"),
        ridge_grid: Optional[Sequence[float]] = None,
        activation: str = "relu",
        seed: int = shared_default("seed"),
        solver: str = "auto",
        stats_dtype: torch.dtype = torch.float64,
        device: Optional[torch.device] = None,
        fold_rows: Optional[int] = None,
    ) -> None:
        super().__init__()
        self._pending = _blocked.PendingRows()
        given = validate_parameters(self._parameter_constraints, dict(
            fold_rows=fold_rows, num_experts=num_experts, expansion_dim=expansion_dim, seed=seed,
            stats_dtype=stats_dtype, ridge=ridge, ridge_grid=ridge_grid, solver=solver), caller="AnalyticRouter")
        self.fold_rows, self.ridge, self.ridge_grid, self.solver = (
            given["fold_rows"], given["ridge"], given["ridge_grid"], given["solver"])
        num_experts, expansion_dim, seed = given["num_experts"], given["expansion_dim"], given["seed"]
        self.expansion = RandomExpansion(
            in_features, expansion_dim, activation=activation, seed=seed, device=device, dtype=stats_dtype
        )
        m = self.expansion.output_dim
        self.register_buffer("gram", torch.zeros(m, m, device=device, dtype=stats_dtype))
        self.register_buffer("cross", torch.zeros(m, num_experts, device=device, dtype=stats_dtype))
        self.register_buffer("counts", torch.zeros(num_experts, device=device, dtype=torch.long))
        self.register_buffer("_solution", None, persistent=False)
        self._stats_version = 0
        self._solution_key: Optional[Tuple[int, ...]] = None
        self.ridge_: Optional[float] = None
        self.solver_: Optional[str] = None
        #: float64 residual products of the last solve (mixed or warm refinement)
        self.solve_steps_: Optional[int] = None
        self._warm: Optional[_warm.WarmFactor] = None  # the last full solve's factor (docs/router.md, "Warm solves")
        #: ``torch.distributed`` group whose processes' batches ``update`` gathers (``None``: local only).
        self.process_group: Optional[Any] = None

    # ------------------------------------------------------------------------------ properties
    @property
    def in_features(self) -> int:
        return self.expansion.in_features

    @property
    def expansion_dim(self) -> int:
        return self.expansion.output_dim

    @property
    def num_experts(self) -> int:
        return self.cross.shape[1]

    @property
    def num_samples(self) -> int:
        """Samples accumulated so far (over all experts)."""
        return int(self.counts.sum())

    @property
    def stats_dtype(self) -> torch.dtype:
        return self.gram.dtype

    @property
    def device(self) -> torch.device:
        """Where the statistics live (and where ``update`` and ``forward`` expect the features)."""
        return self.gram.device

    @property
    def pending_rows(self) -> int:
        """Rows added by ``update`` and not yet folded into ``G`` and ``Q`` (counted in ``counts`` already)."""
        return self._pending.rows

    @property
    def pending_bytes(self) -> int:
        """Memory of the buffer of pending rows (allocated on the first ``update``; freed by a device move)."""
        return self._pending.nbytes

    @property
    def weight(self) -> Tensor:
        """Routing weights ``(num_experts, M)``, the transpose of the ridge solution (solves if stale)."""
        return self._solve_if_stale().t()

    # -------------------------------------------------------------------------------- experts
    def add_expert(self, count: int = 1) -> int:
        """Append ``count`` experts (zero columns of ``Q``); returns the id of the last one added.

        A cached solution is extended with zero columns instead of being recomputed: a new expert has
        no samples, so its ridge weights are exactly zero.
        """
        count = check_int(count, "count", caller="AnalyticRouter.add_expert", minimum=1)
        self.flush()
        fresh = self._solution is not None and self._solution_key == self._statistics_key()
        self.cross = torch.cat([self.cross, self.cross.new_zeros(self.cross.shape[0], count)], dim=1)
        self.counts = torch.cat([self.counts, self.counts.new_zeros(count)])
        if fresh:
            self._solution = torch.cat([self._solution, self._solution.new_zeros(self._solution.shape[0], count)], 1)
            self._solution_key = self._statistics_key()
        return self.num_experts - 1

    def _grow_to(self, num_experts: int) -> None:
        if num_experts > self.num_experts:
            self.add_expert(num_experts - self.num_experts)

    # ----------------------------------------------------------------------------- statistics
    @torch.no_grad()
    def update(self, features: Tensor, expert_ids: Union[int, Tensor]) -> None:
        """Accumulate a batch into ``G``, ``Q`` and the per-expert counts.

        Args:
            features: ``(N, in_features)`` query features (finite, floating point, on the router's device).
            expert_ids: one expert id for the whole batch, or a ``(N,)`` integer tensor.

        When ``process_group`` is set (data-parallel training), every process's batch is gathered
        first, so all processes add the same global batch and keep identical statistics.

        The expanded rows wait in a buffer and are added to ``G`` and ``Q`` together with later
        batches' (``fold_rows``); every reader of the statistics folds them in first.
        """
        if self.process_group is not None:
            all_gather_update(self, features, expert_ids, self.process_group)
            return
        # Finiteness is checked by _accumulate's reduction, which also gives the peak: one host read.
        features, ids = self._check_batch(features, expert_ids, caller="AnalyticRouter.update", check_finite=False)
        self._accumulate(features, ids)

    def _check_batch(
        self, features: Tensor, expert_ids: Union[int, Tensor], *, caller: str, allow_empty: bool = False,
        check_finite: bool = True,
    ) -> Tuple[Tensor, Tensor]:
        """The validated batch: the features as given, ``(N,)`` long expert ids."""
        device = self.device
        features = check_features(features, self.in_features, caller=caller, device=device, allow_empty=allow_empty,
                                  check_finite=check_finite)
        ids = check_expert_ids(expert_ids, features.shape[0], self.num_experts, caller=caller, device=device)
        return features, ids

    def _expand(self, features: Tensor, peak: float) -> Tensor:
        """``phi`` in the statistics dtype. Features of lower precision are multiplied in float32 unless
        their largest magnitude ``peak`` lies outside the range where the float32 product is as exact."""
        if features.dtype != torch.float64 and peak and not _FLOAT32_PRODUCT_RANGE[0] <= peak <= _FLOAT32_PRODUCT_RANGE[1]:
            features = features.double()
        return self.expansion(features)

    def _accumulate(self, features: Tensor, ids: Tensor) -> None:
        """Add a validated batch to the statistics (or reject it, unchanged, when it would overflow)."""
        if features.shape[0] == 0:
            return
        feature_peak = finite_peak(features, caller="AnalyticRouter.update")
        phi = self._expand(features, feature_peak)
        # Finite features can still overflow the statistics once cast and expanded; reject the batch
        # before anything is added (each entry of G grows by at most N * max|phi|^2 here). The bound
        # |phi| <= max|h| * max_j ||R_j||_1 settles it without reading phi back in all but extreme cases.
        limit = torch.finfo(phi.dtype).max / phi.shape[0]
        peak = feature_peak * self.expansion.row_norm_bound()
        if not peak * peak < limit:
            peak = float(phi.abs().amax())
        if not peak * peak < limit:
            raise InvalidParameterError(
                f"AnalyticRouter.update: the expanded features overflow {phi.dtype} (largest |phi| = {peak:.3g} "
                f"for a batch of {phi.shape[0]}); scale the features down"
                + (" or use stats_dtype=torch.float64" if phi.dtype != torch.float64 else "")
            )
        # index_add_ rather than bincount, which reads the largest id back to size its output on CUDA.
        self.counts.index_add_(0, ids, torch.ones_like(ids))
        if self._warm is not None:
            self._warm.record(phi)  # the next solve's preconditioner (docs/router.md, "Warm solves")
        pending, capacity = self._pending, self.fold_rows or _blocked.default_fold_rows(phi.shape[1], phi.device)
        if pending.capacity != capacity and pending.capacity:
            self.flush()
            pending.release()
        if phi.shape[0] >= capacity:  # a batch as large as the buffer is added as it is
            self.flush()
            _blocked.add_rows(self.gram, self.cross, phi, ids)
        else:
            if not pending.fits(phi.shape[0]):
                self.flush()
            if not pending.capacity:
                pending.allocate(capacity, phi)
            pending.append(phi, ids)
            if pending.rows == capacity:
                self.flush()
        self._mark_stale()

    @torch.no_grad()
    def flush(self) -> None:
        """Fold the pending rows into ``G`` and ``Q`` now, in one rank-k update (nothing when none are pending).

        The router's own readers of the statistics call it first: solves, :meth:`gram_matrix`,
        :meth:`merge_`, :meth:`add_expert`, device or dtype moves that change something and the collectives
        of :mod:`fly_modules.distributed` (``state_dict`` saves the pending rows unfolded, so a resumed run
        folds where the uninterrupted one does). Code that reads the ``gram`` or ``cross`` buffers itself calls
        it before: reading them never changes them.
        """
        self._pending.fold_into(self.gram, self.cross)

    @torch.no_grad()
    def merge_(self, other: "AnalyticRouter") -> "AnalyticRouter":
        """Add another router's statistics to this one (in place); returns ``self``.

        Both routers must share the random expansion (same ``in_features``, ``expansion_dim``,
        activation and seed). The merged router equals one router fed both routers' data.
        """
        if not isinstance(other, AnalyticRouter):
            raise InvalidParameterError(f"AnalyticRouter.merge_: expected an AnalyticRouter, got {type(other).__name__}")
        self._check_same_expansion(other)
        self.flush()
        other.flush()
        self._grow_to(other.num_experts)
        target = dict(device=self.device, dtype=self.stats_dtype)
        self.gram += other.gram.to(**target)
        self.cross[:, : other.num_experts] += other.cross.to(**target)
        self.counts[: other.num_experts] += other.counts.to(self.counts.device)
        self._mark_stale()
        return self

    @torch.no_grad()
    def reset_statistics(self) -> None:
        """Zero ``G``, ``Q`` and the counts (keeps the experts and the random expansion)."""
        self._pending.discard()
        self._forget_factor()
        self.gram.zero_()
        self.cross.zero_()
        self.counts.zero_()
        self._mark_stale()

    def gram_matrix(self) -> Tensor:
        """The full symmetric ``G`` with every row added so far (folds the pending rows first; a new tensor:
        only the lower triangle of the ``gram`` buffer is meaningful)."""
        self.flush()
        return _ridge.symmetrize_lower(self.gram)

    def _mark_stale(self) -> None:
        self._stats_version += 1

    def _statistics_key(self) -> Tuple[int, ...]:
        """Changes whenever the statistics may have: our own updates, and any in-place write to a
        buffer (e.g. a user's own ``dist.all_reduce(router.gram)``) or replacement of one."""
        key = [self._stats_version]
        for tensor in (self.gram, self.cross, self.counts, self.expansion.weight):
            key += [id(tensor), _version_counter(tensor)]
        return tuple(key)

    def _check_same_expansion(self, other: "AnalyticRouter") -> None:
        mine, theirs = self.expansion, other.expansion
        layout = (mine.in_features, mine.out_features, mine.activation)
        other_layout = (theirs.in_features, theirs.out_features, theirs.activation)
        if layout != other_layout:
            raise InvalidParameterError(
                f"AnalyticRouter.merge_: routers differ in (in_features, expansion_dim, activation): "
                f"{layout} vs {other_layout}"
            )
        if not torch.equal(mine.weight, theirs.weight.to(device=mine.weight.device, dtype=mine.weight.dtype)):
            raise InvalidParameterError(
                f"AnalyticRouter.merge_: the routers use different random expansions (seeds {mine.seed} and "
                f"{theirs.seed}); statistics are only additive over the same expansion"
            )

    # ---------------------------------------------------------------------------------- solve
    @torch.no_grad()
    def solve(self) -> Tensor:
        """Solve ``(G + lambda I) W = Q`` now (normally done lazily); returns ``W`` ``(M, num_experts)``."""
        if self.num_samples == 0:
            raise NotFittedError(
                "AnalyticRouter has no statistics yet: call update(features, expert_ids) before routing"
            )
        self.flush()
        result = self._solve_warm() or self._solve_system()
        if _ridge.error_bound(result) > _UNRELIABLE_ERROR_BOUND:
            warnings.warn(_ridge.conditioning_message(result, float(self.gram.diagonal().max())),
                          RouterConditioningWarning, stacklevel=_user_stacklevel())
        if result.factor is not None and self._warm_allowed():
            self._warm = _warm.WarmFactor(result.factor, result.ridge, self.num_samples)
        if self._warm is not None:
            self._warm.anchor(result.product)  # the next warm solve's first residual (docs/router.md)
        self._solution = result.weights
        self._solution_key = self._statistics_key()
        self.ridge_, self.solver_, self.solve_steps_ = result.ridge, result.solver, result.refinement_steps
        return result.weights

    def _warm_allowed(self) -> bool:
        return _warm.warm_allowed(self.solver, self.ridge, self.stats_dtype, self.device, self.expansion_dim)

    def _solve_warm(self) -> Optional[_ridge.RidgeSolution]:
        """A warm solve when the factor kept allows one (``docs/router.md``, "Warm solves"); ``None``, and the
        factor dropped, when the full solve must run."""
        result = None
        if self._warm is not None and self._warm_allowed():
            result = _warm.solve_from(self._warm, self._solution, self.gram, self.cross, self.ridge, self.num_samples,
                                      nonnegative=self.expansion.nonnegative)
        if result is None:
            self._forget_factor()  # before the full solve allocates its own
        return result

    def _forget_factor(self) -> None:
        """Drop the cached factor (its memory, M x M float32); the next solve is a full one. Called when the
        statistics are replaced or moved (load, device move, reset) and before a full solve."""
        self._warm = None

    def _solve_system(self) -> _ridge.RidgeSolution:
        if self.ridge == "auto" or self.solver == "eigh":
            ridge = None if self.ridge == "auto" else self.ridge
            return _ridge.solve_eigh(self.gram, self.cross, ridge, grid=self.ridge_grid, num_samples=self.num_samples)
        keep_factor = self._warm_allowed()
        if self.solver == "auto" and _ridge.preferred_solver(self.device, self.expansion_dim) == "cholesky":
            return _ridge.solve_cholesky(self.gram, self.cross, self.ridge, keep_factor=keep_factor)
        if self.solver in ("auto", "mixed") and self.stats_dtype == torch.float64:
            result = _ridge.solve_mixed(self.gram, self.cross, self.ridge, nonnegative=self.expansion.nonnegative)
            if result is not None:
                return result
            if self.solver == "mixed":
                warnings.warn(
                    "AnalyticRouter: mixed-precision refinement did not converge (G + ridge*I is too "
                    "ill-conditioned for a float32 factor); solved with a float64 Cholesky instead",
                    RuntimeWarning,
                    stacklevel=_user_stacklevel(),
                )
        return _ridge.solve_cholesky(self.gram, self.cross, self.ridge, keep_factor=keep_factor)

    def _solve_if_stale(self) -> Tensor:
        self.flush()
        if self._solution is None or self._solution_key != self._statistics_key():
            return self.solve()
        return self._solution

    # -------------------------------------------------------------------------------- routing
    @torch.no_grad()
    def forward(self, features: Tensor) -> Tensor:
        """Routing scores ``(N, num_experts)`` of the experts created so far."""
        features = check_features(
            features, self.in_features, caller="AnalyticRouter", device=self.device, check_finite=False
        )
        peak = finite_peak(features, caller="AnalyticRouter")
        if self.num_experts == 0:
            raise NotFittedError("AnalyticRouter has no experts: pass num_experts or call add_expert()")
        solution = self._solve_if_stale()
        return self._expand(features, peak) @ solution

    @torch.no_grad()
    def route(self, features: Tensor) -> Tensor:
        """Expert id ``(N,)`` of each sample: the best-scoring expert among those with samples."""
        scores = self.forward(features)
        untrained = self.counts == 0
        if bool(untrained.any()):
            scores = scores.masked_fill(untrained, float("-inf"))
        return scores.argmax(dim=1)

    # ---------------------------------------------------------------------------- persistence
    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        # A parent's .half() / .bfloat16() must not round G: the solve needs float32 at least. Device
        # moves and float32 <-> float64 casts apply as usual (the features are cast on input anyway).
        # A real move folds the pending rows first and allocates the buffer again where the statistics
        # now live; a move that changes nothing (a framework's model.to(device) on every experience) is
        # no fold boundary, so a run's fold history does not depend on how often it is called.
        def keep_solvable_precision(tensor: Tensor) -> Tensor:
            moved = fn(tensor)
            if tensor.is_floating_point() and moved.dtype not in (torch.float32, torch.float64):
                return tensor.to(device=moved.device)
            return moved

        probe = self.gram.new_empty(0)
        if keep_solvable_precision(probe) is not probe:
            self.flush()
            self._pending.release()
            self._forget_factor()
        return super()._apply(keep_solvable_precision, *args, **kwargs)

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # type: ignore[no-untyped-def]
        # A checkpoint holds every row added so far: the folded ones in G and Q, the pending ones as
        # they wait. Saving folds nothing, so a resumed run folds where the uninterrupted one does and
        # continues bit for bit on any CPU (a fold at the save would change G's summation order).
        # For the same reason a save is a solve boundary: the warm-solve factor is not saved, so the next solve
        # is a full one in the run that saved as in the one resumed (docs/router.md, "Warm solves").
        self._forget_factor()
        super()._save_to_state_dict(destination, prefix, keep_vars)
        phi, ids = self._pending.saved()
        destination[prefix + "pending_phi"] = phi.to(self.gram.device, self.gram.dtype).reshape(-1, self.expansion_dim)
        destination[prefix + "pending_ids"] = ids.to(self.gram.device)

    def get_extra_state(self) -> Dict[str, Any]:
        """The settings that decide the numbers and are not buffers (plain Python: ``weights_only=True`` loads them)."""
        return {
            "ridge": self.ridge, "ridge_grid": self.ridge_grid, "solver": self.solver,
            "activation": self.expansion.activation, "seed": self.expansion.seed,
        }

    def set_extra_state(self, state: Dict[str, Any]) -> None:
        saved = self._check_saved_settings(state)
        self.expansion.seed = saved["seed"]  # the seed of the expansion weight loaded with it

    def _check_saved_settings(self, state: Any) -> Dict[str, Any]:
        fix = "build the router with the checkpoint's value (set router.{0} after loading to change it)"
        return check_settings(
            state,
            {"ridge": self.ridge, "ridge_grid": self.ridge_grid, "solver": self.solver,
             "activation": self.expansion.activation},
            caller="AnalyticRouter.load_state_dict",
            adopted=("seed",),
            fixes={"ridge": fix.format("ridge"), "ridge_grid": fix.format("ridge_grid"),
                   "solver": fix.format("solver"), "activation": "build the router with the checkpoint's activation"},
        )

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # All or nothing: every entry this router and its expansion will read is checked first. (torch
        # passes strict=True here whatever the caller asked; it applies strictness to the keys at the end.)
        names = ("expansion.weight", "gram", "cross", "counts")
        extra_key = prefix + "_extra_state"
        if not holds_any(state_dict, prefix, (*names, "_extra_state")):
            # Not in the checkpoint: the default loader only lists the missing keys (an error if strict).
            return super()._load_from_state_dict(
                state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
            )
        entries = checkpoint_entries(state_dict, prefix, names, caller="AnalyticRouter.load_state_dict")
        # Checkpoints of version 1 have no settings, nor can a safetensors file hold them: the router
        # then keeps its own (documented); otherwise they must match.
        has_settings = extra_key in state_dict
        if has_settings:
            self._check_saved_settings(state_dict[extra_key])
        _router_state.check_statistics(entries, prefix, tuple(self.expansion.weight.shape))
        pending = _router_state.saved_pending_rows(state_dict, prefix, self.expansion_dim, entries["cross"].shape[1])
        # Q and the counts grow with the experts: take the checkpoint's expert count.
        experts = entries["cross"].shape[1]
        if experts != self.num_experts:
            self.cross = self.cross.new_zeros(self.cross.shape[0], experts)
            self.counts = self.counts.new_zeros(experts)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if not has_settings and extra_key in missing_keys:
            missing_keys.remove(extra_key)
        for name in _router_state.PENDING_ENTRIES:
            if prefix + name in unexpected_keys:
                unexpected_keys.remove(prefix + name)
        # The checkpoint's pending rows replace the rows added since (none in checkpoints before version 3).
        phi, ids = pending
        capacity = self.fold_rows or _blocked.default_fold_rows(self.expansion_dim, self.gram.device)
        self._pending.restore(phi.to(self.gram), ids.to(self.gram.device, torch.long), capacity)
        self._solution = None
        self._forget_factor()
        self._mark_stale()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, expansion_dim={self.expansion_dim}, num_experts={self.num_experts}, "
            f"ridge={self.ridge}, stats_dtype={self.stats_dtype}"
        )


# ====================================================================================== helpers
_INTERNAL_DIRECTORIES = (os.path.dirname(__file__) + os.sep, os.path.dirname(torch.__file__) + os.sep)


def _user_stacklevel() -> int:
    """``stacklevel`` for a warning raised here that points at the first caller outside fly_modules and torch."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRECTORIES):
        level, frame = level + 1, frame.f_back
    return level
