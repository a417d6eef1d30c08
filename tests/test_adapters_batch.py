"""Batch independence: the JH-LEE prefix assembly that mixes a batch's samples (refused for routing,
corrected by ``correct_assembly=True``, left byte-identical without it) and ``verify()``'s check, which
must fail on a planted mixing defect."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

pytest.importorskip("timm")
from fly_modules.adapters import RetrofitOptions, SeamError, generic, retrofit  # noqa: E402
from fly_modules.adapters._assembly import correct_prefix_assembly, probe_assembly  # noqa: E402
from fly_modules.adapters._batch_independence import batch_independence, tolerance  # noqa: E402
from upstream_cases import ROUTER, batch, hook_counts  # noqa: E402
from upstream_standins import (  # noqa: E402
    E,
    HDPrefixModel,
    JLPrefixDualPrompt,
    JLPrefixEPrompt,
    Original,
    Tiny,
    hide_eval_forward,
    jhlee_forward,
)


def _twins(per_sample: bool = False):
    return JLPrefixDualPrompt(per_sample=per_sample), Original()


def _logits(model, original, x, task: int = 0) -> Tensor:
    with torch.no_grad():
        return jhlee_forward(model, original, x, task)["logits"]


def _alone(model, original, x) -> Tensor:
    return torch.cat([_logits(model, original, x[i:i + 1]) for i in range(len(x))])


def test_the_upstream_prefix_assembly_mixes_samples_and_the_correction_undoes_it():
    pool = JLPrefixEPrompt(pool_size=4, length=2, layers=2)
    fixed = JLPrefixEPrompt(pool_size=4, length=2, layers=2, per_sample=True)
    fixed.load_state_dict(pool.state_dict())
    x, mask = torch.randn(4, 3, 32), torch.tensor([[0], [1], [0], [1]])
    mixed = pool(x, prompt_mask=mask)["batched_prompt"]
    own = fixed(x, prompt_mask=mask)["batched_prompt"]
    assert not torch.equal(mixed, own)
    assert torch.equal(correct_prefix_assembly(mixed), own)  # pure data movement: bit for bit
    found = probe_assembly(pool)
    assert found.mixes and found.correctable and "JLPrefixEPrompt.forward" in found.detail
    assert not probe_assembly(fixed).mixes


def test_the_mixed_assembly_shows_on_the_model_even_with_one_slot_for_the_batch():
    model, original = _twins()
    model.eval()
    x, _ = batch(n=4)
    gap = (_logits(model, original, x) - _alone(model, original, x)).abs().max()
    assert gap > 100 * tolerance(_logits(model, original, x))  # the key half used as values, not rounding


def test_router_true_on_a_mixing_assembly_refuses_naming_the_function_and_the_option():
    model, original = _twins()
    hooks = hook_counts(model, original)
    with pytest.raises(SeamError, match=r"JLPrefixEPrompt\.forward assembles .* correct_assembly=True"):
        retrofit(model, "dualprompt", num_experts=E, **ROUTER)
    assert hook_counts(model, original) == hooks and "_fly_modules_retrofit" not in vars(model)


@pytest.mark.parametrize("ensemble", [False, True])
def test_router_false_without_the_option_leaves_upstream_byte_identical(ensemble):
    model, original = _twins()
    twin, _ = _twins()
    x, _ = batch(n=6)
    hooks = hook_counts(model.e_prompt)
    handle = retrofit(model, "dualprompt", num_experts=E, router=False, ensemble=ensemble)
    assert hook_counts(model.e_prompt)[0][0] == hooks[0][0] + (1 if ensemble else 0)  # only the bank observer
    model.eval(), twin.eval()
    if not ensemble:
        assert torch.equal(_logits(model, original, x), _logits(twin, original, x))
    model.train(), twin.train()
    assert torch.equal(_logits(model, original, x), _logits(twin, original, x))  # training: the online head
    handle.remove()


@pytest.mark.parametrize("router", [False, True])
def test_correct_assembly_gives_the_per_sample_model_for_every_variant_and_remove_restores_it(router):
    model, original = _twins()
    reference, _ = _twins(per_sample=True)
    mixed, _ = _twins()
    x, _ = batch(n=6)
    hooks = hook_counts(model, original)
    handle = retrofit(model, "dualprompt", num_experts=E, router=router, ensemble=False, correct_assembly=True,
                      **ROUTER)
    for mode in (True, False):
        for m in (model, reference, mixed):
            m.train(mode)
        assert torch.equal(_logits(model, original, x), _logits(reference, original, x))  # unrouted: no router data
    handle.remove()
    assert hook_counts(model, original) == hooks
    for mode in (True, False):
        model.train(mode), mixed.train(mode)
        assert torch.equal(_logits(model, original, x), _logits(mixed, original, x))


def test_routed_mixed_experts_reach_each_sample_intact_with_the_option():
    model, original = _twins()
    handle = retrofit(model, "dualprompt", num_experts=E, correct_assembly=True, **ROUTER)
    x, _ = batch(n=4)
    model.eval()

    def routed(rows: Tensor, experts: Tensor) -> Tensor:
        with handle.forcing(experts):
            return _logits(model, original, x[rows])

    checks = batch_independence(routed, 4, E)
    assert [c.ok for c in checks] == [True, True], checks
    together = routed(torch.arange(4), torch.tensor([0, 1, 0, 1]))
    assert not torch.allclose(together[0], routed(torch.tensor([0]), torch.tensor([1]))[0])  # the expert acts
    handle.remove()


def _verify(model, original, handle, x):
    def forward(images):
        return jhlee_forward(model, original, images, handle.current_expert)["logits"]

    return handle.verify(x, forward=forward)


def test_verify_passes_with_the_option_and_fails_on_the_upstream_mixed_assembly():
    model, original = _twins()
    handle = retrofit(model, "dualprompt", num_experts=E, correct_assembly=True, **ROUTER)
    report = _verify(model, original, handle, batch(n=6)[0])
    assert report.ok, str(report)
    assert report["batch independence, mixed experts"].ok and report["batch independence, one expert"].ok
    assert "correct_assembly=True" in report["training outputs unchanged"].detail
    handle.remove()

    model, original = _twins()  # the planted defect: the upstream assembly, kept by router=False
    handle = retrofit(model, "dualprompt", num_experts=E, router=False)
    report = _verify(model, original, handle, batch(n=6)[0])
    assert not report.ok and report["batch independence"].ok is False, str(report)
    assert "correct_assembly=True" in report["batch independence"].detail


class _MixingRoute(nn.Module):
    """A route module that adds the batch mean: a mixing defect no probe of ours knows."""

    def forward(self, x: Tensor, expert: Tensor = None) -> Tensor:
        shift = 0 if expert is None else expert.to(x.dtype).unsqueeze(1)
        return x + shift + x.mean(dim=0, keepdim=True)


def test_verify_fails_on_a_routed_model_that_mixes_samples():
    model = Tiny(route=_MixingRoute())
    handle = generic.retrofit(model, num_experts=2, query_module=model.query, route_module=model.route,
                              route_kwarg="expert", head_owner=model, head_name="head", **ROUTER)
    report = handle.verify(torch.randn(4, 4))
    assert report["batch independence, mixed experts"].ok is False
    assert report["batch independence, one expert"].ok is False
    handle.remove()

    clean = Tiny()
    handle = generic.retrofit(clean, num_experts=2, query_module=clean.query, route_module=clean.route,
                              route_kwarg="expert", head_owner=clean, head_name="head", **ROUTER)
    report = handle.verify(torch.randn(4, 4))
    assert report["batch independence, mixed experts"].ok and report["batch independence, one expert"].ok
    handle.remove()


def test_the_option_is_a_common_option_checked_like_the_others():
    assert "correct_assembly" in RetrofitOptions.names()
    with pytest.raises(ValueError, match="correct_assembly"):
        retrofit(Tiny(), "generic", num_experts=2, router=False, correct_assembly="yes")


def test_tolerance_scales_with_the_outputs():
    small, large = torch.ones(3), torch.full((3,), 1e3)
    assert tolerance(large) == pytest.approx(1e3 * tolerance(small))
    assert tolerance(torch.tensor([float("-inf"), 0.5])) == tolerance(torch.ones(1))


@pytest.mark.parametrize("method", ["hide", "norga"])
def test_hide_and_norga_prefix_pools_refuse_routing_and_verify_with_the_option(method):
    model, original = HDPrefixModel(gated=method == "norga"), Original()
    with pytest.raises(SeamError, match=r"HDPrefixEPrompt\.forward assembles .* correct_assembly=True"):
        retrofit(model, method, original_model=original, **ROUTER)
    handle = retrofit(model, method, original_model=original, correct_assembly=True, **ROUTER)
    report = handle.verify(batch(n=4)[0], forward=lambda x: hide_eval_forward(model, original, x, handle.current_expert)
                           if not model.training else model(x, task_id=handle.current_expert, train=True))
    assert report["batch independence, mixed experts"].ok and report["batch independence, one expert"].ok, str(report)
    assert report.ok, str(report)
    handle.remove()
