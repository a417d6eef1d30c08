"""What a plan needs of a dataset it does not have: its size per class, and images of its shape.

The stream of a training, and so its work, depends only on the training targets' counts per class and
the test targets'; the probe's timing only on the images' shape. :data:`DATASET_SIZES` holds the
paper's three datasets as the loaders split them (``benchmarks.data.loaders``), classes of equal size
where the real ones differ (ImageNet-R, CUB-200: the totals are exact, the per-class counts within one
sample of the mean); :func:`stand_in` builds ``(train, test)`` records of those sizes whose images are
noise of the stored shape, so that ``--plan`` prices a sweep before anything is downloaded.

The counts are those of the real data up to the dataset's order: the Si-Blurry stream moves the first
samples of its blurry classes, so which classes a session exposes early, and with them the test images
each evaluation scores (within a few percent), and the sessions' partial batches (within one batch per
session) depend on the order of the samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..data.records import AUTOAUGMENT_POLICY, DATASET_STATS, ImageDataset

__all__ = ["DATASET_SIZES", "DatasetSize", "StandInDataset", "stand_in"]


@dataclass(frozen=True)
class DatasetSize:
    """``train`` / ``test`` images in all, ``classes``, and the stored side (``None``: the run's image size)."""

    classes: int
    train: int
    test: int
    stored_side: Optional[int]


DATASET_SIZES = {
    "cifar100": DatasetSize(classes=100, train=50_000, test=10_000, stored_side=32),
    "imagenet-r": DatasetSize(classes=200, train=24_000, test=6_000, stored_side=None),  # 80/20 of 30,000
    "cub200": DatasetSize(classes=200, train=9_430, test=2_358, stored_side=None),  # 80/20 of 11,788
}


def _targets(total: int, classes: int) -> Tensor:
    """``total`` labels over ``classes`` classes of sizes within one of each other, the classes interleaved
    (0, 1, ..., C-1, 0, 1, ...) as a shuffled dataset's are, on average."""
    return torch.arange(total) % classes


class StandInDataset(ImageDataset):
    """A dataset's labels with noise images of its stored shape, drawn when read (nothing is held)."""

    def __init__(self, name: str, targets: Tensor, classes: int, *, stored_side: int, image_size: int) -> None:
        super().__init__(name=name, targets=targets, classes=[f"class {c}" for c in range(classes)],
                         image_size=image_size, stats=DATASET_STATS[name], autoaugment_policy=AUTOAUGMENT_POLICY[name])
        self.stored_side = int(stored_side)

    def _load_uint8(self, index: Tensor) -> Tensor:
        generator = torch.Generator().manual_seed(int(index[0]) if len(index) else 0)
        side = self.stored_side
        return torch.randint(0, 256, (len(index), 3, side, side), dtype=torch.uint8, generator=generator)


def stand_in(name: str, image_size: int) -> Tuple[StandInDataset, StandInDataset]:
    """``(train, test)`` stand-ins of the dataset ``name`` (a key of :data:`DATASET_SIZES`)."""
    if name not in DATASET_SIZES:
        raise ValueError(f"no size is known for dataset {name!r}; expected one of {sorted(DATASET_SIZES)}")
    size = DATASET_SIZES[name]
    side = size.stored_side or int(image_size)
    return tuple(  # type: ignore[return-value]
        StandInDataset(name, _targets(total, size.classes), size.classes, stored_side=side, image_size=image_size)
        for total in (size.train, size.test)
    )
