"""RanPAC's state on both sides: the adapters' map, the first-session head (the official model replaces
its head module at the first session's end), the random matrix, and the classifier's statistics, which
the official model folds in only when its trainer solves (session end, evaluation)."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch
from torch import Tensor, nn

__all__ = ["EXPANSION_SEED", "adapter_weights", "align", "load_official", "official_predict", "other_state", "setup_trainer"]

#: the official side draws its random matrix at the first session's end right after
#: ``torch.manual_seed(EXPANSION_SEED + 0)`` (the pair's ``session_end_seed``); ours takes the same draw
EXPANSION_SEED = 2000

#: the official head, kept under this name of the official classifier once ``setup_rp`` replaces ``fc``
FIRST_SESSION_HEAD = "first_session_head"


def adapter_weights(blocks: int) -> Dict[str, str]:
    """``backbone.blocks.<block>.adapter.{down,up}_proj.*``, ``.scale`` -> ``adapter.banks.0``, and the head."""
    weights = {f"classifier.{FIRST_SESSION_HEAD}.weight": "head.weight"}
    for block in range(blocks):
        theirs = f"backbone.blocks.{block}.adapter"
        for projection in ("down", "up"):
            for kind in ("weight", "bias"):
                weights[f"{theirs}.{projection}_proj.{kind}"] = f"adapter.banks.0.{projection}_{kind}[{block}]"
        weights[f"{theirs}.scale"] = f"adapter.banks.0.scale[{block}:{block + 1}]"
    return weights


def setup_trainer(trainer: Any) -> None:
    """The official head also named ``first_session_head`` (registered first, so that it is the name of the
    trainable tensor, and it outlives ``setup_rp``'s new ``fc``); the official adapters' dropout off (ours
    has none, docs/methods.md)."""
    classifier = trainer.model.classifier
    head = classifier._modules.pop("fc")
    classifier.add_module(FIRST_SESSION_HEAD, head)
    classifier.add_module("fc", head)
    for module in trainer.model.modules():
        if hasattr(module, "down_proj") and hasattr(module, "dropout"):
            module.dropout = 0.0


@torch.no_grad()
def align(official: nn.Module, ours: nn.Module) -> None:
    """Before the stream: our random expansion is the official side's draw at the first session's end."""
    classifier = official.classifier
    generator = torch.Generator().manual_seed(EXPANSION_SEED)
    w_rand = torch.randn(classifier.feature_dim, classifier.M, generator=generator)
    state = ours.classifier.state_dict()
    state["expansion.weight"] = w_rand.t()
    ours.classifier.load_state_dict(state)


class _Solved:
    """While open: the official classifier with its collected features folded in and solved, as
    ``online_evaluate`` has it; restored on leaving (as ``online_evaluate`` restores it)."""

    def __init__(self, model: nn.Module, trainer: Any = None) -> None:
        self.model = model
        self.active = trainer is None or (trainer.task_id > 0 and trainer.first_task_completed)

    def __enter__(self) -> nn.Module:
        if self.active:
            self.saved = self.model.save_classifier_state()
            self.model.update_statistics_and_classifier()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            self.model.restore_classifier_state(self.saved)


@torch.no_grad()
def other_state(official: nn.Module, ours: nn.Module, images: Tensor) -> Dict[str, Tuple[Tensor, Tensor]]:
    """``name -> (official, ours)``: the classifier's statistics and scores on ``images``."""
    with _Solved(official) as model:
        model.eval()
        gram, cross, scores = model.classifier.G.clone(), model.classifier.Q.clone(), model(images)
    ours.eval()
    return {
        "classifier G": (gram, ours.classifier.gram_matrix()),
        "classifier Q": (cross, ours.classifier.cross),
        "classifier scores": (scores, ours.classifier(ours.compute_query(images).router)),
    }


@torch.no_grad()
def load_official(official: nn.Module, ours: nn.Module) -> None:
    """Our classifier's statistics set to the official ones, the collected features folded in."""
    with _Solved(official) as model:
        ours.classifier.flush()
        ours.classifier.gram.copy_(model.classifier.G)
        ours.classifier.cross.copy_(model.classifier.Q)


@torch.no_grad()
def official_predict(trainer: Any, images: Tensor) -> Tuple[Tensor, None]:
    """``online_evaluate``'s scores for one batch: the classifier solved with every feature collected so far."""
    with _Solved(trainer.model, trainer) as model:
        model.eval()
        return model(images) + trainer.mask, None
