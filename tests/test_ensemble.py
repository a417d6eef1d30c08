"""TemporalEnsembleHead: closed-form EMA, batched inference vs a per-sample reference, rules, state."""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import torch
from torch import nn

from fly_modules import (
    AGGREGATION_RULES,
    ClassifierNotFoundError,
    InvalidParameterError,
    TemporalEnsembleHead,
    _compat,
    aggregate_logits,
    find_classifier,
    locate_classifier,
    seen_class_mask,
)
from fly_modules import ensemble as ensemble_module


def make_head(d=6, c=5, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(d, c, bias=bias)


def naive_scores(ensemble: TemporalEnsembleHead, features, ids, mask, rule):
    """Per-sample reference: the online head and the sample's expert's copies, one sample at a time."""
    rows = []
    for x, e in zip(features, ids.tolist()):
        heads = [ensemble.online(x)]
        for k in range(ensemble.num_decays):
            bias = ensemble.ema_bias[e, k] if ensemble.ema_bias is not None else 0
            heads.append(ensemble.ema_weight[e, k] @ x + bias)
        logits = torch.stack(heads) + mask
        probs = logits.softmax(-1)
        entropy = -torch.where(probs > 0, probs * probs.log(), torch.zeros_like(probs)).sum(-1)
        if rule == "mean":
            rows.append(logits.mean(0))
        elif rule == "max_prob":
            rows.append(logits.max(0).values)
        elif rule == "min_entropy":
            rows.append(logits[entropy.argmin()])
        elif rule == "softmax_mean":
            rows.append(probs.mean(0))
        elif rule == "softmax_max":
            rows.append(probs.max(0).values)
        elif rule == "logit_min_entropy":
            rows.append(logits[first_nan_else_least(logit_entropies(logits))])
        else:
            rows.append(probs[entropy.argmin()])
    return torch.stack(rows)


def logit_entropies(logits):
    """Per member, FlyGCL's "entropy" of its raw logits, one class at a time: NaN where a logit is below
    -1e-8 (the log of a negative number) or masked (-inf times NaN)."""
    return [-sum(z * math.log(z + 1e-8) if z + 1e-8 > 0 else math.nan for z in member)
            for member in logits.detach().tolist()]


def first_nan_else_least(values):
    """The first NaN's index, else the least value's (the first of equal ones)."""
    nans = [i for i, value in enumerate(values) if math.isnan(value)]
    return nans[0] if nans else min(range(len(values)), key=lambda i: (values[i], i))


@pytest.mark.parametrize("strategy", ["grouped_by_expert", "all_experts"])
@pytest.mark.parametrize("rule", AGGREGATION_RULES)
@pytest.mark.parametrize("bias", [True, False])
def test_batched_inference_equals_per_sample_reference(rule, bias, strategy, monkeypatch):
    if strategy == "all_experts":  # the strategy used off the CPU, exercised here on the CPU
        monkeypatch.setattr(ensemble_module, "_copies_grouped_by_expert", ensemble_module._copies_all_experts)
    ensemble = TemporalEnsembleHead(make_head(bias=bias), 3, decays=(0.5, 0.9, 0.99), aggregate=rule)
    optimizer = torch.optim.SGD(ensemble.online.parameters(), lr=0.5)
    for expert in range(3):
        ensemble.start_expert(expert)
        for _ in range(3):
            optimizer.zero_grad()
            ensemble(torch.randn(8, 6)).pow(2).mean().backward()
            optimizer.step()
            ensemble.update()
    features = torch.randn(32, 6)
    ids = torch.randint(0, 3, (32,))
    mask = seen_class_mask(4, 5)
    got = ensemble(features, ids, mask)
    expected = naive_scores(ensemble, features, ids, mask, rule)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_expert_copy_strategies_agree_with_absent_experts_and_pass_gradients():
    generator = torch.Generator().manual_seed(3)
    bank = torch.randn(6, 2, 5, 7, generator=generator)
    ids = torch.tensor([4, 0, 4, 2, 0, 4, 2])  # experts 1, 3 and 5 absent, samples unsorted
    features = torch.randn(7, 7, generator=generator, requires_grad=True)
    grouped = ensemble_module._copies_grouped_by_expert(features, bank, ids)
    every = ensemble_module._copies_all_experts(features, bank, ids)
    expected = torch.einsum("dck,nk->ndc", bank[ids[0]], features[:1])
    torch.testing.assert_close(grouped[:1], expected)
    torch.testing.assert_close(grouped, every)
    (gradient,) = torch.autograd.grad(grouped.sum(), features)
    (gradient_every,) = torch.autograd.grad(every.sum(), features)
    torch.testing.assert_close(gradient, gradient_every)


def test_ema_follows_closed_form_for_the_active_expert_only():
    ensemble = TemporalEnsembleHead(make_head(), 2, decays=(0.9, 0.99))
    initial = ensemble.ema_weight.clone()
    ensemble.start_expert(1)
    online_history = []
    optimizer = torch.optim.SGD(ensemble.online.parameters(), lr=0.1)
    handle = ensemble.attach(optimizer)
    for _ in range(7):
        optimizer.zero_grad()
        ensemble(torch.randn(4, 6)).sum().backward()
        optimizer.step()  # the post-step hook moves the copies
        online_history.append(ensemble.online.weight.detach().clone())
    handle.remove()
    start = initial[1, 0]  # expert 1 started from the online head at construction time (unchanged then)
    for k, decay in enumerate((0.9, 0.99)):
        n = len(online_history)
        expected = decay**n * start + sum((1 - decay) * decay ** (n - 1 - i) * w for i, w in enumerate(online_history))
        torch.testing.assert_close(ensemble.ema_weight[1, k], expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(ensemble.ema_weight[0], initial[0])  # inactive expert untouched
    assert ensemble.num_updates.tolist() == [0, 7]
    optimizer.step()  # hook removed: no more updates
    assert ensemble.num_updates.tolist() == [0, 7]


@pytest.mark.parametrize("strategy", ["listed", "masked"])
def test_update_of_selected_experts_moves_each_once(strategy, monkeypatch):
    if strategy == "masked":  # the strategy used off the CPU, exercised here on the CPU
        monkeypatch.setattr(ensemble_module, "_ema_step_listed", ensemble_module._ema_step_masked)
    ensemble = TemporalEnsembleHead(make_head(), 3, decays=(0.5,))
    with torch.no_grad():
        ensemble.online.weight.add_(1.0)
        ensemble.online.bias.add_(2.0)
    before, before_bias = ensemble.ema_weight.clone(), ensemble.ema_bias.clone()
    ensemble.update(torch.tensor([2, 0, 2, 2]))
    torch.testing.assert_close(ensemble.ema_weight[0, 0], 0.5 * before[0, 0] + 0.5 * ensemble.online.weight)
    torch.testing.assert_close(ensemble.ema_weight[2, 0], 0.5 * before[2, 0] + 0.5 * ensemble.online.weight)
    torch.testing.assert_close(ensemble.ema_bias[2, 0], 0.5 * before_bias[2, 0] + 0.5 * ensemble.online.bias)
    assert torch.equal(ensemble.ema_weight[1], before[1]) and torch.equal(ensemble.ema_bias[1], before_bias[1])
    assert ensemble.num_updates.tolist() == [1, 0, 1]
    ensemble.update(torch.tensor([], dtype=torch.long))  # nothing listed: nothing moves
    assert ensemble.num_updates.tolist() == [1, 0, 1]


def test_ema_step_strategies_agree():
    generator = torch.Generator().manual_seed(5)
    bank = torch.randn(5, 2, 4, 3, generator=generator)
    target = torch.randn(1, 1, 4, 3, generator=generator)
    rate = torch.tensor([0.1, 0.01]).view(1, -1, 1, 1)
    ids = torch.tensor([3, 1, 3])
    listed, masked = bank.clone(), bank.clone()
    moved_listed = ensemble_module._ema_step_listed(listed, target, rate, ids)
    moved_masked = ensemble_module._ema_step_masked(masked, target, rate, ids)
    assert moved_listed.tolist() == moved_masked.tolist() == [0, 1, 0, 1, 0]
    torch.testing.assert_close(listed, masked, rtol=0, atol=1e-6)
    assert torch.equal(masked[[0, 2, 4]], bank[[0, 2, 4]]) and not torch.equal(masked[1], bank[1])


def test_training_output_is_the_online_head():
    head = make_head()
    ensemble = TemporalEnsembleHead(head, 2)
    assert ensemble.online is head
    x = torch.randn(3, 6)
    mask = seen_class_mask(2, 5)
    assert torch.equal(ensemble(x), head(x))
    assert torch.equal(ensemble(x, logit_mask=mask), head(x) + mask)
    assert [name for name, _ in ensemble.named_parameters()] == ["online.weight", "online.bias"]


def test_wraps_timm_style_models_through_get_classifier():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def get_classifier(self):
            return self.fc

    model = Model()
    assert TemporalEnsembleHead(model, 1).online is model.fc
    with pytest.raises(TypeError, match="needs an nn.Linear classifier"):
        TemporalEnsembleHead(nn.Sequential(nn.ReLU()), 1)


def test_start_expert_grows_and_clones_online_head():
    ensemble = TemporalEnsembleHead(make_head(), 0)
    with pytest.raises(ValueError, match="start_expert"):
        ensemble.start_expert(1)
    ensemble.start_expert(0)
    with torch.no_grad():
        ensemble.online.weight.mul_(2)
    ensemble.start_expert(1)
    assert ensemble.num_experts == 2 and ensemble.active_expert == 1
    assert torch.equal(ensemble.ema_weight[1, 1], ensemble.online.weight)
    assert not torch.equal(ensemble.ema_weight[0, 0], ensemble.online.weight)


def test_state_dict_round_trip_into_fresh_instance():
    ensemble = TemporalEnsembleHead(make_head(), 1)
    ensemble.start_expert(1)
    ensemble.start_expert(2)
    with torch.no_grad():
        ensemble.online.weight.add_(0.3)
    ensemble.update()
    buffer = io.BytesIO()
    torch.save(ensemble.state_dict(), buffer)
    buffer.seek(0)
    fresh = TemporalEnsembleHead(make_head(seed=1), 1)
    fresh.load_state_dict(_compat.load_weights(buffer))
    assert fresh.num_experts == 3 and fresh.active_expert == 2
    x, ids = torch.randn(10, 6), torch.tensor([0, 1, 2, 2, 1, 0, 0, 1, 2, 2])
    assert torch.equal(fresh(x, ids), ensemble(x, ids))
    assert torch.equal(copy.deepcopy(ensemble)(x, ids), ensemble(x, ids))


@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16])  # torch < 2.1: through _compat.lerp_
def test_low_precision_heads_keep_exact_float64_decays(cast):
    ensemble = TemporalEnsembleHead(make_head(), 1, decays=(0.99, 0.9999)).to(cast)
    assert ensemble.ema_weight.dtype == cast and ensemble.decays.dtype == torch.float64
    assert ensemble.decays.tolist() == [0.99, 0.9999]  # 0.9999 is 1.0 in bfloat16 and float16
    before = ensemble.ema_weight.clone()
    with torch.no_grad():
        ensemble.online.weight.add_(1.0)
    ensemble.update()
    assert bool((ensemble.ema_weight[0, 1] != before[0, 1]).any())  # the slow copy moves too


