"""The official trainer's own evaluation (``online_evaluate``), run whenever the runner evaluates, on the
same test samples: the classes exposed at that point of the stream."""

from __future__ import annotations

import math
from typing import Any, List, Tuple

from benchmarks.core.reference_checkout import EvalBatches
from benchmarks.core.stream import Exposure

from .official import OfficialSide

__all__ = ["OfficialEvaluations"]


class OfficialEvaluations:
    """Listener of the runner's evaluations; ``accuracies`` holds ``(kind, samples_seen, avg_acc)``."""

    def __init__(self, official: OfficialSide, exposure: Exposure, test: Any, batch_size: int) -> None:
        self.official, self.exposure, self.test, self.batch_size = official, exposure, test, batch_size
        self.accuracies: List[Tuple[str, int, float]] = []

    def __call__(self, kind: str, samples_seen: int) -> None:
        indices, _ = self.exposure.eval_subset(self.test.targets, samples_seen)
        chunks = [indices[start:start + self.batch_size] for start in range(0, len(indices), self.batch_size)]
        batches = [(self.test.get_batch(chunk)[0], self.test.targets[chunk].clone()) for chunk in chunks]
        result = self.official.trainer.online_evaluate(EvalBatches(batches))
        self.official.model.train()
        self.accuracies.append((kind, samples_seen, float(result["avg_acc"])))

    def metrics(self) -> Tuple[float, float]:
        """``(A_auc, A_last)``: the mean of the anytime accuracies, the last session end's."""
        anytime = [accuracy for kind, _, accuracy in self.accuracies if kind == "anytime"]
        ends = [accuracy for kind, _, accuracy in self.accuracies if kind == "session_end"]
        return (sum(anytime) / len(anytime) if anytime else math.nan), (ends[-1] if ends else math.nan)
