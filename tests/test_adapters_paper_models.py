"""The paper's own retrofit targets in FlyGCL (S-Prompts, the HiDe-Prompt / NoRGa port), on stand-ins
that reproduce their signatures (``upstream_standins``, ``flygcl_standins``): per-sample routing that reaches
every sample intact, the loop's calls, and what the adapters refuse."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("timm")
from fly_modules.adapters import EnsembleLinear, SeamError, retrofit  # noqa: E402
from flygcl_standins import (  # noqa: E402
    FlyGCLCodaPrompt,
    FlyGCLExpertModel,
    FlyGCLPrefixModel,
    FlyGCLSDLoRA,
    FlyGCLSPrompt,
    prefix_alignment_step,
    prefix_eval_forward,
    sprompt_eval_forward,
)
from upstream_cases import CASES, ROUTER, batch, trainable  # noqa: E402
from upstream_standins import C, Original  # noqa: E402

from benchmarks.upstream.observe import forced_route  # noqa: E402
from fly_modules import InvalidParameterError, SampleBudgetSchedule  # noqa: E402

NAMES = ["flygcl-sprompt", "flygcl-hide", "flygcl-norga", "flygcl-hide-lora", "flygcl-hide-adapter"]
MIXED = torch.tensor([0, 1, 0, 1])


def routed_model(name: str):
    """A retrofitted stand-in whose router sends the 4 samples of ``batch(n=4)`` to experts [0, 1, 0, 1]."""
    case = CASES[name]
    model, _ = case.build()
    with torch.no_grad():  # experts that differ (a fresh expert starts as a copy of the others' mean)
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(4)))
    handle = retrofit(model, case.method, **{**ROUTER, "ridge": 1e-6})
    x, _ = batch(n=4)
    handle.router.update(case.router_features(model, None, x), MIXED)
    model.eval()
    return case, model, handle, x


@pytest.mark.parametrize("name", NAMES)
def test_mixed_experts_reach_each_sample_as_if_alone(name):
    case, model, handle, x = routed_model(name)
    with torch.no_grad():
        together, used = case.forward(model, None, x)
        assert torch.equal(used, MIXED) and torch.equal(handle.record.routed, MIXED)
        alone = torch.cat([case.forward(model, None, x[i : i + 1])[0] for i in range(4)])
        torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)
        # the experts really differ: the same samples all on expert 0 give other outputs
        with forced_route(handle, 0):
            forced = case.forward(model, None, x)[0]
    assert (forced[1] - together[1]).abs().max() > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_one_expert_batch_equals_its_samples_one_by_one(name):
    case, model, handle, x = routed_model(name)
    with torch.no_grad(), forced_route(handle, 1):
        together, used = case.forward(model, None, x)
        alone = torch.cat([case.forward(model, None, x[i : i + 1])[0] for i in range(4)])
    assert used.tolist() == [1] * 4
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_verify_passes_through_the_loops_calls(name):
    case = CASES[name]
    model, _ = case.build()
    optimizer = torch.optim.Adam(trainable(model), lr=1e-2)
    handle = retrofit(model, case.method, optimizer=optimizer, **ROUTER)
    x, y = batch()
    for expert in range(2):
        handle.start_expert(expert)
        model.train()
        logits, _ = case.forward(model, None, x, task=expert)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(logits, y).backward()
        optimizer.step()
        handle.end_batch()

    def forward(images):
        return case.forward(model, None, images, task=handle.current_expert)[0]

    report = handle.verify(x, forward=forward)
    assert report.ok, str(report)


def test_sprompt_schedule_moves_task_count_and_its_prompt_start():
    model = FlyGCLSPrompt()
    optimizer = torch.optim.Adam(trainable(model), lr=1e-2)
    handle = retrofit(model, "sprompt", optimizer=optimizer, schedule=SampleBudgetSchedule(8, 2), **ROUTER)
    x, y = batch()
    model.train()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    handle.end_batch()
    assert model.task_count == 1 and handle.current_expert == 1
    # process_task_count() started expert 1 from the mean of the earlier prompts, as FlyGCL does
    torch.testing.assert_close(model.experts.prompts[:, 1], model.experts.prompts[:, :1].mean(1))
    model.train()
    model(x)
    assert model.experts.last_expert_ids.tolist() == [1] * 8


def test_sprompt_router_off_keeps_the_loops_expert_ids():
    model = FlyGCLSPrompt()
    handle = retrofit(model, "sprompt", router=False, ensemble=True)
    model.eval()
    sprompt_eval_forward(model, batch(n=3)[0])
    assert model.experts.last_expert_ids.tolist() == [0, 0, 0]
    handle.remove()


def test_sprompt_refuses_a_model_without_expert_ids():
    class NoExpertIds(FlyGCLSPrompt):
        def forward(self, inputs, **kwargs):
            return super().forward(inputs)

    with pytest.raises(SeamError, match="expert_ids"):
        retrofit(NoExpertIds(), "sprompt")
    with pytest.raises(InvalidParameterError, match="num_experts=3"):
        retrofit(FlyGCLSPrompt(), "sprompt", num_experts=3)


def test_prefix_layout_classifier_alignment_reaches_the_online_head():
    """FlyGCL's task end trains prompt_head directly with the model in eval mode: the online head
    answers there (the ensemble only inside forward_prompt), and a schedule may run it from end_batch."""
    model = FlyGCLPrefixModel()
    reference = FlyGCLPrefixModel()
    handle = retrofit(model, "hide", schedule=SampleBudgetSchedule(8, 2),
                      start_expert=lambda expert: prefix_alignment_step(model), **ROUTER)
    x, _ = batch()
    model.train()
    prefix_eval_forward(model, x)  # in training mode: both branches, the router's query recorded
    handle.end_batch()  # starts expert 1: the alignment step runs here, with autograd
    prefix_alignment_step(reference)
    assert handle.current_expert == 1
    assert torch.equal(model.prompt_head.weight, reference.prompt_head.weight)
    model.eval()
    scores = prefix_eval_forward(model, x)
    probabilities = scores.exp()  # the ensemble's answer: log of the element-wise max of its members' softmaxes
    assert (probabilities <= 1 + 1e-6).all() and (probabilities.sum(1) >= 1 - 1e-6).all()


def test_prefix_layout_routes_on_the_gate_and_refuses_other_query_options():
    with pytest.raises(InvalidParameterError, match="gate features"):
        retrofit(FlyGCLPrefixModel(), "hide", original_model=Original())
    model = FlyGCLPrefixModel(gated=True)
    handle = retrofit(model, "norga", **ROUTER)
    x, _ = batch(n=4)
    handle.router.update(CASES["flygcl-norga"].router_features(model, None, x), MIXED)
    model.eval()
    with torch.no_grad():
        model.forward_prompt(x, task_id=0)  # no gate call first: the adapter runs the gate itself
    assert model.backbone.last_task_ids.tolist() == handle.router.route(
        CASES["flygcl-norga"].router_features(model, None, x)).tolist()
    assert model.prompt_head.out_features == C


# ------------------------------------------------------------------------------------- CODA-Prompt
def coda_model():
    model = FlyGCLCodaPrompt()
    model.process_task_count()  # two tasks' blocks in the window
    return model


def test_coda_routed_task_gets_its_component_window_sample_by_sample():
    model, reference = coda_model(), coda_model()
    handle = retrofit(model, "coda_prompt", **{**ROUTER, "ridge": 1e-6})
    x, _ = batch(n=4)
    with torch.no_grad():
        features = model.backbone.forward_features(x)[:, 0]
    handle.router.update(features, MIXED)
    model.eval(), reference.eval()
    with torch.no_grad():
        together = model(x)
        assert torch.equal(handle.record.routed, MIXED) and model.task_count == 1
        alone = torch.cat([model(x[i : i + 1]) for i in range(4)])
        windows = []
        for i, expert in enumerate(MIXED.tolist()):  # the model itself with the expert's window
            reference.task_count = expert
            windows.append(reference(x[i : i + 1]))
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)
    # ensemble members are the online head's copies: before any EMA step the log of its softmax
    torch.testing.assert_close(together, torch.cat(windows).log_softmax(1), rtol=0, atol=1e-5)
    assert (windows[0] - reference(x[:1])).abs().max() > 1e-4  # task 0's window differs from task 1's


def test_coda_training_unchanged_schedule_moves_task_count_and_remove_restores():
    model, reference = FlyGCLCodaPrompt(), FlyGCLCodaPrompt()
    optimizer = torch.optim.SGD(trainable(model), lr=0.1)
    handle = retrofit(model, "coda_prompt", optimizer=optimizer, schedule=SampleBudgetSchedule(8, 2), **ROUTER)
    x, y = batch()
    model.train(), reference.train()
    logits, _ = model(x)
    assert torch.equal(logits, reference(x)[0])
    torch.nn.functional.cross_entropy(logits, y).backward()
    optimizer.step()
    handle.end_batch()
    assert model.task_count == 1 and handle.current_expert == 1 and handle.router.num_samples == 8
    report = handle.verify(x, forward=lambda images: model(images)[0] if model.training else model(images))
    assert report.ok, str(report)
    handle.remove()
    assert "forward" not in vars(model) and not isinstance(model.backbone.fc, EnsembleLinear)


def test_coda_refuses_a_pool_too_small_for_its_tasks():
    with pytest.raises(InvalidParameterError, match="the pool holds 4"):
        retrofit(FlyGCLCodaPrompt(), "coda_prompt", num_experts=3)


def test_coda_refuses_the_separate_prompt_module_layout_with_its_reason():
    class CodaModule(torch.nn.Module):  # Mammoth / PILOT: forward(x_querry, l, x_block, train=False, task_id=None)
        task_count = 0

        def forward(self, x_querry, l, x_block, train=False, task_id=None):  # noqa: E741  (the upstream name)
            return None, 0, x_block

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.prompt, self.last = CodaModule(), torch.nn.Linear(4, 2)

    with pytest.raises(SeamError, match="separate `prompt` module.*not implemented"):
        retrofit(Net(), "coda_prompt")


@pytest.mark.parametrize("name", ["flygcl-hide", "flygcl-norga", "flygcl-hide-lora", "flygcl-hide-adapter"])
def test_prefix_layout_ensembles_each_call_with_its_own_routed_banks(name):
    """The ensemble head answers inside ``forward_prompt``: its banks are those of that call. Banks recorded
    after the call reached the next call of the same size instead (the first sample's banks went to the
    second sample, ...), so the order of the calls changed the outputs."""
    case, model, handle, x = routed_model(name)
    with torch.no_grad():
        ema = handle.ensemble.ema_weight
        ema.add_(torch.randn(ema.shape, generator=torch.Generator().manual_seed(5), dtype=ema.dtype))  # banks differ
        forwards = torch.cat([case.forward(model, None, x[i : i + 1])[0] for i in range(4)])
        backwards = torch.cat([case.forward(model, None, x[i : i + 1])[0] for i in reversed(range(4))]).flip(0)
        together = case.forward(model, None, x)[0]
        again = case.forward(model, None, x)[0]
    torch.testing.assert_close(forwards, backwards, rtol=0, atol=1e-5)
    torch.testing.assert_close(together, forwards, rtol=0, atol=1e-5)
    torch.testing.assert_close(again, together, rtol=0, atol=1e-5)


# ----------------------------------------------------------------- HiDe-LoRA / HiDe-Adapter, SD-LoRA
@pytest.mark.parametrize("adapter", [False, True])
def test_expert_models_route_on_the_class_token_without_a_gate_call(adapter):
    with pytest.raises(InvalidParameterError, match="class token"):
        retrofit(FlyGCLExpertModel(adapter), "hide", original_model=Original())
    with pytest.raises(InvalidParameterError, match="run_query_module=True"):
        retrofit(FlyGCLExpertModel(adapter), "hide", run_query_module=False)
    model = FlyGCLExpertModel(adapter)
    handle = retrofit(model, "hide", **{**ROUTER, "ridge": 1e-6})
    x, _ = batch(n=4)
    with torch.no_grad():
        features = model.backbone.forward_features(x)[:, 0]
    handle.router.update(features, MIXED)
    model.eval()
    with torch.no_grad():
        model.forward_prompt(x, task_id=0)  # no gate call: the retrofit computes the class token
    assert model.experts.last_expert_ids.tolist() == MIXED.tolist() == handle.record.routed.tolist()
    handle.remove()
    assert "forward_prompt" not in vars(model)
    model.forward_prompt(x, task_id=0)
    assert model.experts.last_expert_ids.tolist() == [0] * 4


def sdlora_step(model, optimizer, x, y):
    model.train()
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def test_sdlora_refuses_the_router_with_its_reason():
    with pytest.raises(SeamError, match="combines every task's LoRA directions for every sample.*router=False"):
        retrofit(FlyGCLSDLoRA(), "sdlora")
    with pytest.raises(SeamError, match="process_task_count"):
        retrofit(torch.nn.Sequential(torch.nn.Linear(3, 3)), "sdlora", router=False)


def test_sdlora_ensemble_trains_the_current_tasks_bank_and_verifies():
    model, reference = FlyGCLSDLoRA(), FlyGCLSDLoRA()
    optimizer = torch.optim.SGD(trainable(model), lr=0.5)
    handle = retrofit(model, "sdlora", router=False, optimizer=optimizer, schedule=SampleBudgetSchedule(8, 2))
    ensemble = handle.ensemble
    assert isinstance(model.backbone.fc, EnsembleLinear) and ensemble.num_experts == 2
    x, y = batch()
    model.train(), reference.train()
    assert torch.equal(model(x), reference(x))
    untouched = ensemble.ema_weight[1].clone()
    sdlora_step(model, optimizer, x, y)
    assert torch.equal(ensemble.ema_weight[1], untouched)  # only task 0's bank moved
    assert not torch.equal(ensemble.ema_weight[0], untouched)
    handle.end_batch()  # the schedule starts task 1: process_task_count() moved task_count
    assert model.task_count == 1 and handle.current_expert == 1 and ensemble.active_expert == 1
    moved = ensemble.ema_weight[0].clone()
    sdlora_step(model, optimizer, x, y)
    assert torch.equal(ensemble.ema_weight[0], moved) and not torch.equal(ensemble.ema_weight[1], untouched)
    model.eval()
    with torch.no_grad():
        model(x)
    assert handle.record.ensembled.tolist() == [1] * 8
    report = handle.verify(x)
    assert report.ok, str(report)
    keys = set(model.state_dict())
    handle.remove()
    assert set(model.state_dict()) == keys and not isinstance(model.backbone.fc, EnsembleLinear)
    assert not model._forward_pre_hooks
