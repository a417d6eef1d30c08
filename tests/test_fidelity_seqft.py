"""benchmarks.fidelity's Seq FT rows on the stand-in checkout: ``seq-ft`` and ``seq-ft-sl`` train the whole ViT
as the stand-in's ``slca`` trainer with its ``sgd_sl`` optimiser does, and a change planted in that official
code (the slow learner taken out of ``sgd_sl``) is seen; the official loop, which builds the model by
``select_model`` and the optimiser from ``--opt_name sgd_sl``, agrees with the runner."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("timm")

from fidelity_stand_in import FAKE_FLYGCL as FAKE  # noqa: E402
from fidelity_stand_in import SMALL  # noqa: E402

from benchmarks.core import reference_checkout as ref  # noqa: E402
from benchmarks.fidelity.comparison import compare_method  # noqa: E402
from benchmarks.fidelity.loop_comparison import LOOP_SETUPS, compare_loop  # noqa: E402
from benchmarks.fidelity.pairs import PAIRS  # noqa: E402


@pytest.fixture(scope="module")
def checkout():
    return ref.load_checkout(str(FAKE), ["slca"])


@pytest.mark.parametrize("method", ["seq-ft", "seq-ft-sl"])
def test_seq_ft_trains_and_decides_as_the_official_trainer(checkout, method):
    row = compare_method(checkout, PAIRS[method], SMALL)
    assert row.tensors == len(PAIRS[method].weights)  # every tensor of the ViT and the head
    assert row.weights_moved > 0, row  # the slow learner's backbone moves little, but every tensor moves
    assert row.weights_relative < 1e-6, row
    assert row.predictions_trained == row.predictions_identical == 1.0
    assert row.a_auc_ours == pytest.approx(row.a_auc_official, abs=1e-9)
    assert row.a_last_ours == pytest.approx(row.a_last_official, abs=1e-9)


class _WithoutSlowLearner:
    """The official ``select_optimizer`` with every group at the head's rate: ``sgd_sl`` without its slow learner."""

    def __init__(self, select_optimizer) -> None:
        self.select_optimizer = select_optimizer

    def __call__(self, opt_name, lr, model):
        optimizer = self.select_optimizer(opt_name, lr, model)
        for group in optimizer.param_groups:
            group["lr"] = optimizer.param_groups[-1]["lr"]
        return optimizer


def test_a_change_planted_in_the_official_optimiser_is_seen(checkout, monkeypatch):
    namespace = checkout.base_trainer.reset_opt.__globals__  # methods/_trainer.py's imports
    monkeypatch.setitem(namespace, "select_optimizer", _WithoutSlowLearner(namespace["select_optimizer"]))
    planted = compare_method(checkout, PAIRS["seq-ft-sl"], SMALL)
    assert planted.weights_relative > 1e-2, planted
    # seq-ft's backbone already trains at the head's rate: the plant changes nothing there
    assert compare_method(checkout, PAIRS["seq-ft"], SMALL).weights_relative < 1e-6


def test_the_stand_in_optimiser_is_the_slow_learner(checkout):
    # The stand-in's sgd_sl, read as the official one is: the classifier `fc` at 0.005, the rest at the run's rate.
    select_optimizer = checkout.base_trainer.reset_opt.__globals__["select_optimizer"]
    model = torch.nn.Sequential()
    model.add_module("blocks", torch.nn.Linear(2, 2))
    model.add_module("fc", torch.nn.Linear(2, 3))
    backbone, head = select_optimizer("sgd_sl", 5e-5, model).param_groups
    assert (backbone["lr"], head["lr"]) == (5e-5, 0.005)
    assert head["params"] == list(model.fc.parameters())


def test_the_official_loop_and_the_runner_agree(checkout):
    row = compare_loop(checkout, PAIRS["seq-ft-sl"], SMALL, LOOP_SETUPS["seq-ft-sl"])
    assert row.stream == "equal" and row.points_equal and row.accuracy_difference == 0.0
    assert row.weights_relative < 1e-6
    for name in ("A_auc", "A_last", "A_avg"):
        assert row.our_metrics[name] == pytest.approx(row.official_metrics[name], abs=1e-12)


def test_the_official_loop_with_another_optimiser_is_seen(checkout):
    # --opt_name adam (the launch scripts' flag for the other methods) in place of sgd_sl
    row = compare_loop(checkout, PAIRS["seq-ft-sl"], SMALL, dataclasses.replace(LOOP_SETUPS["seq-ft-sl"], flags=()))
    assert row.weights_relative > 1e-2
