"""The Si-Blurry stream: a seeded split of a labelled training set into sessions, batches that never
cross a session, data-parallel shares, and the classes' exposure order.

:func:`benchmarks.core.stream_draw.build_si_blurry_stream` reproduces the reference sampler draw for draw (same label vector,
seed and ratios: the same per-session order); what the stream is and which reference behaviours are
kept is in docs/stream.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator, List, Literal, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from fly_modules._validation import check_int

__all__ = [
    "SplitKind",
    "StreamBatch",
    "Exposure",
    "SiBlurryStream",
    "check_label_vector",
]

SplitKind = Literal["random", "equal"]
LabelVector = Union[Tensor, np.ndarray, Sequence[int]]


# ----------------------------------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------------------------------


def check_label_vector(labels: LabelVector, num_classes: Optional[int] = None, *, name: str = "labels") -> Tensor:
    """Validate a per-sample label vector and return it as a 1-D ``torch.long`` CPU tensor.

    Args:
        labels: one integer class id per sample, in dataset order (tensor, ndarray or sequence).
        num_classes: if given, every label must lie in ``[0, num_classes)``.
        name: the argument name used in error messages.

    Raises:
        TypeError: the labels are not integers (float, bool, complex or object values).
        ValueError: the labels are not 1-D, are empty, negative or not below ``num_classes``.
    """
    if isinstance(labels, Tensor):
        if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
            raise TypeError(f"{name} must hold integer class ids, got a tensor of dtype {labels.dtype}")
        array = labels.detach().cpu()
    else:
        np_labels = np.asarray(labels)
        if np_labels.dtype.kind not in "iu":
            raise TypeError(
                f"{name} must hold integer class ids, got values of dtype {np_labels.dtype} "
                f"(convert with .astype(int) if they are whole numbers)"
            )
        array = torch.from_numpy(np_labels.astype(np.int64, copy=False))
    if array.ndim != 1:
        raise ValueError(
            f"{name} must be a 1-D vector with one class id per sample, got shape {tuple(array.shape)}"
        )
    if array.numel() == 0:
        raise ValueError(f"{name} is empty; a stream needs at least one sample")
    array = array.to(torch.long)
    lowest, highest = int(array.min()), int(array.max())
    if lowest < 0:
        raise ValueError(f"{name} must be non-negative class ids, found {lowest}")
    if num_classes is not None and highest >= num_classes:
        raise ValueError(
            f"{name} must lie in [0, num_classes={num_classes}), found class id {highest}; "
            f"pass num_classes={highest + 1} or larger"
        )
    return array.contiguous()


def _floor_times(count: int, ratio: Fraction) -> int:
    return (count * ratio.numerator) // ratio.denominator


# ----------------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StreamBatch:
    """One training batch of the stream, as seen by one rank.

    Attributes:
        indices: ``(b,)`` long, dataset indices this rank trains on (its share of the global batch, or
            the whole global batch when iterating with ``rank=None``).
        targets: ``(b,)`` long, raw class ids of ``indices``.
        session: session (benchmark task) the batch belongs to.
        index: 0-based position of the batch among all batches of the stream.
        index_in_session: 0-based position of the batch inside its session.
        start: number of stream samples (all ranks) before this batch.
        global_size: number of samples in the batch summed over ranks (the reference's
            ``images.size(0) * world_size``).
        samples_seen: ``start + global_size``, the reference's ``samples_cnt`` after this batch.
        is_session_end: whether this is the last batch of its session.
    """

    indices: Tensor
    targets: Tensor
    session: int
    index: int
    index_in_session: int
    start: int
    global_size: int
    samples_seen: int
    is_session_end: bool


@dataclass(frozen=True, eq=False)
class Exposure:
    """Exposure order of a stream: which classes have been seen after how many samples.

    Attributes:
        order: ``(K,)`` long, raw class ids in the order they were first streamed (``K`` = number of
            classes that appear in the stream).
        first_position: ``(K,)`` long, ascending; stream position (0-based, counting all ranks) of the
            first sample of each class in ``order``. Class ``order[k]`` is exposed once more than
            ``first_position[k]`` samples have been consumed.
        table: ``(num_classes,)`` long, raw class id -> exposure index; ``-1`` for classes that never
            appear in the stream.
    """

    order: Tensor
    first_position: Tensor
    table: Tensor

    @property
    def num_classes(self) -> int:
        """Size of the raw label space."""
        return int(self.table.numel())

    def __len__(self) -> int:
        return int(self.order.numel())

    def num_exposed(self, samples_seen: Optional[int] = None) -> int:
        """Number of classes exposed after ``samples_seen`` stream samples (all of them if ``None``)."""
        if samples_seen is None:
            return len(self)
        return int(torch.searchsorted(self.first_position, torch.tensor(int(samples_seen)), side="left"))

    def exposed_labels(self, samples_seen: Optional[int] = None) -> Tensor:
        """Raw class ids exposed after ``samples_seen`` samples, in exposure order."""
        return self.order[: self.num_exposed(samples_seen)]

    def to_exposure(self, labels: Tensor) -> Tensor:
        """Map raw class ids to exposure indices (``-1`` for classes that never appear in the stream)."""
        return self.table.to(labels.device)[labels.long()]

    def to_raw(self, exposure_indices: Tensor) -> Tensor:
        """Map exposure indices back to raw class ids."""
        return self.order.to(exposure_indices.device)[exposure_indices.long()]

    def eval_subset(self, test_targets: LabelVector, samples_seen: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        """Test samples of the classes exposed after ``samples_seen`` samples (reference ``OnlineTestSampler``).

        Args:
            test_targets: raw class id of every test sample, in test-set order.
            samples_seen: stream samples consumed so far; ``None`` means the end of the stream.

        Returns:
            ``(indices, exposure_targets)``: ascending test-set indices of the exposed-class samples
            and their labels remapped to exposure order.
        """
        targets = check_label_vector(test_targets, self.num_classes, name="test_targets")
        exposure_targets = self.table[targets]
        keep = (exposure_targets >= 0) & (exposure_targets < self.num_exposed(samples_seen))
        indices = torch.nonzero(keep, as_tuple=False).flatten()
        return indices, exposure_targets[indices]

    def per_exposure(self, per_class: Tensor) -> Tensor:
        """Reorder a per-raw-class vector (e.g. ``stream.home_session``) into exposure order."""
        return per_class[self.order.to(per_class.device)]


# ----------------------------------------------------------------------------------------------------
# The stream
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _StreamSetting:
    """What a Si-Blurry stream is built from (the checked arguments of :func:`build_si_blurry_stream`)."""

    targets: Tensor
    num_classes: int
    num_sessions: int
    seed: int
    disjoint_ratio: Fraction
    blurry_ratio: Fraction
    split: SplitKind

    @property
    def disjoint_num(self) -> int:
        """``floor(floor(C * r_D) / T) * T``: the number of disjoint classes, a multiple of ``T``."""
        return _floor_times(self.num_classes, self.disjoint_ratio) // self.num_sessions * self.num_sessions

    @property
    def blurry_num(self) -> int:
        """The number of blurry classes: every class that is not disjoint."""
        return self.num_classes - self.disjoint_num


@dataclass(frozen=True, eq=False)
class SiBlurryStream(_StreamSetting):
    """A built Si-Blurry stream (see :func:`build_si_blurry_stream`, which is the only constructor to use).

    Attributes:
        targets: ``(N,)`` long, the label vector the stream was built from (dataset order).
        num_classes: size of the raw label space ``C``.
        num_sessions: number of sessions ``T``.
        seed: generator seed.
        disjoint_ratio, blurry_ratio: r_D and r_B as exact fractions.
        split: ``"random"`` (paper) or ``"equal"``.
        class_order: ``(C,)`` long, the generator's class permutation (disjoint classes first).
        disjoint_classes: per session, ``(k,)`` long raw ids of its disjoint classes.
        blurry_classes: per session, ``(k,)`` long raw ids of the blurry classes whose home it is.
        session_orders: per session, ``(n_s,)`` long dataset indices in stream order.
        num_moved: size of the redistribution pool (blurry samples taken out of their sessions and
            dealt out again; the equal split drops ``num_moved mod T`` of them).
        move_quotas: per session, how many blurry samples it was asked to give away (random split:
            the drawn quotas, which sum to ``floor(total_blurry * r_B)``; each session also receives
            its quota from the shuffled pool, except that a short pool shortchanges the last
            sessions; equal split: ``floor(n_blurry_s * r_B)``). A session with fewer blurry samples
            than its quota gives all it has, so ``num_moved <= sum(move_quotas)``; this is common
            under the paper protocol (e.g. 2,236 of 2,500 for seed 1 on a CIFAR-sized label vector).
    """

    class_order: Tensor
    disjoint_classes: Tuple[Tensor, ...]
    blurry_classes: Tuple[Tensor, ...]
    session_orders: Tuple[Tensor, ...]
    num_moved: int
    move_quotas: Tuple[int, ...]

    # -- basic views ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(sum(int(o.numel()) for o in self.session_orders))

    @property
    def order(self) -> Tensor:
        """``(L,)`` long: dataset indices of the whole stream (sessions concatenated)."""
        return torch.cat(self.session_orders) if self.session_orders else torch.empty(0, dtype=torch.long)

    @property
    def home_session(self) -> Tensor:
        """``(C,)`` long: the session every class was assigned to (disjoint or blurry home)."""
        home = torch.empty(self.num_classes, dtype=torch.long)
        for session in range(self.num_sessions):
            home[self.disjoint_classes[session]] = session
            home[self.blurry_classes[session]] = session
        return home

    @property
    def is_blurry_class(self) -> Tensor:
        """``(C,)`` bool: whether each class is blurry (its samples may appear in other sessions)."""
        flags = torch.zeros(self.num_classes, dtype=torch.bool)
        for classes in self.blurry_classes:
            flags[classes] = True
        return flags

    def session(self, session: int) -> Tensor:
        """Dataset indices of one session, in stream order."""
        self._check_session(session)
        return self.session_orders[session]

    def session_labels(self, session: int) -> Tensor:
        """Raw class ids of one session's samples, in stream order."""
        return self.targets[self.session(session)]

    # -- positions, session ids and batches -----------------------------------------------------------

    def session_sizes(self, world_size: int = 1) -> Tensor:
        """``(T,)`` long: samples per session actually streamed with ``world_size`` ranks.

        With several ranks each session is truncated to a multiple of ``world_size`` (reference
        behaviour: the ``n_s mod world_size`` last samples of the session order are dropped).
        """
        world_size = check_int(world_size, "world_size", caller="SiBlurryStream.session_sizes", minimum=1)
        sizes = torch.tensor([int(o.numel()) for o in self.session_orders], dtype=torch.long)
        return sizes // world_size * world_size

    def session_ends(self, world_size: int = 1) -> Tensor:
        """``(T,)`` long: exclusive end position of every session in the (global) stream.

        ``session_ends()[s]`` is the number of samples consumed when session ``s`` finishes, i.e. the
        ``samples_seen`` of its last batch; an empty session repeats the previous end.
        """
        return torch.cumsum(self.session_sizes(world_size), dim=0)

    def session_ids(self, world_size: int = 1) -> Tensor:
        """``(L,)`` long: session id of every stream position (length ``session_ends()[-1]``)."""
        sizes = self.session_sizes(world_size)
        return torch.repeat_interleave(torch.arange(self.num_sessions, dtype=torch.long), sizes)

    def effective_session_orders(self, world_size: int = 1) -> Tuple[Tensor, ...]:
        """Per-session dataset indices streamed with ``world_size`` ranks (tails dropped)."""
        sizes = self.session_sizes(world_size)
        return tuple(order[: int(size)] for order, size in zip(self.session_orders, sizes))

    def batch_sizes(self, batch_size: int, world_size: int = 1) -> List[List[int]]:
        """Global batch sizes, per session (``[]`` for an empty session); the last one may be partial."""
        batch_size, world_size = self._check_batching(batch_size, 0, world_size)
        out: List[List[int]] = []
        for size in self.session_sizes(world_size).tolist():
            full, rest = divmod(int(size), batch_size)
            out.append([batch_size] * full + ([rest] if rest else []))
        return out

    def num_batches(self, batch_size: int, world_size: int = 1) -> int:
        """Total number of batches in the stream."""
        return sum(len(sizes) for sizes in self.batch_sizes(batch_size, world_size))

    def batches(self, batch_size: int, *, rank: Optional[int] = 0, world_size: int = 1) -> Iterator[StreamBatch]:
        """Iterate over the stream in sequential batches (no shuffling, no ``drop_last``).

        Args:
            batch_size: *global* batch size ``B`` (all ranks together); must be a multiple of
                ``world_size``. Each rank gets ``B / world_size`` samples of every full batch.
            rank: this process's rank in ``[0, world_size)``, or ``None`` for the whole global batch
                (all ranks' samples, e.g. to simulate a data-parallel run in one process).
            world_size: number of data-parallel processes.

        Yields:
            :class:`StreamBatch` records. Batches never cross a session boundary; the last batch of a
            session may be smaller than ``B``; empty sessions yield nothing.
        """
        whole = rank is None
        batch_size, rank, world_size = self._check_batching(
            batch_size, 0 if whole else rank, world_size, return_rank=True
        )
        start = 0
        index = 0
        for session, order in enumerate(self.effective_session_orders(world_size)):
            size = int(order.numel())
            num_in_session = -(-size // batch_size)
            for index_in_session in range(num_in_session):
                chunk = order[index_in_session * batch_size : (index_in_session + 1) * batch_size]
                share = chunk if whole else chunk[rank::world_size]
                global_size = int(chunk.numel())
                yield StreamBatch(
                    indices=share,
                    targets=self.targets[share],
                    session=session,
                    index=index,
                    index_in_session=index_in_session,
                    start=start,
                    global_size=global_size,
                    samples_seen=start + global_size,
                    is_session_end=index_in_session == num_in_session - 1,
                )
                start += global_size
                index += 1

    def sessions(
        self, batch_size: int, *, rank: Optional[int] = 0, world_size: int = 1
    ) -> Iterator[Tuple[int, List[StreamBatch]]]:
        """Yield ``(session, batches)`` for every session in order, empty sessions included.

        The reference calls its per-session hooks (``online_before_task``, the session-end evaluation,
        ``online_after_task``) for every session, also one without samples; loop over this instead of
        :meth:`batches` when those hooks matter. Arguments as in :meth:`batches`.
        """
        grouped: List[List[StreamBatch]] = [[] for _ in range(self.num_sessions)]
        for batch in self.batches(batch_size, rank=rank, world_size=world_size):
            grouped[batch.session].append(batch)
        yield from enumerate(grouped)

    # -- exposure ------------------------------------------------------------------------------------

    def exposure(self, *, batch_size: Optional[int] = None, world_size: int = 1) -> Exposure:
        """Exposure order of the stream (classes numbered by first appearance), vectorised.

        With one process the order is the order of first appearance in the stream. With several
        ranks the reference merges the ranks' newly seen classes after every batch in rank order
        (gather of each rank's list, then de-duplication), so inside a global batch rank 0's samples
        come first; pass ``batch_size`` (global) and ``world_size`` to reproduce that order.
        """
        world_size = check_int(world_size, "world_size", caller="SiBlurryStream.exposure_order", minimum=1)
        orders = self.effective_session_orders(world_size)
        if world_size > 1:
            if batch_size is None:
                raise ValueError("exposure(world_size > 1) needs the global batch_size to know the merge order")
            batch_size, world_size = self._check_batching(batch_size, 0, world_size)
            orders = tuple(_rank_major(order, batch_size, world_size) for order in orders)
        sequence = self.targets[torch.cat(orders)] if orders else torch.empty(0, dtype=torch.long)
        length = int(sequence.numel())
        first = torch.full((self.num_classes,), length, dtype=torch.long)
        first.scatter_reduce_(0, sequence, torch.arange(length, dtype=torch.long), reduce="amin")
        seen = torch.nonzero(first < length, as_tuple=False).flatten()
        first_seen, sort_index = torch.sort(first[seen])
        order = seen[sort_index]
        table = torch.full((self.num_classes,), -1, dtype=torch.long)
        table[order] = torch.arange(order.numel(), dtype=torch.long)
        return Exposure(order=order, first_position=first_seen, table=table)

    # -- fingerprint / description ------------------------------------------------------------------

    def digest(self) -> str:
        """SHA-256 (hex) of the per-session index sequences: session sizes then all indices, int64 LE.

        Two streams have the same digest exactly when every session holds the same dataset indices in
        the same order. Used by the tests to pin streams against regressions.
        """
        sizes = np.array([int(o.numel()) for o in self.session_orders], dtype="<i8")
        indices = self.order.numpy().astype("<i8", copy=False)
        hasher = hashlib.sha256()
        hasher.update(sizes.tobytes())
        hasher.update(indices.tobytes())
        return hasher.hexdigest()

    def summary(self) -> dict:
        """Plain-Python description: sizes, class counts and ratios of every session."""
        sessions = []
        for s in range(self.num_sessions):
            labels = self.session_labels(s)
            sessions.append(
                {
                    "size": int(labels.numel()),
                    "num_classes": int(torch.unique(labels).numel()),
                    "disjoint_classes": int(self.disjoint_classes[s].numel()),
                    "blurry_home_classes": int(self.blurry_classes[s].numel()),
                }
            )
        return {
            "num_samples": len(self),
            "num_classes": self.num_classes,
            "num_sessions": self.num_sessions,
            "seed": self.seed,
            "disjoint_ratio": float(self.disjoint_ratio),
            "blurry_ratio": float(self.blurry_ratio),
            "split": self.split,
            "num_moved": self.num_moved,
            "move_quotas": list(self.move_quotas),
            "sessions": sessions,
        }

    # -- private -------------------------------------------------------------------------------------

    def _check_session(self, session: int) -> None:
        check_int(session, "session", caller="SiBlurryStream", minimum=0, maximum=self.num_sessions - 1)

    @staticmethod
    def _check_batching(batch_size: int, rank: int, world_size: int, *, return_rank: bool = False):
        batch_size = check_int(batch_size, "batch_size", caller="SiBlurryStream", minimum=1)
        world_size = check_int(world_size, "world_size", caller="SiBlurryStream", minimum=1)
        rank = check_int(rank, "rank", caller="SiBlurryStream", minimum=0, maximum=world_size - 1)
        if batch_size % world_size:
            raise ValueError(
                f"batch_size is the global batch size and must be a multiple of world_size so that every "
                f"rank gets an equal share; got batch_size={batch_size}, world_size={world_size}"
            )
        return (batch_size, int(rank), world_size) if return_rank else (batch_size, world_size)


def _rank_major(order: Tensor, batch_size: int, world_size: int) -> Tensor:
    """Reorder each global batch of ``order`` as rank 0's share, then rank 1's, ... (merge order)."""
    size = int(order.numel())
    full = size // batch_size * batch_size
    head = order[:full].view(-1, batch_size // world_size, world_size).transpose(1, 2).reshape(-1)
    tail = order[full:]
    tail = tail.view(-1, world_size).t().reshape(-1)
    return torch.cat([head, tail])


# ----------------------------------------------------------------------------------------------------
# Construction
# ----------------------------------------------------------------------------------------------------
