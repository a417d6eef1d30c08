"""``handle.verify(batch)`` and the never-silent checks, on the stand-ins; the three failures of the
Si-Blurry DualPrompt, MISA and NoRGa pairs are reproduced and must be caught."""

from __future__ import annotations

import copy
from typing import Any, Dict

import pytest
import torch
from torch import Tensor, nn

pytest.importorskip("timm")
from fly_modules.adapters import SeamError, _family, generic, retrofit  # noqa: E402
from upstream_cases import CASES, ROUTER, adapt, batch, hook_counts, trainable  # noqa: E402
from upstream_standins import (  # noqa: E402
    E,
    HDModel,
    MISADualPrompt,
    Original,
    SiBlurryDualPrompt,
    Tiny,
    UnnamedRoute,
    norga_train_forward,
)

from fly_modules import SampleBudgetSchedule, SessionSchedule, _compat  # noqa: E402


def _state(model: nn.Module, handle, optimizer) -> Dict[str, Any]:
    """Everything verify() must leave as it was, compared bit for bit."""
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "ids": [id(p) for p in model.parameters()],
        "modes": [m.training for m in model.modules()],
        "attributes": {k: v for m in model.modules() for k, v in vars(m).items() if isinstance(v, (int, float))},
        "handle": {k: (v.clone() if isinstance(v, Tensor) else copy.deepcopy(v)) for k, v in _flat(handle.state_dict())},
        "record": {k: (v.clone() if isinstance(v, Tensor) else v) for k, v in vars(handle.record).items()},
        "optimizer": {k: (v.clone() if isinstance(v, Tensor) else v) for k, v in _flat(optimizer.state_dict())},
        "hooks": hook_counts(model),
        "rng": torch.random.get_rng_state(),
    }


