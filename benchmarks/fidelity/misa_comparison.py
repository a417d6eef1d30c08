"""The MISA rows: our ``misa`` trained side by side with kangzhiq/MISA's own model and trainer (``--misa``),
from the same initial state on the same stream batches, then compared as the FlyGCL rows are
(docs/verification.md, "MISA against its own repository")."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from benchmarks.core.stream import Exposure

from .comparison import _decisions, check_pairing, checkout_commit, exposed_test_images, train_side_by_side
from .evaluations import OfficialEvaluations
from .measures import copy_tensors, tensor_differences, worst
from .misa_checkout import MISACheckout
from .misa_side import MISASide
from .ours import OursSide
from .pairs import PAIRS, MethodPair
from .row import FidelityRow
from .setting import Setting

__all__ = ["MISASetting", "MISARow", "MISA_ROWS", "compare_misa", "misa_setting", "MASKED_A_AUC", "VIT_B16_SMALL_IMAGES"]

#: ViT-B/16, the width MISA's shipped prompts fit, on 16 x 16 images (one patch): a CPU trains it in minutes
VIT_B16_SMALL_IMAGES = dict(img_size=16, patch_size=16, embed_dim=768, depth=12, num_heads=12)


@dataclass(frozen=True)
class MISASetting(Setting):
    """A :class:`Setting` whose ``vit`` may also be ``"base-16px"`` (:data:`VIT_B16_SMALL_IMAGES`), and
    ``misa_prompts``: MISA's ``pretrained_prompt`` folder of the checkout, loaded by both sides as the
    initial prompts (MISA's ``--load_pt``, our ``--misa-prompts``); ``None``: ours copied into MISA's."""

    misa_prompts: Optional[str] = None

    @property
    def shape(self) -> Dict[str, int]:
        return dict(VIT_B16_SMALL_IMAGES) if self.vit == "base-16px" else super().shape

    def protocol(self) -> Any:
        return dataclasses.replace(super().protocol(), misa_prompts=self.misa_prompts)


@dataclass(frozen=True)
class MISARow:
    """One row: the pair, and what its setting changes (``dataclasses.replace`` options)."""

    pair: MethodPair
    setting: Dict[str, Any] = field(default_factory=dict)


#: the ``other`` entry: A_auc points, ours - MISA's with the seen-class mask its online_evaluate leaves out
MASKED_A_AUC = "A_auc points, ours - official with the seen-class mask"
_MAIN = MethodPair(
    "misa", "misa", PAIRS["dualprompt"].weights, official_selection=lambda model: None,
    ours_kwargs={"reference_quirks": True},
    note="scripts/misa.sh's run; it departs from ours and FlyGCL's in four places: select_model leaves task_num "
         "at 10 (1 E-prompt slot per session), its step advances at session ends, the training match's range-local "
         "index reads the whole pool (every session trains prompt 0), online_evaluate adds no seen-class mask "
         "(A_auc with it under other); reference_quirks=True",
)
MISA_ROWS: Dict[str, MISARow] = {
    "misa": MISARow(_MAIN),
    # One session, one step and task_num 1: the training slot range is the whole pool (local index = global
    # index) and no step advances, so of the four departures only the evaluation's missing mask remains.
    "misa-one-session": MISARow(
        dataclasses.replace(
            _MAIN, official_kwargs={"task_num": 1}, variant="one session, task_num 1",
            note="one session, one step, MISA's task_num 1: the first three departures cannot act (no step advance, "
                 "the training slot range is the whole pool); the fourth acts only where an unseen class wins "
                 "(A_auc with the mask under other); reference_quirks=True",
        ),
        setting={"num_sessions": 1, "num_experts": 1},
    ),
}


class MaskedAccuracies:
    """Listener of the runner's evaluations: the official model's accuracy with the seen-class mask added
    (MISA's ``online_evaluate`` adds none), on the same test samples."""

    def __init__(self, official: MISASide, exposure: Exposure, test: Any) -> None:
        self.official, self.exposure, self.test = official, exposure, test
        self.accuracies: List[Tuple[str, float]] = []

    def __call__(self, kind: str, samples_seen: int) -> None:
        indices, _ = self.exposure.eval_subset(self.test.targets, samples_seen)
        images = self.test.get_batch(indices)[0]
        targets = self.exposure.to_exposure(self.test.targets[indices])
        scores, _ = self.official.predict(images)
        self.official.model.train()
        self.accuracies.append((kind, float((scores.argmax(1) == targets).double().mean())))

    def a_auc(self) -> float:
        anytime = [accuracy for kind, accuracy in self.accuracies if kind == "anytime"]
        return sum(anytime) / len(anytime) if anytime else math.nan


def compare_misa(checkout: MISACheckout, row: MISARow, setting: MISASetting) -> FidelityRow:
    """Train ``row`` side by side on ``setting`` (with the row's changes) and measure."""
    started = time.perf_counter()
    pair, setting = row.pair, dataclasses.replace(setting, **row.setting)
    load_pt = _shipped(checkout, setting)
    torch.manual_seed(setting.seed)
    train, test = setting.data()
    ours = OursSide(pair, setting, train, test)
    official = MISASide(checkout, pair, setting, ours.model.backbone, num_classes=len(train.classes),
                        lr=pair.official_lr, load_pt=load_pt)
    check_pairing(pair, official, ours)
    other = _initial_prompts(official, ours) if load_pt else {}
    copy_tensors(ours.state(), official.state(), {ours_name: name for name, ours_name in pair.weights.items()})
    initial = {name: tensor.detach().clone() for name, tensor in official.state().items() if name in pair.weights}
    unused = {name: tensor.detach().clone() for name, tensor in official.unused().items()}
    evaluations = OfficialEvaluations(official, ours.run.exposure, test, batch_size=64)
    masked = MaskedAccuracies(official, ours.run.exposure, test)
    ours.evaluations.listeners += [evaluations, masked]
    train_side_by_side(ours, official, train)
    differences = tensor_differences(official.state(), ours.state(), pair.names())
    moved = tensor_differences(official.state(), initial, [(name, name) for name in pair.weights])
    (a_auc_ours, a_last_ours), (a_auc_official, a_last_official) = ours.metrics(), evaluations.metrics()
    other[MASKED_A_AUC] = 100 * (a_auc_ours - masked.a_auc())
    other.update(_unused_moved(official, unused))
    decisions = _decisions(ours, official, exposed_test_images(ours, test), pair)
    largest = worst(differences)
    return FidelityRow(
        method=f"{pair.method} ({pair.variant})" if pair.variant else pair.method, official="MISA DualPrompt",
        repository="kangzhiq/MISA", commit=checkout_commit(checkout.path),
        weights_max_abs=max(d.max_abs for d in differences), weights_relative=largest.relative, worst=largest.ours,
        tensors=len(differences), weights_moved=min(d.relative for d in moved), **decisions,
        a_auc_ours=a_auc_ours, a_auc_official=a_auc_official, a_last_ours=a_last_ours,
        a_last_official=a_last_official, other=other, seconds=time.perf_counter() - started, note=pair.note,
    )


def _shipped(checkout: MISACheckout, setting: MISASetting) -> bool:
    """Whether both sides load the shipped prompts; MISA's ``--load_pt`` reads ``pretrained_prompt/`` only."""
    if setting.misa_prompts is None:
        return False
    expected = checkout.path / "pretrained_prompt"
    if Path(setting.misa_prompts).resolve() != expected:
        raise ValueError(f"misa_prompts {setting.misa_prompts} is not {expected}, the folder MISA's --load_pt "
                         "reads; pass that folder")
    return True


def _initial_prompts(official: MISASide, ours: OursSide) -> Dict[str, float]:
    """Relative differences of the prompts each side loaded from the shipped files, before any copy."""
    names = [("g_prompt.prompts", "g_prompts"), ("e_prompt.prompts", "e_prompts")]
    differences = tensor_differences(official.state(), ours.state(), names)
    return {f"initial {difference.official}": difference.relative for difference in differences}


def _unused_moved(official: MISASide, before: Dict[str, Tensor]) -> Dict[str, float]:
    """The largest change of ``--load_pt``'s parameters outside the forward (0: never updated)."""
    if not before:
        return {}
    change = max(float((tensor.detach() - before[name]).abs().max()) for name, tensor in official.unused().items())
    return {"load_pt's scale, translation: change": change}


def misa_setting(checkout: MISACheckout, *, vit: str = "base-16px", explicit_attention: bool = True) -> MISASetting:
    """The MISA rows' setting: ``vit`` (ViT-B/16 on 16 x 16 images by default, where the shipped prompts fit),
    10 training images a class (a CPU trains ViT-B/16 on them in minutes), and the checkout's shipped prompts
    as both sides' initial prompts when it has them."""
    folder = checkout.path / "pretrained_prompt"
    shipped = all((folder / name).is_file() for name in ("g_prompt.pt", "e_prompt.pt"))
    return MISASetting(vit=vit, train_per_class=10, explicit_attention=explicit_attention,
                       misa_prompts=str(folder) if shipped else None)
