"""The generated class-incremental stream every harness trains on (no data sets are downloaded)."""

from __future__ import annotations

from typing import List, Tuple

import torch

Batch = Tuple[torch.Tensor, torch.Tensor]

NUM_TASKS, CLASSES_PER_TASK, BATCHES_PER_TASK, BATCH_SIZE, IMAGE_SIZE = 2, 2, 3, 8, 32


def make_stream(seed: int = 0, test_per_class: int = 4) -> Tuple[List[List[Batch]], Batch]:
    """(train, test): task t holds classes [2t, 2t + 2); train[t] is a list of (x, y) batches of 32 px
    images (a Gaussian mean per class plus noise); test is one batch of every class."""
    generator = torch.Generator().manual_seed(1000 + seed)
    num_classes = NUM_TASKS * CLASSES_PER_TASK
    means = torch.randn(num_classes, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)

    def draw(labels: torch.Tensor) -> torch.Tensor:
        return means[labels] + 0.5 * torch.randn(len(labels), 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)

    train = []
    for task in range(NUM_TASKS):
        batches = []
        for _ in range(BATCHES_PER_TASK):
            labels = task * CLASSES_PER_TASK + torch.randint(0, CLASSES_PER_TASK, (BATCH_SIZE,), generator=generator)
            batches.append((draw(labels), labels))
        train.append(batches)
    labels = torch.arange(num_classes).repeat_interleave(test_per_class)
    return train, (draw(labels), labels)