def _flat(tree: Any, prefix: str = ""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flat(value, f"{prefix}{key}.")
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _flat(value, f"{prefix}{i}.")
    else:
        yield prefix, tree


def _same(a: Dict[str, Any], b: Dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        left, right = a[key], b[key]
        if isinstance(left, dict):
            assert left.keys() == right.keys(), key
            for name in left:
                x, y = left[name], right[name]
                assert (torch.equal(x, y) if isinstance(x, Tensor) else x == y), (key, name)
        elif isinstance(left, Tensor):
            assert torch.equal(left, right), key
        elif key == "grads":
            assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(left, right)), key
        else:
            assert left == right, key


def _trained(case, model, original, handle, optimizer, steps: int = 2):
    """A few batches of the case's loop, so that the router, the banks and the optimizer hold state."""
    for step in range(steps):
        x, y = batch(seed=step)
        model.train()
        logits, _ = case.forward(model, original, x, task=handle.current_expert)
        loss = case.train_loss(model, logits, y % logits.shape[-1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        handle.end_batch()


@pytest.mark.parametrize("name", list(CASES))
def test_verify_passes_and_leaves_model_optimizer_and_handle_exactly_as_before(name):
    case = CASES[name]
    model, original = case.build()
    optimizer = torch.optim.Adam(trainable(model), lr=1e-3)
    handle = adapt(case, model, original, optimizer=optimizer)
    _trained(case, model, original, handle, optimizer)
    model.eval()
    before = _state(model, handle, optimizer)

    def forward(x):
        return case.forward(model, original, x, task=handle.current_expert)[0]

    report = handle.verify(batch(seed=5)[0], forward=forward)
    assert report.ok, str(report)
    assert report["remove() restores the model"].ok and report["training outputs unchanged"].ok
    assert report["router receives queries"].ok and report["forcing each expert changes the logits"].ok
    assert report["ensemble banks move after an optimizer step"].ok and report["inference uses the ensemble"].ok
    _same(before, _state(model, handle, optimizer))
    text = str(report)
    assert "all checks passed" in text and "[ok  ] remove() restores the model" in text
    # and the model still works as retrofitted
    logits, _ = case.forward(model, original, batch(seed=6)[0])
    assert torch.isfinite(logits[torch.isfinite(logits)]).all()


def test_verify_raises_only_when_asked():
    model = SiBlurryDualPrompt()
    handle = generic.retrofit(model, num_experts=E, router=False, head_owner=model.backbone, head_name="head",
                              **ROUTER)
    model.backbone.head = nn.Linear(32, 5)  # the model no longer uses the wrapped classifier
    report = handle.verify(batch()[0])
    assert not report.ok and report["inference uses the ensemble"].ok is False
    with pytest.raises(RuntimeError, match="inference uses the ensemble"):
        handle.verify(batch()[0], strict=True)


# ------------------------------------------------------------------------- 1. Si-Blurry DualPrompt
def test_siblurry_dualprompt_cannot_be_routed_and_says_why():
    model = SiBlurryDualPrompt()
    with pytest.raises(SeamError, match=r"KeyPool\.forward\(query.*\*\*kwargs.*swallow.*generic\.retrofit"):
        retrofit(model, "dualprompt", **ROUTER)
    with pytest.raises(SeamError, match=r"\*\*kwargs"):
        generic.retrofit(model, num_experts=E, query_module=model.backbone.norm, route_module=model.e_prompt,
                         route_kwarg="s", head_owner=model.backbone, head_name="head")
    assert not model.e_prompt._forward_pre_hooks and "_fly_modules_retrofit" not in vars(model)


def test_siblurry_dualprompt_ensemble_only_trains_unchanged_and_verifies():
    model = SiBlurryDualPrompt()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(trainable(model), lr=0.1)
    handle = retrofit(model, "dualprompt", router=False, optimizer=optimizer)
    x, y = batch()
    model.train(), reference.train()
    assert torch.equal(model(x), reference(x))
    selected = (model.used_prompts[:, 0].flatten(1).unsqueeze(1) == model.e_prompt.prompts.detach().flatten(1)
                .unsqueeze(0)).all(-1).float().argmax(1)
    assert torch.equal(handle.record.trained_banks, selected)  # one bank per prompt: the prompt trained
    report = handle.verify(x)
    assert report.ok, str(report)
    assert report["training follows the current expert"].ok is None  # no prompt belongs to a step


def test_verify_catches_a_routed_value_the_model_swallows(monkeypatch):
    # Forced past the signature check, the Si-Blurry wiring of the old adapter: `s` lands in **kwargs.
    monkeypatch.setattr(_family, "require_keyword", lambda *args, **kwargs: None)
    model = SiBlurryDualPrompt()
    handle = generic.retrofit(
        model, num_experts=E, query_module=model.backbone.norm, query_from_output=lambda out: out[:, 0],
        route_module=model.e_prompt, route_kwarg="s", route_value=lambda experts, *rest: int(experts[0]),
        head_owner=model.backbone, head_name="head", **ROUTER,
    )
    report = handle.verify(batch()[0])
    check = report["forcing each expert changes the logits"]
    assert check.ok is False and "ignores the routed value" in check.detail
    assert "FAIL" in str(report)


# ----------------------------------------------------------------------------------------- 2. MISA
def test_misa_slice_local_prompts_refuse_routing_with_the_reason():
    model = MISADualPrompt()
    before = model.e_prompt.counter.clone()
    with pytest.raises(SeamError, match=r"^fly_modules\.adapters\.misa: .*prompts\[i - s\].*kangzhiq/MISA.*router=False"):
        retrofit(model, "misa", **ROUTER)
    assert torch.equal(model.e_prompt.counter, before) and model.e_prompt.training  # the probe left no trace
    assert "forward" not in vars(model.e_prompt)


@pytest.mark.parametrize("fixed_gather", [False, True])
def test_misa_schedule_moves_its_own_task_id(fixed_gather):
    model = MISADualPrompt(fixed_gather=fixed_gather)
    optimizer = torch.optim.SGD(trainable(model), lr=0.1)
    extra = ROUTER if fixed_gather else dict(router=False)
    handle = retrofit(model, "misa", optimizer=optimizer, schedule=SampleBudgetSchedule(8, E), **extra)
    trained = []
    for step in range(3):
        x, y = batch(seed=step)
        model.train()
        loss = model.loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trained.append(sorted(set(handle.record.trained_banks.tolist())))
        handle.end_batch()
    assert handle.current_expert == 1 and model.task_id == 1
    assert trained[0][0] in (0, 1) and all(slot in (2, 3) for slot in trained[1] + trained[2])  # step 1's slots


def test_misa_loop_advancing_task_id_behind_the_retrofit_is_an_error():
    model = MISADualPrompt()
    handle = retrofit(model, "misa", router=False, ensemble=False)
    model.train()
    model(batch()[0])
    model.online_after_task()  # MISA's trainer: model.task_id += 1 at a task end
    with pytest.raises(RuntimeError, match=r"task_id is 1 but the retrofit's current expert is 0.*start_expert"):
        handle.end_batch()
    handle.start_expert(model.task_id)  # the documented sync
    handle.end_batch()


def test_verify_catches_a_step_counter_the_schedule_does_not_move():
    model = MISADualPrompt()
    handle = retrofit(model, "misa", router=False, start_expert=lambda expert: None)  # skips MISA's task_id
    report = handle.verify(batch()[0])
    check = report["training follows the current expert"]
    assert check.ok is False and "after start_expert(1) the model trained the prompts of expert(s) [0]" in check.detail
    assert model.task_id == 0 and handle.current_expert == 0


# ---------------------------------------------------------------------------------------- 3. NoRGa
def _norga_batches(model, handle, optimizer, steps: int = 2) -> None:
    for step in range(steps):
        x, y = batch(seed=step)
        model.train()
        out = norga_train_forward(model, x, task_id=handle.current_expert)
        loss = torch.nn.functional.cross_entropy(out["logits"], y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        handle.end_batch()


def test_norga_loop_feeds_the_router_without_running_original_model():
    model, original = HDModel(gated=True), Original()
    calls = []
    original.register_forward_hook(lambda *args: calls.append(1))
    optimizer = torch.optim.Adam(trainable(model), lr=1e-3)
    handle = retrofit(model, "norga", original_model=original, optimizer=optimizer, **ROUTER)
    _norga_batches(model, handle, optimizer)
    assert handle.router.num_samples == 16 and len(calls) == 2  # once per stream batch, not per iteration


def test_norga_without_the_query_run_fails_loudly_and_verify_says_so():
    model, original = HDModel(gated=True), Original()
    optimizer = torch.optim.Adam(trainable(model), lr=1e-3)
    handle = retrofit(model, "norga", original_model=original, optimizer=optimizer, run_query_module=False, **ROUTER)
    x = batch()[0]
    report = handle.verify(x, forward=lambda images: norga_train_forward(model, images, handle.current_expert)
                           if model.training else model(images, prompt_id=torch.zeros(len(images), 1).long()))
    check = report["router receives queries"]
    assert check.ok is False and "Original" in check.detail
    with pytest.raises(RuntimeError, match=r"no query features were recorded.*Original"):
        _norga_batches(model, handle, optimizer, steps=1)


def test_hide_batchwise_prompt_is_refused_for_routing():
    model, original = HDModel(), Original()
    model.e_prompt.batchwise_prompt = True
    with pytest.raises(SeamError, match="batchwise_prompt"):
        retrofit(model, "hide", original_model=original, **ROUTER)
    retrofit(model, "hide", original_model=original, router=False).remove()


# ------------------------------------------------------------------------------- never silent
def test_a_route_keyword_the_module_does_not_name_is_refused():
    model = Tiny(UnnamedRoute())
    with pytest.raises(SeamError, match=r"`expert=` to UnnamedRoute\.forward\(x.*\).*does not take it"):
        generic.retrofit(model, num_experts=2, query_module=model.query, route_module=model.route, route_kwarg="expert")
    assert not model.route._forward_pre_hooks and not model.query._forward_hooks


def test_end_batch_without_a_query_names_the_fix():
    model, original = HDModel(), Original()
    handle = retrofit(model, "hide", original_model=original, run_query_module=False, **ROUTER)
    model.train()
    model(batch()[0], task_id=0, prompt_id=torch.zeros(8, 1).long(), train=True)
    with pytest.raises(RuntimeError, match=r"a training forward ran.*Original.*end_batch\(query=features\)"):
        handle.end_batch()
    handle.discard_batch()
    with pytest.raises(RuntimeError, match="no training forward was seen"):
        handle.end_batch()
    handle.end_batch(query=torch.randn(8, 32))  # the explicit query is the other documented way
    assert handle.router.num_samples == 8


def test_a_recreated_optimizer_is_followed_and_a_missing_one_warns():
    model, original = HDModel(), Original()
    first = torch.optim.SGD(trainable(model), lr=0.1)
    handle = retrofit(model, "hide", original_model=original, optimizer=first, schedule=SessionSchedule(E), **ROUTER)
    unrelated = torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1)

    def step(optimizer):
        x, y = batch()
        model.train()
        out = model(x, task_id=handle.current_expert, prompt_id=torch.zeros(8, 1).long(), train=True)
        loss = torch.nn.functional.cross_entropy(out["logits"], y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step(first)
    unrelated.step()  # an optimizer that does not train the classifier changes nothing
    assert int(handle.ensemble.num_updates.sum()) == 1 and handle.optimizer is first
    second = torch.optim.SGD(trainable(model), lr=0.1)  # the JH-LEE / HiDe loops re-create it per task
    step(second)
    handle.end_batch()
    assert int(handle.ensemble.num_updates.sum()) == 2 and handle.optimizer is second
    assert not _compat.step_post_hooks(first) and len(_compat.step_post_hooks(second)) == 1
    task = handle.current_expert  # verify() starts experts: the task id must follow the handle, as in the loop
    report = handle.verify(batch()[0], forward=lambda x: model(x, task_id=handle.current_expert, train=model.training,
                                                               prompt_id=torch.full((len(x), 1), task)))
    assert report.ok, str(report)
    assert handle.optimizer is second and len(_compat.step_post_hooks(second)) == 1
    handle.remove()
    assert not _compat.step_post_hooks(second)
    step(second)
    assert int(handle.ensemble.num_updates.sum()) == 2

    bare = retrofit(HDModel(), "hide", router=False)  # no optimizer given and none called
    step_model = bare.model
    x, y = batch()
    step_model.train()
    torch.nn.functional.cross_entropy(step_model(x, task_id=0, prompt_id=torch.zeros(8, 1).long(), train=True)
                                      ["logits"], y).backward()
    torch.optim.SGD(step_model.parameters(), lr=0.1).step()  # the loop's own optimizer, unknown to the retrofit
    with pytest.warns(RuntimeWarning, match=r"EMA copies did not move.*update_ensemble"):
        bare.end_batch()


def test_optimizer_auto_follows_an_optimizer_built_inside_the_framework():
    model, original = HDModel(), Original()
    handle = retrofit(model, "hide", original_model=original, optimizer="auto", **ROUTER)
    built_later = torch.optim.SGD(trainable(model), lr=0.1)  # PILOT builds it inside its _train()
    x, y = batch()
    model.train()
    out = model(x, task_id=0, prompt_id=torch.zeros(8, 1).long(), train=True)
    torch.nn.functional.cross_entropy(out["logits"], y).backward()
    built_later.step()
    assert handle.optimizer is built_later and int(handle.ensemble.num_updates.sum()) == 1
    built_later.step()
    assert int(handle.ensemble.num_updates.sum()) == 2


class _Framework(nn.Module):
    """Mammoth's ``L2PModel`` / PILOT's ``PromptVitNet``: the prompted ViT one level down."""

    def __init__(self) -> None:
        super().__init__()
        from upstream_standins import JLL2P

        self.original_model, self.model = Original(), JLL2P()


def test_a_seam_one_level_down_is_named_in_the_error():
    with pytest.raises(SeamError, match=r"submodule `model` has it: retrofit that one \(model\.model\)"):
        retrofit(_Framework(), "l2p", num_experts=E)


def test_generic_bank_from_output_without_a_router_says_what_it_reads_and_works_with_its_module():
    case = CASES["generic"]
    model, original = case.build()
    kwargs = {k: v for k, v in case.adapter_kwargs(model, original).items()
              if k not in ("query_module", "query_from_output", "route_kwarg", "route_value")}
    route_module = kwargs.pop("route_module")
    with pytest.raises(SeamError, match="bank ids from the output of route_module, the module it hooks"):
        generic.retrofit(model, router=False, ensemble=True, **kwargs)
    handle = generic.retrofit(model, router=False, ensemble=True, route_module=route_module, **kwargs)
    x = batch(seed=3)[0]
    model.eval()
    out = case.forward(model, original, x)
    assert torch.equal(handle.record.ensembled, out[1])  # the banks read from the route module's output
    # the banks read in training also show which expert's prompts it trained: the loop passes the current expert
    assert handle.verify(x, forward=lambda x: case.forward(model, original, x, task=handle.current_expert)[0]).ok
    report = handle.verify(x, forward=lambda x: case.forward(model, original, x)[0])  # a fixed task id
    assert report["training follows the current expert"].ok is False


def test_verify_compares_every_pair_of_experts_not_only_with_expert_0():
    case = CASES["generic"]
    model, original = case.build()
    kwargs = case.adapter_kwargs(model, original)
    # experts 1, 2, ... all select the prompts of expert 1: each differs from expert 0, not from each other
    kwargs.update(num_experts=E + 1, route_value=lambda experts, *rest: experts.clamp(max=1).unsqueeze(1))
    del kwargs["bank_from_output"]  # which would show the prompts used, failing the check before this one
    handle = generic.retrofit(model, **{**kwargs, **ROUTER})
    check = handle.verify(batch()[0], forward=lambda x: case.forward(model, original, x)[0])[
        "forcing each expert changes the logits"]
    assert check.ok is False and "(1, 2)" in check.detail and "ignores the routed value" in check.detail
