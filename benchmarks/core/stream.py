"""The Si-Blurry stream: a seeded split of a labelled training set into sessions, batches that never
cross a session, data-parallel shares, and the classes' exposure order.

:func:`build_si_blurry_stream` reproduces the reference sampler draw for draw (same label vector,
seed and ratios: the same per-session order); what the stream is and which reference behaviours are
kept is in docs/stream.md.
"""

from __future__ import annotations

import hashlib
import math
import numbers
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
    "build_si_blurry_stream",
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


def _check_ratio(value: object, name: str) -> Fraction:
    """Return ``value`` as an exact fraction in [0, 1] (decimal value of a float: 0.1 -> 1/10)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number in [0, 1], got {type(value).__name__} {value!r}")
    if isinstance(value, Fraction):
        exact = value
    elif isinstance(value, numbers.Integral):
        exact = Fraction(int(value))
    else:
        as_float = float(value)
        if not math.isfinite(as_float):
            raise ValueError(f"{name} must be a real number in [0, 1], got {as_float}")
        # repr() is the shortest decimal that round-trips, i.e. what the user typed: 0.29 -> 29/100,
        # so floor(100 * 0.29) is 29 (float arithmetic would give 28).
        exact = Fraction(repr(as_float))
    if not 0 <= exact <= 1:
        hint = " (ratios are fractions, not percentages: use 0.1 for 10%)" if 1 < exact <= 100 else ""
        raise ValueError(f"{name} must lie in [0, 1], got {float(exact)}{hint}")
    return exact


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


def _random_cuts(count: int, num_sessions: int, generator: torch.Generator) -> Tensor:
    """``[0, sorted T-1 uniform draws in [0, count), count]`` -- one generator call, none if count == 0."""
    if count == 0:
        return torch.zeros(num_sessions + 1, dtype=torch.long)
    inner = torch.randint(0, count, (num_sessions - 1,), generator=generator).sort().values
    return torch.cat([torch.zeros(1, dtype=torch.long), inner, torch.tensor([count])])


def _equal_cuts(count: int, num_sessions: int) -> Tensor:
    return torch.arange(num_sessions + 1, dtype=torch.long) * (count // num_sessions)


_BUILD = "build_si_blurry_stream"


def _checked_setting(labels: LabelVector, num_sessions: object, disjoint_ratio: object, blurry_ratio: object,
                     seed: object, split: object, num_classes: object) -> _StreamSetting:
    """The arguments of :func:`build_si_blurry_stream`, checked."""
    num_sessions = check_int(num_sessions, "num_sessions", caller=_BUILD, minimum=1)
    r_disjoint = _check_ratio(disjoint_ratio, "disjoint_ratio")
    r_blurry = _check_ratio(blurry_ratio, "blurry_ratio")
    seed = check_int(seed, "seed", caller=_BUILD)
    if split not in ("random", "equal"):
        raise ValueError(f"split must be 'random' (the paper's protocol) or 'equal', got {split!r}")
    if num_classes is not None:
        num_classes = check_int(num_classes, "num_classes", caller=_BUILD, minimum=1)
    targets = check_label_vector(labels, num_classes)
    if num_classes is None:
        num_classes = int(targets.max()) + 1
    setting = _StreamSetting(targets, num_classes, num_sessions, int(seed), r_disjoint, r_blurry, split)
    if split == "equal" and setting.blurry_num % num_sessions:
        raise ValueError(
            f"split='equal' gives every session the same number of blurry classes, so the number of "
            f"blurry classes must be a multiple of num_sessions; found {setting.blurry_num} blurry classes "
            f"({num_classes} classes - {setting.disjoint_num} disjoint) for {num_sessions} sessions. Use "
            f"split='random' (the paper's protocol) or change num_classes / disjoint_ratio"
        )
    return setting


@dataclass(frozen=True)
class _ClassSplit:
    """The class order (disjoint classes first, blurry classes after) and each list's cuts into sessions."""

    class_order: Tensor
    disjoint_cuts: Tensor
    blurry_cuts: Tensor
    disjoint_num: int

    @classmethod
    def draw(cls, setting: _StreamSetting, generator: torch.Generator) -> "_ClassSplit":
        """Draw 1: the class order; draws 2-3 (random split only): the cuts of the disjoint, then the blurry list."""
        class_order = torch.randperm(setting.num_classes, generator=generator)
        if setting.split == "random":
            disjoint_cuts = _random_cuts(setting.disjoint_num, setting.num_sessions, generator)
            blurry_cuts = _random_cuts(setting.blurry_num, setting.num_sessions, generator)
        else:
            disjoint_cuts = _equal_cuts(setting.disjoint_num, setting.num_sessions)
            blurry_cuts = _equal_cuts(setting.blurry_num, setting.num_sessions)
        return cls(class_order, disjoint_cuts, blurry_cuts, setting.disjoint_num)

    @property
    def blurry_part(self) -> Tensor:
        return self.class_order[self.disjoint_num :]

    @property
    def disjoint_classes(self) -> Tuple[Tensor, ...]:
        cuts = self.disjoint_cuts.tolist()
        return tuple(self.class_order[a:b] for a, b in zip(cuts[:-1], cuts[1:]))

    @property
    def blurry_classes(self) -> Tuple[Tensor, ...]:
        cuts = self.blurry_cuts.tolist()
        return tuple(self.blurry_part[a:b] for a, b in zip(cuts[:-1], cuts[1:]))

    def bucket_samples(self, setting: _StreamSetting) -> Tuple[List[Tensor], List[Tensor]]:
        """(disjoint, blurry): per home session, its samples of disjoint and of blurry classes, in dataset order.

        One stable sort by (home session, disjoint/blurry) instead of the reference's per-sample membership
        tests; stability keeps dataset order inside every bucket, as there.
        """
        targets, num_classes, num_sessions = setting.targets, setting.num_classes, setting.num_sessions
        sessions = torch.arange(num_sessions)
        home = torch.empty(num_classes, dtype=torch.long)
        home[self.class_order[: self.disjoint_num]] = torch.repeat_interleave(sessions, torch.diff(self.disjoint_cuts))
        home[self.blurry_part] = torch.repeat_interleave(sessions, torch.diff(self.blurry_cuts))
        blurry_flag = torch.zeros(num_classes, dtype=torch.long)
        blurry_flag[self.blurry_part] = 1
        bucket = home[targets] * 2 + blurry_flag[targets]
        sorted_bucket, sample_order = torch.sort(bucket, stable=True)
        counts = torch.bincount(sorted_bucket, minlength=2 * num_sessions).tolist()
        buckets = list(torch.split(sample_order, counts))
        return buckets[0::2], buckets[1::2]


