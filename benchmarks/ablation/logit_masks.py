"""The training logit mask, chosen by ``Protocol.train_mask``: the method's own or one of the paper's four
strategies (its logit-mask table), each an additive mask (0: may be predicted, ``-inf``: may not) over the
exposure-ordered classes.

``batch``: the classes present in the batch (FlyPrompt and the prompt baselines); ``seen``: every class
exposed so far (MVP's own); ``none``: every class; ``random``: for each sample its own class and each other
exposed class with probability 1/2. The random draw depends only on the run's seed and the batch index, so a
resumed run and a data-parallel run (each process takes its rows of the global batch's mask) draw the same.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fly_modules import batch_seen_class_mask, seen_class_mask

__all__ = ["TRAIN_MASKS", "TrainingMask"]

#: ``Protocol.train_mask`` -> what it does
TRAIN_MASKS = {
    "method": "the method's own (batch seen-class; MVP: seen-class)",
    "none": "no mask: every class",
    "random": "the sample's class and each other exposed class with probability 1/2",
    "seen": "every class exposed so far",
    "batch": "the classes present in the batch",
}


class TrainingMask:
    """The training mask of each stream batch (``(C,)``, or ``(B_local, C)`` for ``random``)."""

    def __init__(self, strategy: str, model: Any, exposure: Any, num_classes: int, *, seed: int, parallel: Any,
                 device: torch.device) -> None:
        if strategy not in TRAIN_MASKS:
            raise ValueError(f"train_mask must be one of {', '.join(TRAIN_MASKS)}, got {strategy!r}")
        self.strategy = model.train_logit_mask if strategy == "method" else strategy
        self.exposure, self.num_classes, self.seed = exposure, int(num_classes), int(seed)
        self.parallel, self.device = parallel, device

    def __call__(self, batch: Any) -> Tensor:
        if self.strategy == "none":
            return torch.zeros(self.num_classes, device=self.device)
        if self.strategy == "seen":
            return seen_class_mask(self.exposure.num_exposed(batch.samples_seen), self.num_classes, device=self.device)
        targets = self.exposure.to_exposure(batch.targets)
        if self.strategy == "batch":
            return batch_seen_class_mask(targets, self.num_classes, device=self.device)
        return self.random(batch, targets)

    def random(self, batch: Any, targets: Tensor) -> Tensor:
        """Each sample's class and each exposed class with probability 1/2; this process's rows."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + int(batch.index))
        exposed = torch.arange(self.num_classes) < self.exposure.num_exposed(batch.samples_seen)
        allowed = (torch.rand((len(targets), self.num_classes), generator=generator) < 0.5) & exposed
        allowed[torch.arange(len(targets)), targets.long().cpu()] = True
        mask = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf")).to(self.device)
        world = self.parallel.world
        return mask if world == 1 or len(targets) < world else mask[self.parallel.rank :: world]
