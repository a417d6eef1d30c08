"""Where official and ours are comparable, do they agree? The state after training side by side, and the
routing and predictions of a fresh retrofit given the official statistics (``benchmarks/speed/vs_reference.py``).
"""

from __future__ import annotations

import argparse
import copy
from typing import Dict, Iterator, Tuple

import torch
from fly_modules.adapters import retrofit
from torch import Tensor

from benchmarks.core import reference_checkout as ref
from benchmarks.core.reference_checkout import EvalBatches
from benchmarks.speed.vs_reference_variants import Variant


# ================================================================================ agreement
def compare_training(method: str, variants: Dict[str, Variant], args: argparse.Namespace) -> Dict[str, float]:
    """Official and ours trained the same weights on the same batches: do they end in the same state?"""
    official, ours, handle = variants["official"].model, variants["ours"].model, variants["ours"].handle
    ours_state = ours.state_dict()
    weights = max_abs_difference(
        (tensor, ours_state[name]) for name, tensor in official.named_parameters()
        if tensor.requires_grad and name in ours_state
    )
    ema_weight, ema_bias = ref.ema_bank_weights(official)
    ema = max(max_abs(ema_weight - handle.ensemble.ema_weight), max_abs(ema_bias - handle.ensemble.ema_bias))
    print("training equivalence (same initial weights, same batches, trained side by side):")
    print(f"  trainable weights (prompts, keys, online head): max |official - ours| = {weights:.2e}")
    print(f"  EMA heads (every bank, both decays):            max |official - ours| = {ema:.2e}")
    result = {"weights": weights, "ema": ema}
    if method == "mvp" and args.mvp_router_features == "query":
        print("  router statistics: not comparable (official statistics come from the final-norm class token, "
              "ours from MVP's query with --mvp-router-features query)")
        return result
    gram_official = official.rp_head.G.double()
    gram_ours = handle.router.gram_matrix().to(gram_official.device)
    cross_official = official.rp_head.Q.double()
    cross_ours = handle.router.cross.to(cross_official.device)
    result["gram"] = max_abs(gram_official - gram_ours) / max(max_abs(gram_official), 1e-30)
    result["cross"] = max_abs(cross_official - cross_ours) / max(max_abs(cross_official), 1e-30)
    print(f"  router statistics (same random matrix): max |dG| / max |G| = {result['gram']:.2e}, "
          f"max |dQ| / max |Q| = {result['cross']:.2e} (official accumulates float32, ours float64)")
    return result


@torch.no_grad()
def compare_inference(method: str, variants: Dict[str, Variant], test_set: EvalBatches,
                      args: argparse.Namespace) -> Dict[str, float]:
    """Routing and predictions with identical state: a fresh retrofit of the trained model given the
    official router statistics and EMA heads, against the official model, batch by batch."""
    official, trainer = variants["official"].model, variants["official"].trainer
    twin = copy.deepcopy(variants["baseline"].model)
    twin.load_state_dict({k: v for k, v in official.state_dict().items()
                          if not k.startswith(("rp_head.", "experts_fc."))})
    # Route on the features the official code routes on: MVP's query for MVP (its statistics come from
    # the final-norm class token, a mismatch we reproduce here by loading them as they are).
    options = dict(router_features="query") if method == "mvp" else {}
    handle = retrofit(twin, method=method, router=True, ensemble=True, expansion_dim=args.expansion_dim,
                      ridge=args.ridge, **options)
    state = handle.router.state_dict()
    state.update({"expansion.weight": official.rp_head.W_rand.t(), "gram": official.rp_head.G,
                  "cross": official.rp_head.Q, "counts": variants["ours"].handle.router.counts})
    handle.router.load_state_dict(state)
    ema_weight, ema_bias = ref.ema_bank_weights(official)
    handle.ensemble.ema_weight.copy_(ema_weight)
    handle.ensemble.ema_bias.copy_(ema_bias)
    handle.set_logit_mask(trainer.mask)
    official.rp_head.update()
    official.eval()
    twin.eval()
    seen_steps = min(official.task_count + 1, official.task_num)
    routed, slots, predictions, samples = 0, 0, 0, 0
    score_error, probability_error = 0.0, 0.0
    for images, _ in test_set:
        query = ref.mvp_query(official, images) if method == "mvp" else ref.clean_query(official, images)
        official_scores = official.rp_head(query)[:, :seen_steps].double()
        ours_scores = handle.router(query)[:, :seen_steps].to(official_scores)
        score_error = max(score_error, max_abs(official_scores - ours_scores) / max(max_abs(official_scores), 1e-30))
        routed += int((official_scores.argmax(1) == handle.router.route(query).to(images.device)).sum())
        members = [logits + trainer.mask for logits in official.forward_with_ema(images)]
        official_probabilities = trainer._ensemble_logits(members)
        official_slots = official.last_expert_ids
        ours_probabilities = twin(images).exp()
        if method == "dualprompt":
            slots += int((official_slots == twin.e_prompt.last_selected_indices[:, 0]).sum())
        probability_error = max(probability_error, max_abs(official_probabilities - ours_probabilities))
        predictions += int((official_probabilities.argmax(1) == ours_probabilities.argmax(1)).sum())
        samples += images.shape[0]
    handle.remove()
    result = {"routed": routed / samples, "predictions": predictions / samples, "scores": score_error,
              "probabilities": probability_error}
    print(f"inference with identical state ({samples} test samples; a fresh retrofit of the trained model given "
          f"the official router statistics, random matrix and EMA heads; routing on "
          f"{'MVP query' if method == 'mvp' else 'final-norm class token'} features):")
    print(f"  router scores: max |official - ours| / max |official| = {score_error:.2e} "
          f"(official: float32 statistics, float32 LU; ours: float64, Cholesky refined to float64)")
    print(f"  routed step agrees on {100 * result['routed']:.2f}% of the samples")
    if method == "dualprompt":
        result["slots"] = slots / samples
        print(f"  selected E-prompt slot agrees on {100 * result['slots']:.2f}%")
    print(f"  prediction agrees on {100 * result['predictions']:.2f}%; max |p_official - p_ours| = "
          f"{probability_error:.2e} (softmax-max ensemble of the online head and the two EMA heads)")
    return result


def max_abs(tensor: Tensor) -> float:
    return float(tensor.detach().double().abs().max()) if tensor.numel() else 0.0


def max_abs_difference(pairs: Iterator[Tuple[Tensor, Tensor]]) -> float:
    return max((max_abs(a.detach() - b.detach().to(a)) for a, b in pairs), default=0.0)
