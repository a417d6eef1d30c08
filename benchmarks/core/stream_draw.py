"""How a Si-Blurry stream is drawn from a labelled training set: the checks of its setting, the split of
the classes into disjoint and blurry ones, the blurry samples moved between sessions and the sessions'
cuts; :func:`build_si_blurry_stream` returns the :class:`benchmarks.core.stream.SiBlurryStream` they give.
It reproduces the reference sampler draw for draw (docs/stream.md).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from fly_modules._validation import check_int

from .stream import LabelVector, SiBlurryStream, SplitKind, _floor_times, _StreamSetting, check_label_vector

__all__ = ["build_si_blurry_stream"]


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