@pytest.mark.parametrize("experts", [1.9, [0.7], True, [True]])
def test_update_rejects_non_integer_expert_ids(experts):
    ensemble = TemporalEnsembleHead(make_head(), 2)
    with pytest.raises(TypeError):
        ensemble.update(experts)


def test_to_dtype_moves_banks():
    ensemble = TemporalEnsembleHead(make_head(), 2).to(torch.float64)
    assert ensemble.ema_weight.dtype == torch.float64
    out = ensemble(torch.randn(3, 6, dtype=torch.float64), torch.tensor([0, 1, 1]))
    assert out.dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"decays": (0.9, 1.0)}, r"\(0, 1\)"),
        ({"decays": (0.0,)}, r"\(0, 1\)"),
        ({"decays": (0.9, 0.9)}, "distinct"),
        ({"decays": ()}, "at least one"),
        ({"aggregate": "vote"}, "aggregate must be one of"),
    ],
)
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TemporalEnsembleHead(make_head(), 1, **kwargs)


def test_inference_input_validation():
    ensemble = TemporalEnsembleHead(make_head(), 2)
    with pytest.raises(ValueError, match="does not exist"):
        ensemble(torch.randn(2, 6), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="NaN"):
        ensemble(torch.full((2, 6), float("nan")), 0)
    with pytest.raises(ValueError, match="columns"):
        ensemble(torch.randn(2, 7), 0)


