"""One method compared: both sides built on the same backbone and initial weights, trained on the same
stream batches by their own code, then their trainable tensors, decisions and metrics compared."""

from __future__ import annotations

import time
from typing import Any, Dict, List

import torch
from torch import Tensor

from benchmarks.core import reference_checkout as ref
from benchmarks.core.checkout_commit import checkout_commit

from .evaluations import OfficialEvaluations
from .measures import agreement, base_name, copy_tensors, tensor_differences, worst
from .official import OfficialSide
from .ours import OursSide
from .pairs import MethodPair
from .row import FidelityRow
from .setting import Setting

__all__ = ["compare_method", "checkout_commit"]


def check_pairing(pair: MethodPair, official: OfficialSide, ours: OursSide) -> None:
    """Every trainable tensor of either side is in the pair's map (none left out of the comparison), and
    every name of the map is in the models (maps built for a number of experts or blocks fit only that)."""
    official_state, our_state = official.state(), ours.state()
    unknown = sorted(name for name in pair.weights if name not in official_state)
    unknown += sorted(name for name in pair.weights.values() if base_name(name) not in our_state)
    if unknown:
        raise ValueError(
            f"{pair.method}: the weight map names {unknown[:3]}, which the models do not have; expected the "
            "tensors of models of the setting's experts and blocks; fix benchmarks/fidelity/pairs.py or the setting"
        )
    official_trainable = set(official.trainable())
    our_trainable = {name for name, p in ours.model.named_parameters() if p.requires_grad}
    mapped_ours = {base_name(name) for name in pair.weights.values()}
    left_out = sorted(official_trainable - set(pair.weights)) + sorted(our_trainable - mapped_ours)
    if left_out:
        raise ValueError(
            f"{pair.method}: trainable tensors {left_out} are not in the method's weight map; "
            "add them to benchmarks/fidelity/pairs.py"
        )


def train_side_by_side(ours: OursSide, official: OfficialSide, train: Any) -> None:
    """The stream, batch by batch: our session ends (and their evaluations), the official ones (empty
    sessions included, as the official loop has them), the official step, ours."""
    ended = 0
    for batch in ours.batches():
        ours.advance(batch)
        for session in range(ended, batch.session):
            official.session_end(session)
        ended = max(ended, batch.session)
        official.stream_batch(train.get_batch(batch.indices)[0], batch.targets)
        ours.train(batch)
    ours.finish()
    for session in range(ended, ours.run.stream.num_sessions):
        official.session_end(session)


def exposed_test_images(ours: OursSide, test) -> Tensor:
    indices, _ = ours.run.exposure.eval_subset(test.targets)
    return test.get_batch(indices)[0]


def compare_method(checkout: ref.Checkout, pair: MethodPair, setting: Setting) -> FidelityRow:
    """Train ``pair`` side by side on ``setting`` and measure (see the module docstring)."""
    started = time.perf_counter()
    torch.manual_seed(setting.seed)
    train, test = setting.data()
    ours = OursSide(pair, setting, train, test)
    official = OfficialSide(checkout, pair, setting, ours.model.backbone, num_classes=len(train.classes),
                            train_samples=len(train), lr=pair.official_lr)
    check_pairing(pair, official, ours)
    copy_tensors(ours.state(), official.state(), {ours_name: name for name, ours_name in pair.weights.items()})
    if pair.align is not None:
        pair.align(official.model, ours.model)
    initial = {name: tensor.detach().clone() for name, tensor in official.state().items() if name in pair.weights}
    evaluations = OfficialEvaluations(official, ours.run.exposure, test, batch_size=64)
    ours.evaluations.listeners.append(evaluations)
    train_side_by_side(ours, official, train)
    differences = tensor_differences(official.state(), ours.state(), pair.names())
    moved = tensor_differences(official.state(), initial, [(name, name) for name in pair.weights])
    images = exposed_test_images(ours, test)
    other = _other_state(pair, official, ours, images)
    decisions = _decisions(ours, official, images, pair)
    (a_auc_ours, a_last_ours), (a_auc_official, a_last_official) = ours.metrics(), evaluations.metrics()
    largest = worst(differences)
    return FidelityRow(
        method=f"{pair.method} ({pair.variant})" if pair.variant else pair.method, official=ref.CLASSES[pair.official][1],
        repository="AnAppleCore/FlyGCL", commit=checkout_commit(checkout.path),
        weights_max_abs=max(d.max_abs for d in differences), weights_relative=largest.relative,
        worst=largest.ours, tensors=len(differences), weights_moved=min(d.relative for d in moved), **decisions, a_auc_ours=a_auc_ours,
        a_auc_official=a_auc_official, a_last_ours=a_last_ours, a_last_official=a_last_official,
        other=other, seconds=time.perf_counter() - started, note=pair.note,
    )


def _other_state(pair: MethodPair, official: OfficialSide, ours: OursSide, images: Tensor) -> Dict[str, float]:
    """Relative differences of the pair's state beyond the trainable tensors (router, EMA heads)."""
    if pair.other_state is None:
        return {}
    tensors = pair.other_state(official.model, ours.model, images)
    differences = tensor_differences({k: a for k, (a, _) in tensors.items()}, {k: b for k, (_, b) in tensors.items()},
                                     [(name, name) for name in tensors])
    return {difference.official: difference.relative for difference in differences}


def _decisions(ours: OursSide, official: OfficialSide, images: Tensor, pair: MethodPair) -> Dict[str, float]:
    """Prediction agreement with each side's trained weights, then with ours loaded with the official
    side's trained state (prediction and selection)."""
    official_scores, official_selection = official.predict(images)
    our_scores, _ = ours.predict(images)
    trained = agreement(official_scores.argmax(1), our_scores.argmax(1))
    copy_tensors(official.state(), ours.state(), {**pair.weights, **pair.buffers})
    if pair.load_official is not None:
        pair.load_official(official.model, ours.model)
    our_scores, our_selection = ours.predict(images)
    identical = agreement(official_scores.argmax(1), our_scores.argmax(1))
    selected = agreement(official_selection, our_selection) if official_selection is not None else float("nan")
    return dict(predictions_trained=trained, predictions_identical=identical, selection_identical=selected)


def rows(checkout: ref.Checkout, pairs: List[MethodPair], setting: Setting) -> List[FidelityRow]:
    return [compare_method(checkout, pair, setting) for pair in pairs]
