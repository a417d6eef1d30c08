"""Family adapters on the stand-ins of the upstream codebases (``upstream_standins``, ``flygcl_standins``,
``generic_standins``, ``upstream_cases``)."""

from __future__ import annotations

import copy
import types
from typing import Any, Dict, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

pytest.importorskip("timm")
from fly_modules.adapters import Layout, SeamError, generic, retrofit  # noqa: E402
from flygcl_standins import FlyGCLCodaPrompt  # noqa: E402
from upstream_cases import CASES, POOL_CASES, ROUTER, Case, HiDeCase, adapt, batch, hook_counts, trainable  # noqa: E402
from upstream_standins import C, D, E, Tiny  # noqa: E402

from fly_modules import SampleBudgetSchedule, SessionSchedule, _compat  # noqa: E402

VARIANTS = {"baseline": (False, False), "router": (True, False), "ensemble": (False, True), "both": (True, True)}


def build(case: Case):
    return case.build()


# ================================================================================== tests
@pytest.mark.parametrize("name", list(CASES))
def test_baseline_variant_is_bit_identical(name):
    case = CASES[name]
    model, original = build(case)
    reference = copy.deepcopy(model)
    before = hook_counts(model, original)
    adapt(case, model, original, router=False, ensemble=False)
    assert hook_counts(model, original) == before
    x, _ = batch()
    for mode in (True, False):
        model.train(mode), reference.train(mode)
        got, want = case.forward(model, original, x), case.forward(reference, original, x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _clusters(n: int, seed: int) -> Tuple[Tensor, Tensor]:
    direction = F.normalize(torch.randn(D, generator=torch.Generator().manual_seed(0)), dim=0)
    gen = torch.Generator().manual_seed(seed)
    return 0.1 * torch.randn(n, D, generator=gen) + 3 * direction, 0.1 * torch.randn(n, D, generator=gen) - 3 * direction


@pytest.mark.parametrize("name", list(CASES))
def test_router_picks_the_inference_selection_and_leaves_training_alone(name):
    case = CASES[name]
    model, original = build(case)
    reference = copy.deepcopy(model)
    handle = adapt(case, model, original, router=True, ensemble=False)
    x, _ = batch(n=4)
    model.train(), reference.train()
    got, want = case.forward(model, original, x), case.forward(reference, original, x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    handle.end_batch()
    assert handle.router.num_samples == 4
    handle.router.reset_statistics()
    expected = torch.tensor([0, 1, 1, 0])
    if case.craftable:
        zero, one = _clusters(16, seed=1)
        handle.router.update(zero, 0)
        handle.router.update(one, 1)
        probe_zero, probe_one = _clusters(2, seed=2)
        query = torch.stack([probe_zero[0], probe_one[0], probe_one[1], probe_zero[1]])
    else:
        features = case.router_features(model, original, x)
        handle.router.update(features, expected)
        query = None
        assert torch.equal(handle.router.route(features), expected)
    model.eval()
    _, selection = case.forward(model, original, x, query=query)
    case.check_routed(model, selection, expected, query if query is not None else features)


def assert_closed_form(ensemble, w0: Tensor, history: Dict[int, list]) -> None:
    for bank, weights in history.items():
        n = len(weights)
        for j, d in enumerate(ensemble.decays.tolist()):
            expected = d**n * w0 + sum((1 - d) * d ** (n - i) * w for i, w in enumerate(weights, start=1))
            torch.testing.assert_close(ensemble.ema_weight[bank, j], expected, rtol=0, atol=1e-6)
    assert any(history.values())


def _naive_scores(case, model, selection, features, handle, mask):
    ensemble = handle.ensemble
    banks = case.bank_of(selection, handle)
    scale = case.transform(model, selection)
    rows = []
    for b in range(features.shape[0]):
        f, bank = features[b], int(banks[b])
        members = torch.stack([ensemble.online(f)] + [
            ensemble.ema_weight[bank, j] @ f + ensemble.ema_bias[bank, j] for j in range(ensemble.num_decays)
        ])
        if scale is not None:
            members = members * scale[b]
        rows.append((members + mask).softmax(dim=-1).amax(dim=0).log())
    return torch.stack(rows)


@pytest.mark.parametrize("name", list(CASES))
def test_ensemble_training_logits_ema_closed_form_and_inference(name):
    case = CASES[name]
    model, original = build(case)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(trainable(model), lr=0.5)
    parent, attribute = case.head(model)
    head = getattr(parent, attribute)
    handle = adapt(case, model, original, router=False, ensemble=True, optimizer=optimizer)
    ensemble = handle.ensemble
    wrapper = getattr(parent, attribute)
    assert ensemble.online is head and wrapper is not head and wrapper.weight is head.weight
    assert set(model.state_dict()) == set(reference.state_dict())
    x, y = batch()
    model.train(), reference.train()
    got, want = case.forward(model, original, x), case.forward(reference, original, x)
    assert torch.equal(got[0], want[0])
    # EMA closed form: a bank trained at steps with online weights W_1..W_n holds
    # d^n W_0 + sum_i (1 - d) d^(n - i) W_i; the others still hold W_0
    w0 = ensemble.online.weight.detach().clone()
    history = {bank: [] for bank in range(ensemble.num_experts)}
    for _ in range(3):
        logits, selection = case.forward(model, original, x)
        loss = case.train_loss(model, logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for bank in torch.unique(case.bank_of(selection, handle)).tolist():
            history[bank].append(ensemble.online.weight.detach().clone())
    assert_closed_form(ensemble, w0, history)
    # inference: log of max over [online, copies of the sample's bank] of softmax(member + mask)
    captured = {}
    probe = wrapper.register_forward_pre_hook(lambda module, args: captured.setdefault("x", args[0]))
    mask = torch.zeros(C)
    mask[-1] = float("-inf")
    handle.set_logit_mask(mask)
    model.eval()
    scores, selection = case.forward(model, original, x)
    probe.remove()
    naive = _naive_scores(case, model, selection, captured["x"], handle, mask)
    torch.testing.assert_close(scores, naive)
    assert torch.isneginf(scores[:, -1]).all()


@pytest.mark.parametrize("name", list(CASES))
def test_undo_restores_modules_and_removes_every_hook(name):
    case = CASES[name]
    model, original = build(case)
    reference = copy.deepcopy(model)
    parent, attribute = case.head(model)
    head = getattr(parent, attribute)
    optimizer = torch.optim.Adam(trainable(model), lr=1e-3)
    before = hook_counts(model, original)
    handle = adapt(case, model, original, optimizer=optimizer)
    assert getattr(parent, attribute) is not head and len(_compat.step_post_hooks(optimizer)) == 1
    handle.remove()
    handle.remove()
    assert getattr(parent, attribute) is head and parent._modules[attribute] is head
    assert list(model.state_dict()) == list(reference.state_dict())  # the children's order too
    assert hook_counts(model, original) == before and len(_compat.step_post_hooks(optimizer)) == 0
    for module in model.modules():
        assert "forward" not in vars(module) and "forward_features" not in vars(module)
    x, _ = batch()
    for mode in (True, False):
        model.train(mode), reference.train(mode)
        assert torch.equal(case.forward(model, original, x)[0], case.forward(reference, original, x)[0])


def online_run(case: Case, router: bool, ensemble: bool) -> Tensor:
    model, original = build(case)
    optimizer = torch.optim.Adam(trainable(model), lr=1e-3)
    schedule = SessionSchedule(E) if case.schedule == "session" else SampleBudgetSchedule(16, E)
    handle = adapt(case, model, original, router=router, ensemble=ensemble, optimizer=optimizer, schedule=schedule)
    seen = torch.full((C,), float("-inf"))
    for session in range(2):
        handle.start_session(session)
        for step in range(2):
            x, y = batch(seed=10 * session + step, shift=2.0 * session)
            y = y % 3 + 2 * session
            seen[y] = 0
            model.train()
            for _ in range(2):
                logits, _ = case.forward(model, original, x, task=handle.current_expert)
                loss = case.train_loss(model, logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            # the baseline variant installs no hook: it needs the batch size for the sample budget
            handle.end_batch(x.shape[0] if not (router or ensemble) else None)
    assert handle.current_expert == 1
    if hasattr(model, "task_count"):
        assert model.task_count == 1
    if case.method == "misa":
        assert model.task_id == 1  # MISA's own step counter follows the schedule
    model.eval()
    handle.set_logit_mask(seen)
    logits, _ = case.forward(model, original, batch(seed=99)[0])
    if router:
        assert handle.router.num_samples == 32 and bool((handle.router.counts > 0).all())
    if ensemble:
        assert int(handle.ensemble.num_updates.sum()) > 0
        assert bool((logits.argmax(dim=1).unsqueeze(1) == (seen == 0).nonzero().squeeze(1)).any(dim=1).all())
    handle.remove()
    return logits


@pytest.mark.parametrize("name", list(CASES))
def test_online_run_in_every_variant(name):
    for variant, (router, ensemble) in VARIANTS.items():
        logits = online_run(CASES[name], router, ensemble)
        assert logits.shape == (8, C), variant
        assert not torch.isnan(logits).any(), variant


# ----------------------------------------------------- learners with a classifier pool, trained in eval mode
def _pool_learner_run(case, net, handle):
    """Two tasks of two batches each, as the learner runs them; the training losses."""
    losses = []
    for task in range(2):
        optimizer = case.start_task(net, task)
        if handle is not None:
            handle.start_expert(net.numtask - 1)  # the documented sync after the learner's own advance
        for step in range(2):
            x, y = batch(seed=10 * task + step, shift=2.0 * task)
            losses.append(case.train_step(net, handle, optimizer, x, y % 2))
    return losses


@pytest.mark.parametrize("name", list(POOL_CASES))
def test_a_pool_learner_training_in_eval_mode_is_unchanged_verified_and_restored(name):
    case = POOL_CASES[name]
    net = case.build()
    twin = copy.deepcopy(net)
    handle = generic.retrofit(net, **case.options(net), **ROUTER)
    assert _pool_learner_run(case, net, handle) == _pool_learner_run(case, twin, None)
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), twin.state_dict().values()))
    if case.router:
        assert handle.router.num_samples == 32 and bool((handle.router.counts > 0).all())
    report = handle.verify(batch(seed=5)[0], forward=case.verify_forward(net))
    assert report.ok, str(report)
    assert report["inference uses the ensemble"].ok is True
    assert report["training follows the current expert"].ok is True
    if case.router:
        assert report["router's training and inference queries match"].ok is True, str(report)
    x = batch(seed=6)[0]
    routed = case.evaluate(net, x)
    handle.remove()
    assert torch.equal(case.evaluate(net, x), case.evaluate(twin, x))
    assert routed.shape == case.evaluate(twin, x).shape


def test_s_prompts_interface_gets_each_samples_routed_domain():
    case = POOL_CASES["sprompts-sinet-generic"]
    net = case.build()
    twin = copy.deepcopy(net)
    handle = generic.retrofit(net, **{**case.options(net), "ensemble": False}, **ROUTER)
    _pool_learner_run(case, net, handle)
    _pool_learner_run(case, twin, None)
    x, expected = batch(seed=7, n=4)[0], torch.tensor([0, 1, 1, 0])
    handle.router.reset_statistics()
    with torch.no_grad():
        handle.router.update(net.image_encoder(x), expected)
    assert torch.equal(case.evaluate(net, x), case.evaluate(twin, x, selection=expected))
    assert handle.record.routed.tolist() == expected.tolist()
    handle.remove()


# ----------------------------------------------------------------------------- unknown structure
class Bare(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(D, C)


def test_unknown_structure_raises_seam_error_naming_the_attribute():
    cases = [
        ("l2p", Bare(), "`prompt`"),
        ("dualprompt", Bare(), "`e_prompt`"),
        ("misa", Bare(), "`e_prompt`"),
        ("mvp", Bare(), "`backbone`"),
        ("hide", Bare(), "`e_prompt`"),
        ("norga", Bare(), "`e_prompt`"),
    ]
    for method, model, attribute in cases:
        with pytest.raises(SeamError, match=r"generic\.retrofit") as info:
            retrofit(model, method, num_experts=E)
        assert attribute in str(info.value), (method, str(info.value))
        assert str(info.value).startswith(f"fly_modules.adapters.{method}:"), str(info.value)  # the method asked
    keyless = Bare()
    keyless.prompt = nn.Linear(2, 2)
    with pytest.raises(SeamError, match=r"prompt\.prompt_key"):
        retrofit(keyless, "l2p", num_experts=E)
    old_style = Bare()
    old_style.e_prompt = nn.Linear(2, 2)
    with pytest.raises(SeamError, match=r"prompt_idx"):
        retrofit(old_style, "hide", num_experts=E)
    with pytest.raises(SeamError, match="route_module"):
        generic.retrofit(Bare(), num_experts=E, query_module=nn.Identity())
    with pytest.raises(SeamError, match="head_name"):
        generic.retrofit(Bare(), num_experts=E, head_owner=Bare(), head_name="classifier", router=False)


def test_hide_router_needs_router_features():
    model, _ = HiDeCase().build()
    with pytest.raises(SeamError, match="original_model"):
        retrofit(model, "hide", num_experts=E)


def test_set_instance_attribute_undo_puts_modules_parameters_and_attributes_back():
    from fly_modules.adapters._handle import Retrofit
    from fly_modules.adapters._restore import Installation

    parent = Bare()
    parent.scale = 2.0
    head, weight = parent.head, parent.head.weight
    install = Installation()
    handle = Retrofit(parent, router=None, ensemble=None, schedule=None, start_method_expert=lambda e: None,
                      banks_of_expert=lambda e: [e], installation=install)
    install.set_attribute(parent, "head", nn.Identity())
    install.set_attribute(head, "weight", nn.Parameter(torch.zeros_like(weight)))
    install.set_attribute(parent, "scale", 3.0)
    install.set_attribute(parent, "forward", lambda x: x)
    assert isinstance(parent.head, nn.Identity) and parent.scale == 3.0 and "forward" in vars(parent)
    handle.remove()
    assert parent.head is head and parent._modules["head"] is head and "head" not in vars(parent)
    assert head.weight is weight and head._parameters["weight"] is weight
    assert parent.scale == 2.0 and "forward" not in vars(parent)
    with pytest.raises(ValueError, match=r"\(C,\) or \(B, C\)"):
        handle.set_logit_mask(torch.zeros(1, 2, 3))


# ------------------------------------------------------------------ handle safety (generic adapter)
def _tiny_retrofit(model: Tiny, **kwargs: Any):
    options = dict(num_experts=2, query_module=model.query, route_module=model.route, route_kwarg="expert",
                   expansion_dim=16, ridge=1.0)
    return generic.retrofit(model, **{**options, **kwargs})


def test_a_model_is_retrofitted_at_most_once_at_a_time():
    model = Tiny()
    head = model.head
    first = _tiny_retrofit(model)
    with pytest.raises(RuntimeError, match="already retrofitted"):
        _tiny_retrofit(model)
    _tiny_retrofit(copy.deepcopy(model)).remove()  # a copy is another model
    first.remove()
    assert model.head is head
    second = _tiny_retrofit(model)  # allowed again once the first is removed
    second.remove()
    assert model.head is head and not model.route._forward_pre_hooks and not model.query._forward_hooks


def _live_case(name: str):
    """``(model, original, wire)`` of a stand-in: ``wire()`` retrofits it the way its case does."""
    if name == "flygcl-coda-prompt":
        model = FlyGCLCodaPrompt()
        return model, None, lambda: retrofit(model, "coda_prompt", num_experts=2, **ROUTER)
    case = CASES[name]
    model, original = case.build()
    return model, original, lambda: adapt(case, model, original)


@pytest.mark.parametrize("name", [*CASES, "flygcl-coda-prompt"])
def test_a_second_retrofit_is_refused_as_already_retrofitted_before_any_seam_check(name):
    """Whatever the family and layout (FlyGCL's DualPrompt included, whose seam check would see the first
    retrofit's wrapper), the refusal names the live retrofit and remove(), and changes nothing."""
    model, original, wire = _live_case(name)
    first = wire()
    hooks, attributes = hook_counts(model, original), dict(vars(model))
    for again in (wire, lambda: retrofit(model, "generic", num_experts=E), lambda: retrofit(model, "l2p")):
        with pytest.raises(RuntimeError, match=r"already retrofitted.*handle\.remove\(\)"):
            again()
    assert hook_counts(model, original) == hooks and dict(vars(model)) == attributes and not first.removed
    first.remove()
    wire().remove()  # allowed again once the first is removed


def _installed_functions(model: nn.Module):
    """The hooks on ``model``'s modules and the functions or methods set on them as instance attributes."""
    return [value for module in model.modules() for value in
            [*module._forward_hooks.values(), *module._forward_pre_hooks.values(),
             *(v for v in vars(module).values() if isinstance(v, (types.FunctionType, types.MethodType)))]]


def forward(name: str, model: nn.Module, original, x: Tensor) -> None:
    if name == "flygcl-coda-prompt":
        model(x)
    else:
        CASES[name].forward(model, original, x)


@pytest.mark.parametrize("name", [*CASES, "flygcl-coda-prompt"])
def test_a_retrofitted_model_deep_copies_sharing_the_retrofits_functions(name):
    """After training and inference forwards, a deep copy shares every hook and wrapper (as it shares any
    function) instead of copying the family, its handle and the tensors a forward left there."""
    model, original, wire = _live_case(name)
    wire()
    x, _ = batch(n=4)
    for mode in (True, False):  # (no graph: the stand-ins keep some outputs, which deepcopy refuses with one)
        model.train(mode)
        with torch.no_grad():
            forward(name, model, original, x)
    copied = copy.deepcopy(model)
    mine_all, theirs_all = _installed_functions(model), _installed_functions(copied)
    pairs = list(zip(mine_all, theirs_all))
    assert len(mine_all) == len(theirs_all) and pairs and all(mine is theirs for mine, theirs in pairs)


@pytest.mark.parametrize("name", list(CASES))
def test_a_deep_copy_runs_the_original_model_once_the_retrofit_is_removed(name):
    """A deep copy made while retrofitted keeps the hooks, wrappers and ensembled head; after remove() they
    step aside (the installation decides, in one place) and the copy computes what the model computes."""
    case = CASES[name]
    model, original = case.build()
    handle = adapt(case, model, original)
    x, _ = batch(n=4)
    model.eval()
    with torch.no_grad():
        case.forward(model, original, x)  # the attributes a forward leaves on the model exist in the copy too
    copied = copy.deepcopy(model)
    handle.remove()
    with torch.no_grad():
        expected, _ = case.forward(model, original, x)
        logits, _ = case.forward(copied, original, x)
    assert torch.equal(logits, expected)


def test_a_failed_retrofit_leaves_the_model_as_it_was(monkeypatch):
    model = Tiny()
    head = model.head

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("seam failed half way")

    monkeypatch.setattr(Layout, "replace_head", broken)  # after the hooks are installed
    with pytest.raises(RuntimeError, match="half way"):
        _tiny_retrofit(model)
    monkeypatch.undo()
    assert model.head is head and not model.query._forward_hooks and not model.route._forward_pre_hooks
    _tiny_retrofit(model).remove()  # and it can be retrofitted afterwards


def test_expert_ids_are_checked_before_anything_changes():
    model = Tiny()
    with pytest.raises(ValueError, match="schedule starts 4 experts but only 2"):
        _tiny_retrofit(model, schedule=SampleBudgetSchedule(4, 4))
    handle = _tiny_retrofit(model)
    for bad in (-1, 2, True, 1.0):
        with pytest.raises(ValueError, match=r"\[0, 2\)"):
            handle.start_expert(bad)
        assert handle.current_expert == 0 and handle.ensemble.num_experts == 2
    handle.start_expert(torch.tensor(1))  # any integer index works
    assert handle.current_expert == 1


def test_a_rejected_router_update_keeps_the_batch():
    model = Tiny().train()
    handle = _tiny_retrofit(model, ensemble=False)
    model(torch.full((4, 4), float("nan")))  # NaN query features
    with pytest.raises(ValueError, match="NaN"):
        handle.end_batch()
    assert handle.record.query is not None and handle.router.num_samples == 0
    handle.discard_batch()
    model(torch.randn(4, 4))
    handle.end_batch()
    assert handle.router.num_samples == 4


def test_mvp_final_norm_router_features_cost_one_block_per_stream_batch():
    # With router_features="cls" and MVP's query before the last block, the router's feature needs that
    # block once more; only a stream batch's first training query feeds the router, so the later online
    # iterations must not run it again. Each training forward also runs the last block once, prompted.
    from upstream_standins import FlyGCLMVP

    model = FlyGCLMVP(use_last_layer=False)
    handle = retrofit(model, method="mvp", router=True, ensemble=False, expansion_dim=64, ridge=1.0)
    calls = []
    model.backbone.blocks[-1].register_forward_pre_hook(lambda module, args: calls.append(1))
    x, _ = batch(n=4)
    model.train()
    first_query = None
    for iteration in range(3):
        model(x)
        if iteration == 0:
            first_query = handle.record.query.clone()
    assert len(calls) == 3 + 1
    assert torch.equal(handle.record.query, first_query)  # later iterations left the router's query alone
    handle.end_batch()
    assert handle.router.num_samples == 4
    model(x)  # the next stream batch's first forward computes its feature again
    assert len(calls) == 4 + 2 and handle.record.query is not None