def test_min_entropy_ignores_masked_classes():
    logits = torch.tensor([[[5.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]]]).transpose(0, 1)  # (1, 2, 3)
    mask = torch.tensor([0.0, 0.0, float("-inf")])
    scores = aggregate_logits(logits + mask, "softmax_min_entropy")
    assert torch.isfinite(scores).all()
    torch.testing.assert_close(scores, (logits[:, 0] + mask).softmax(-1))


def test_logit_min_entropy_is_the_official_min_entropy_nan_first_else_least():
    """Where every logit is positive the raw "entropy" is finite and the least wins; one negative or
    masked logit makes a member's NaN, and the first NaN member wins (the online head under a mask)."""
    positive = torch.tensor([[[3.0, 0.1, 0.1], [0.2, 0.1, 0.3], [4.0, 5.0, 4.0]]])
    least = first_nan_else_least(logit_entropies(positive[0]))
    assert least == 2  # the flat but large logits: the least raw value, not the most peaked softmax
    torch.testing.assert_close(aggregate_logits(positive, "logit_min_entropy"), positive[:, least])
    one_negative = positive.clone()
    one_negative[0, 1, 0] = -0.5
    torch.testing.assert_close(aggregate_logits(one_negative, "logit_min_entropy"), one_negative[:, 1])
    masked = positive + torch.tensor([0.0, 0.0, float("-inf")])
    torch.testing.assert_close(aggregate_logits(masked, "logit_min_entropy"), masked[:, 0])
    assert not torch.equal(aggregate_logits(positive, "logit_min_entropy").argmax(1),
                           aggregate_logits(positive, "softmax_min_entropy").argmax(1))


