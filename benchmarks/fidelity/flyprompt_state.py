"""FlyPrompt's state beyond its trainable tensors, on both sides: the router's random expansion and
statistics, the EMA heads, and the official inference (route, then ensemble the routed expert's heads)."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch
from torch import Tensor, nn

from benchmarks.core.reference_checkout import ema_bank_weights

__all__ = ["align", "load_official", "official_predict", "other_state"]


@torch.no_grad()
def align(official: nn.Module, ours: nn.Module) -> None:
    """Before the stream: our router takes the official random matrix (``W_rand`` is ``R^T``), the
    official EMA heads take ours (both sides then start from the same state)."""
    state = ours.router.state_dict()
    state["expansion.weight"] = official.rp_head.W_rand.t()
    ours.router.load_state_dict(state)
    for expert, bank in enumerate(official.experts_fc):
        for decay, head in enumerate(bank):
            head.weight.copy_(ours.ensemble.ema_weight[expert, decay])
            head.bias.copy_(ours.ensemble.ema_bias[expert, decay])


@torch.no_grad()
def other_state(official: nn.Module, ours: nn.Module, images: Tensor) -> Dict[str, Tuple[Tensor, Tensor]]:
    """``name -> (official, ours)``: router statistics, EMA heads, and the router's scores of ``images``."""
    ours.router.flush()
    official.update()
    weights, biases = ema_bank_weights(official)
    query = ours.compute_query(images)
    return {
        "router G": (official.rp_head.G, ours.router.gram_matrix()),
        "router Q": (official.rp_head.Q, ours.router.cross),
        "EMA weights": (weights, ours.ensemble.ema_weight),
        "EMA biases": (biases, ours.ensemble.ema_bias),
        "router scores": (official.forward_with_rp(images), ours.router(query.router)),
    }


@torch.no_grad()
def load_official(official: nn.Module, ours: nn.Module) -> None:
    """Our router statistics and EMA heads set to the official ones (the evaluation on identical state)."""
    ours.router.flush()
    ours.router.gram.copy_(official.rp_head.G)
    ours.router.cross.copy_(official.rp_head.Q)
    weights, biases = ema_bank_weights(official)
    ours.ensemble.ema_weight.copy_(weights)
    ours.ensemble.ema_bias.copy_(biases)


@torch.no_grad()
def official_predict(trainer: Any, images: Tensor) -> Tuple[Tensor, Tensor]:
    """``online_evaluate``'s decision for one batch, from the trainer's and model's own calls."""
    model = trainer.model_without_ddp
    model.update()
    model.eval()
    experts = model.forward_with_rp(images).argmax(dim=-1)
    members = [logits + trainer.mask for logits in model.forward_with_ema(images, expert_ids=experts)]
    return trainer._ensemble_logits(members), experts