@dataclass(frozen=True)
class _BlurryMoves:
    """The blurry samples of each session after the redistribution, the pool size and the quotas drawn."""

    blurry_samples: List[Tensor]
    num_moved: int
    quotas: Tuple[int, ...]

    @classmethod
    def draw(cls, setting: _StreamSetting, blurry_samples: List[Tensor], generator: torch.Generator) -> "_BlurryMoves":
        """Session s gives away its first ``quotas[s]`` blurry samples (dataset order); the pool is shuffled
        once (draw 5) and dealt back out in session order. Draw 4 (random split only): the quotas."""
        if setting.split == "random":
            quota_total = _floor_times(sum(int(b.numel()) for b in blurry_samples), setting.blurry_ratio)
            if not quota_total:  # the reference makes neither the quota draw nor the pool draw when nothing moves
                return cls(blurry_samples, 0, (0,) * setting.num_sessions)
            quotas = torch.diff(_random_cuts(quota_total, setting.num_sessions, generator)).tolist()
        else:
            quotas = [_floor_times(int(b.numel()), setting.blurry_ratio) for b in blurry_samples]
        kept = [b[q:] for b, q in zip(blurry_samples, quotas)]
        pool = torch.cat([b[:q] for b, q in zip(blurry_samples, quotas)])  # a short donor gives what it has
        pool = pool[torch.randperm(int(pool.numel()), generator=generator)]
        num_moved = int(pool.numel())
        if setting.split == "random":
            received_counts = quotas
        else:  # equal shares; the len(pool) mod T remainder is dropped, as in the reference
            received_counts = [num_moved // setting.num_sessions] * setting.num_sessions
        # Slicing clips at the pool end, so a shortfall falls on the last sessions.
        ends = torch.cumsum(torch.tensor(received_counts, dtype=torch.long), 0).tolist()
        starts = [0] + ends[:-1]
        received = [torch.cat([k, pool[a:b]]) for k, a, b in zip(kept, starts, ends)]
        return cls(received, num_moved, tuple(int(q) for q in quotas))


def _shuffle_sessions(disjoint: List[Tensor], blurry: List[Tensor], generator: torch.Generator) -> Tuple[Tensor, ...]:
    """Draws 6..5+T: each session's samples (disjoint, then blurry) in one permutation per session."""
    orders = []
    for disjoint_samples, blurry_samples in zip(disjoint, blurry):
        indices = torch.cat([disjoint_samples, blurry_samples])
        orders.append(indices[torch.randperm(int(indices.numel()), generator=generator)])
    return tuple(orders)


def build_si_blurry_stream(
    labels: LabelVector,
    *,
    num_sessions: int = 5,
    disjoint_ratio: float = 0.5,
    blurry_ratio: float = 0.1,
    seed: int = 1,
    split: SplitKind = "random",
    num_classes: Optional[int] = None,
) -> SiBlurryStream:
    """Build the Si-Blurry stream of a training set, draw-for-draw like the reference sampler.

    Args:
        labels: raw class id of every training sample, in dataset order (1-D integers).
        num_sessions: number of sessions ``T`` (>= 1). Paper: 5.
        disjoint_ratio: r_D, fraction of classes that are disjoint (in [0, 1]). Paper: 0.5.
            ``disjoint_num = floor(floor(C * r_D) / T) * T``.
        blurry_ratio: r_B, fraction of blurry-class samples that are redistributed (in [0, 1]).
            Paper: 0.1.
        seed: seed of the private CPU generator (the run seed; the paper uses 1..5).
        split: ``"random"`` (reference ``--rnd_NM``, the paper's protocol: random classes per session
            and random redistribution quotas) or ``"equal"`` (equal class groups, equal shares).
        num_classes: size of the label space ``C``; defaults to ``max(labels) + 1``. Classes without
            samples are allowed (they still take part in the class split).

    Returns:
        The :class:`SiBlurryStream`. Ratios of 0 and 1 and empty sessions are defined (docs/stream.md).

    Raises:
        TypeError: non-integer labels, sessions, seed or classes; non-real ratios.
        ValueError: labels not 1-D / empty / out of range; ratios outside ``[0, 1]``;
            ``num_sessions < 1``; an equal split whose blurry class count is not a multiple of
            ``num_sessions`` (this includes fewer classes than sessions).
    """
    setting = _checked_setting(labels, num_sessions, disjoint_ratio, blurry_ratio, seed, split, num_classes)
    generator = torch.Generator().manual_seed(setting.seed)
    classes = _ClassSplit.draw(setting, generator)
    disjoint_samples, blurry_samples = classes.bucket_samples(setting)
    moves = _BlurryMoves.draw(setting, blurry_samples, generator)
    return SiBlurryStream(
        **vars(setting), class_order=classes.class_order, disjoint_classes=classes.disjoint_classes,
        blurry_classes=classes.blurry_classes,
        session_orders=_shuffle_sessions(disjoint_samples, moves.blurry_samples, generator),
        num_moved=moves.num_moved, move_quotas=moves.quotas,
    )