def test_checkpoint_with_an_active_expert_out_of_range_is_refused():
    state = TemporalEnsembleHead(make_head(), 2).state_dict()
    state["_extra_state"] = {"active_expert": 2}
    with pytest.raises(ValueError, match="active_expert 2 is not one of its 2 experts"):
        TemporalEnsembleHead(make_head(), 2).load_state_dict(state)


def test_locate_classifier_names_the_child_or_lists_the_children():
    class Timm(nn.Module):  # get_classifier() returns a grandchild, as in timm's ConvNeXt
        def __init__(self):
            super().__init__()
            self.head = nn.Sequential()
            self.head.add_module("fc", nn.Linear(4, 3))

        def get_classifier(self):
            return self.head.fc

    model = Timm()
    assert locate_classifier(model) == ("head.fc", model.head.fc)
    assert find_classifier(model) is model.head.fc
    plain = nn.Module()
    plain.fc = nn.Linear(4, 2)
    assert locate_classifier(plain) == ("fc", plain.fc)
    plain.head = nn.Identity()  # `head` comes before `fc`
    assert locate_classifier(plain) == ("head", plain.head)
    with pytest.raises(InvalidParameterError, match="classifier `head` is Identity"):
        find_classifier(plain)
    with pytest.raises(LookupError, match=r"children are \['0 \(Linear\)', '1 \(ReLU\)'\]") as caught:
        locate_classifier(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    assert isinstance(caught.value, ClassifierNotFoundError) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "build",
    [
        lambda: TemporalEnsembleHead(make_head(), True),
        lambda: TemporalEnsembleHead(make_head(), -1),
        lambda: TemporalEnsembleHead(make_head(), 1, decays=(0.9, "0.99")),
        lambda: TemporalEnsembleHead(make_head(), 1, decays=(float("nan"),)),
        lambda: TemporalEnsembleHead(make_head(), 1, aggregate=None),
        lambda: TemporalEnsembleHead(make_head(), 1).add_expert(0),
        lambda: TemporalEnsembleHead(make_head(), 1).start_expert(1.0),
        lambda: aggregate_logits(torch.zeros(2, 3), "mean"),
        lambda: aggregate_logits(torch.zeros(2, 1, 3), "vote"),
    ],
)
def test_every_parameter_error_is_an_invalid_parameter_error(build):
    with pytest.raises(InvalidParameterError):
        build()


def test_integer_parameters_accept_numpy_integers():
    ensemble = TemporalEnsembleHead(make_head(), np.int64(2))
    ensemble.start_expert(np.int32(2))
    assert ensemble.num_experts == 3 and ensemble.active_expert == 2 and type(ensemble.active_expert) is int


