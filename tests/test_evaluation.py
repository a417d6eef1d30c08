"""Diagnostics: the class x expert counts, their summaries, and their agreement with the variants' logs."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("timm")

from benchmarks.ablation.diagnostics import ExpertUsage, expert_matrix_summary, routing_summary  # noqa: E402
from benchmarks.ablation.runner import run_training  # noqa: E402
from benchmarks.core.protocol import Protocol  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402

CPU = torch.device("cpu")
PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2),
    pretrained=False, image_size=32, batch_size=12, online_iter=3, lr=0.05, eval_period=30, test_batch_size=10,
    num_experts=3, expansion_dim=64, ridge=1e2, amp=False, router_query="first_iteration",
)
ALL = ["baseline", "router", "ensemble", "both", "oracle", "oracle_both"]


def test_expert_usage_counts_modal_and_any_experts():
    usage = ExpertUsage(4, 3, CPU)
    usage.add(torch.tensor([0, 0, 0, 1, 1, 2]), torch.tensor([1, 1, 2, 0, 2, 2]))
    usage.add(torch.tensor([2]), torch.tensor([0]))
    assert usage.counts.tolist() == [[0, 2, 1], [1, 0, 1], [1, 0, 1], [0, 0, 0]]
    assert usage.modal_expert().tolist() == [1, 0, 0, -1]  # ties go to the lowest id; -1: never trained
    assert usage.first_expert().tolist() == [1, 0, 0, -1]
    usage.add(torch.tensor([0, 0, 0]), torch.tensor([0, 2, 2]))  # class 0: expert 0 trains it once more
    assert usage.modal_expert()[0] == 2 and usage.first_expert()[0] == 0
    assert usage.trained_any()[1].tolist() == [True, False, True]
    assert usage.trained_experts().tolist() == [True, True, True]
    copy = ExpertUsage(4, 3, CPU)
    copy.load_state_dict(usage.state_dict())
    assert torch.equal(copy.counts, usage.counts)
    with pytest.raises(ValueError, match="expected counts of shape \\(4, 3\\)"):
        copy.load_state_dict(ExpertUsage(4, 2, CPU).state_dict())


def test_expert_matrix_rows_are_groups_columns_are_trained_experts():
    correct = torch.tensor([[3, 1, 0], [0, 2, 0], [0, 0, 0]])
    sizes = torch.tensor([4, 2, 0])  # no test sample has expert 2 as its true expert
    summary = expert_matrix_summary(correct, sizes, torch.tensor([True, True, False]))
    assert summary["groups"] == [0, 1] and summary["experts"] == [0, 1] and summary["group_sizes"] == [4, 2]
    assert summary["accuracy"] == [[0.75, 0.25], [0.0, 1.0]]
    assert summary["diagonal_minus_off_diagonal"] == pytest.approx((0.75 + 1.0) / 2 - (0.25 + 0.0) / 2)
    single = expert_matrix_summary(torch.tensor([[1]]), torch.tensor([2]), torch.tensor([True]))
    assert math.isnan(single["diagonal_minus_off_diagonal"])  # nothing off the diagonal


def test_routing_summary_takes_the_last_evaluation_and_the_anytime_mean():
    def entry(kind, hits, samples):
        return {"kind": kind, "samples": samples, **{f"{who}_{version}": hits for who in ("own", "rear", "chance")
                                                     for version in ("modal", "any")}}

    summary = routing_summary([entry("anytime", 1, 4), entry("anytime", 3, 4), entry("session_end", 2, 8)])
    assert summary["own"]["modal"] == {"last": 0.25, "anytime_mean": 0.5}
    assert summary["chance"]["any"]["anytime_mean"] == 0.5
    # Entries counted before the "first" version existed (resumed runs) give NaN for it, not an error.
    assert math.isnan(summary["rear"]["first"]["last"]) and math.isnan(summary["rear"]["first"]["anytime_mean"])


def test_routing_hits_against_the_modal_the_first_and_any_expert():
    from benchmarks.ablation.evaluation import _Tally

    tally = _Tally([], 2, 3, CPU)
    # Three different counts, so that scoring one version against another's expert cannot pass.
    experts, modal, first = torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 1, 0]), torch.tensor([0, 0, 2, 1])
    trained_any = torch.tensor([[True, False, False], [True, True, False], [False, True, True], [True, True, False]])
    tally.add_routing("own", experts, modal, first, trained_any)
    assert [int(tally.counts[f"own_{v}"]) for v in ("modal", "first", "any")] == [2, 3, 4]
    assert [int(tally.counts[f"rear_{v}"]) for v in ("modal", "first", "any")] == [0, 0, 0]


@pytest.fixture(scope="module")
def runs():
    data = make_synthetic_train_test(6, train_per_class=12, test_per_class=5, seed=0, image_size=32)
    return {
        "dualprompt": run_training("dualprompt", "synthetic", 2, ALL, PROTOCOL, *data, device=CPU),
        "mvp": run_training("mvp", "synthetic", 2, ALL, PROTOCOL, *data, device=CPU),
        "flyprompt": run_training("flyprompt", "synthetic", 2, ["full", "oracle", "oracle_both"], PROTOCOL, *data,
                                  device=CPU),
    }


def _final_accuracy(record, classes):
    last = [r for r in record["log"]["records"] if r["kind"] == "session_end"][-1]
    return sum(last["correct"][c] for c in classes) / sum(last["total"][c] for c in classes)


@pytest.mark.parametrize("method", ["dualprompt", "mvp", "flyprompt"])
def test_the_forced_expert_matrix_diagonal_is_the_oracle_variant(runs, method):
    """Group g forced to expert g is the oracle variant on the classes whose true expert is g."""
    record = runs[method]["oracle"]
    diagnostics = record["diagnostics"]
    matrix, true_expert = diagnostics["expert_matrix"], diagnostics["true_expert_of_class"]
    for row, group in enumerate(matrix["groups"]):
        classes = [c for c, expert in enumerate(true_expert) if expert == group]
        column = matrix["experts"].index(group)
        assert matrix["accuracy"][row][column] == pytest.approx(_final_accuracy(record, classes))
    assert diagnostics["routing"]["chance"]["modal"]["last"] == pytest.approx(1 / len(matrix["experts"]))


@pytest.mark.parametrize("method", ["dualprompt", "mvp"])
def test_ensemble_members_match_the_variants_with_the_same_selection(runs, method):
    run = runs[method]
    for variant, online_twin in (("ensemble", "baseline"), ("both", "router"), ("oracle_both", "oracle")):
        members = run[variant]["diagnostics"]["members"]
        assert list(members) == ["online", "ema_0.9", "ema_0.99", "ensemble"]
        assert members["online"] == pytest.approx({k: run[online_twin]["metrics"][k] for k in ("A_auc", "A_last")})
        assert members["ensemble"] == pytest.approx({k: run[variant]["metrics"][k] for k in ("A_auc", "A_last")})
    assert "members" not in run["router"]["diagnostics"]


def test_routing_accuracies_are_fractions_shared_by_the_training(runs):
    for run in runs.values():
        routing = [record["diagnostics"]["routing"] for record in run.values()]
        assert all(r == routing[0] for r in routing)  # one training, one routing record
        for who in ("own", "rear", "chance"):
            modal, any_ = routing[0][who]["modal"], routing[0][who]["any"]
            assert 0 <= modal["last"] <= any_["last"] <= 1 and 0 <= modal["anytime_mean"] <= any_["anytime_mean"] <= 1
    flyprompt = runs["flyprompt"]["full"]["diagnostics"]["routing"]
    assert flyprompt["rear"] == flyprompt["own"]  # its own selection is its router


def test_an_empty_first_session_is_evaluated_on_no_sample():
    """Random cut points can leave a session empty (seed 4 here: sizes 0, 24, 24, 12, 12): its session-end
    evaluation scores no test sample instead of passing an empty batch to the model and the ensemble."""
    data = make_synthetic_train_test(6, train_per_class=12, test_per_class=5, seed=0, image_size=32)
    record = run_training("dualprompt", "synthetic", 4, ["baseline", "ensemble"], PROTOCOL, *data, device=CPU)["ensemble"]
    first = record["log"]["records"][0]
    assert (first["kind"], first["samples_seen"], first["total"]) == ("session_end", 0, [])
    last = [r for r in record["log"]["records"] if r["kind"] == "session_end"][-1]
    assert record["metrics"]["A_last"] == pytest.approx(sum(last["correct"]) / sum(last["total"]))  # a fraction