def trained_ensemble(head=None, experts=3):
    ensemble = TemporalEnsembleHead(head or make_head(), experts)
    with torch.no_grad():
        ensemble.online.weight.add_(0.5)
    ensemble.update()
    return ensemble


@pytest.mark.parametrize(
    "target, match",
    [
        (lambda: TemporalEnsembleHead(make_head(c=4), 1), r"online.weight has shape \(5, 6\) but this module expects \(4, 6\)"),
        (lambda: TemporalEnsembleHead(make_head(), 1, decays=(0.9,)), r"decays has shape \(2,\) but this module expects \(1,\)"),
        (lambda: TemporalEnsembleHead(make_head(bias=False), 1), "has a bias but this head's has none"),
    ],
)
def test_mismatched_checkpoint_is_refused_and_changes_nothing(target, match):
    state = trained_ensemble().state_dict()
    ensemble = target()
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in ensemble.state_dict().items()}
    with pytest.raises(InvalidParameterError, match=match):
        ensemble.load_state_dict(state)
    after = ensemble.state_dict()
    assert after.keys() == before.keys() and ensemble.num_experts == 1
    assert all(torch.equal(v, before[k]) if isinstance(v, torch.Tensor) else v == before[k] for k, v in after.items())


def test_checkpoint_with_a_bad_active_expert_changes_nothing():
    state = trained_ensemble().state_dict()
    state["_extra_state"] = {"active_expert": 3}
    ensemble = TemporalEnsembleHead(make_head(seed=1), 1)
    weight = ensemble.online.weight.clone()
    with pytest.raises(InvalidParameterError, match="active_expert 3 is not one of its 3 experts"):
        ensemble.load_state_dict(state)
    assert ensemble.num_experts == 1 and torch.equal(ensemble.online.weight, weight)  # the online head too


@pytest.mark.parametrize("expert_ids", [None, 0])
def test_feature_checks_on_the_training_and_inference_paths(expert_ids):
    ensemble = TemporalEnsembleHead(make_head(), 2)
    with pytest.raises(InvalidParameterError, match="features have 7 columns but the module was built with in_features=6"):
        ensemble(torch.randn(3, 7), expert_ids)
    with pytest.raises(InvalidParameterError, match="1 NaN and 1 infinite"):
        ensemble(torch.tensor([[float("nan"), float("inf"), 0, 0, 0, 0]]), expert_ids)
    unchecked = TemporalEnsembleHead(make_head(), 2, check_values=False)
    assert torch.isnan(unchecked(torch.full((1, 6), float("nan")), expert_ids)).all()  # asked for: no check


@pytest.mark.skipif(_compat.TORCH_VERSION < (2, 0), reason="torch < 2 has no meta kernel for advanced indexing")
def test_accelerator_path_reads_no_values_on_the_host():
    """Meta tensors have no values: any host read (bool(), int(), .tolist()) of them raises."""
    ensemble = TemporalEnsembleHead(make_head(), 3, decays=(0.9, 0.99)).to("meta")
    features = torch.empty(8, 6, device="meta")
    for rule in AGGREGATION_RULES:
        ensemble.aggregate = rule
        assert ensemble(features, torch.zeros(8, dtype=torch.long, device="meta")).shape == (8, 5)
    assert ensemble(features).shape == (8, 5)
    with pytest.raises((RuntimeError, NotImplementedError), match="(?i)meta"):  # value checks read the features
        TemporalEnsembleHead(make_head(), 3, check_values=True).to("meta")(features, 0)


def test_restarting_an_expert_resets_its_copies_and_update_count():
    ensemble = TemporalEnsembleHead(make_head(), 2)
    ensemble.start_expert(1)
    for _ in range(3):
        with torch.no_grad():
            ensemble.online.weight.add_(0.1)
        ensemble.update()
    assert ensemble.num_updates.tolist() == [0, 3]
    ensemble.start_expert(1)  # restart: the copies start again from the online head, with no steps taken
    assert ensemble.num_updates.tolist() == [0, 0]
    assert torch.equal(ensemble.ema_weight[1], ensemble.online.weight.detach().expand_as(ensemble.ema_weight[1]))
    ensemble.update()
    assert ensemble.num_updates.tolist() == [0, 1]
