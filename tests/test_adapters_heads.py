"""Per-expert classifiers as a seam of the retrofit, and what ``verify`` proves about them (issue 54 items 1, 5,
6, 8; issue 52 items 7, 8).

The stand-in keeps one classifier per task as LAMDA-PILOT's ``SimpleContinualLinear`` does
(``backbone/linears.py``: ``heads = nn.ModuleList([nn.Sequential(nn.Linear(embed_dim, nb_classes))])``,
``update(nb_classes, freeze_old=True)`` appends one and freezes the others, ``forward(x)`` returns
``{"logits": torch.cat(...)}``), and one prompt per task chosen by a keyed match unless the call names the task.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Tuple

import pytest
import torch
import torch.nn.functional as F
from fly_modules.adapters import SeamError, generic, retrofit
from torch import Tensor, nn

from fly_modules import InvalidParameterError, SampleBudgetSchedule, SessionSchedule

D, C, TASKS = 8, 3, 3
ROUTER = dict(expansion_dim=64, ridge=1e-3)


class ContinualLinear(nn.Module):
    """LAMDA-PILOT's ``SimpleContinualLinear`` signatures: a pool of per-task classifiers, grown by ``update``."""

    def __init__(self, embed_dim: int, nb_classes: int) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.heads = nn.ModuleList([nn.Sequential(nn.Linear(embed_dim, nb_classes))])

    def update(self, nb_classes: int, freeze_old: bool = True) -> None:
        if freeze_old:
            for p in self.heads.parameters():
                p.requires_grad = False
        self.heads.append(nn.Sequential(nn.Linear(self.embed_dim, nb_classes)))

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        return {"logits": torch.cat([head(x) for head in self.heads], dim=1)}


class TaskPrompts(nn.Module):
    """One prompt per task: the call's ``task`` (ids or one int), else the nearest key (the method's own choice)."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts = nn.Parameter(torch.randn(TASKS, D))
        self.keys = nn.Parameter(torch.randn(TASKS, D), requires_grad=False)

    def forward(self, x: Tensor, task: Any = None) -> Tuple[Tensor, Tensor]:
        if task is None:
            task = F.normalize(x, dim=-1).matmul(F.normalize(self.keys, dim=-1).t()).argmax(1)
        elif not isinstance(task, Tensor):
            task = torch.full((x.shape[0],), int(task), dtype=torch.long)
        return x + 3.0 * self.prompts[task], task


class TaskNet(nn.Module):
    """A frozen encoder (the router's query), the task prompts, and the per-task classifiers (concatenated)."""

    def __init__(self, slice_per_sample: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(D, D).requires_grad_(False)
        self.prompt = TaskPrompts()
        self.fc = ContinualLinear(D, C)
        self.slice_per_sample = slice_per_sample

    def add_task(self) -> None:
        """The method's own "add a task" call."""
        self.fc.update(C, freeze_old=True)

    def forward(self, x: Tensor, task: Any = None) -> Dict[str, Tensor]:
        h, used = self.prompt(self.encoder(x), task=task)
        if not self.slice_per_sample:
            return self.fc(h)
        # runs every task's classifier and keeps, per sample, the slice of its task (one label space)
        every = torch.stack([head(h) for head in self.fc.heads])
        return {"logits": every[used.clamp(max=len(self.fc.heads) - 1), torch.arange(x.shape[0])]}


class NumberedHeads(TaskNet):
    """Per-task classifiers kept as numbered attributes (``head_0``, ``head_1``, ...), all run, one slice kept."""

    def __init__(self) -> None:
        super().__init__()
        for task in range(TASKS):
            setattr(self, f"head_{task}", nn.Linear(D, C))

    def forward(self, x: Tensor, task: Any = None) -> Dict[str, Tensor]:
        h, used = self.prompt(self.encoder(x), task=task)
        every = torch.stack([getattr(self, f"head_{t}")(h) for t in range(TASKS)])
        return {"logits": every[used, torch.arange(x.shape[0])]}


def _grow(model: TaskNet):
    def start(expert: int) -> None:
        while len(model.fc.heads) < expert + 1:
            model.add_task()
    return start


def _retrofit(model: TaskNet, **options: Any):
    seams = dict(num_experts=TASKS, query_module=model.encoder, route_module=model.prompt, route_kwarg="task",
                 bank_from_output=lambda out: out[1], start_expert=_grow(model))
    return generic.retrofit(model, **{**seams, **ROUTER, **options})


def _forward(model: TaskNet, handle) -> Any:
    """The loop's calls: the current task in training, the method's own choice (routed) at inference."""
    def forward(x: Tensor) -> Tensor:
        out = model(x, task=handle.current_expert) if model.training else model(x)
        return out["logits"] if isinstance(out, dict) else out  # a single classifier answers a tensor

    return forward


def _train(model: TaskNet, handle, optimizer, task: int, steps: int = 3) -> None:
    model.train()
    for step in range(steps):
        torch.manual_seed(100 * task + step)
        x, y = torch.randn(8, D), torch.randint(0, C, (8,)) + C * task
        logits = model(x, task=handle.current_expert)["logits"]
        loss = F.cross_entropy(logits, y.clamp(max=logits.shape[1] - 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        handle.end_batch()


def _trainable(model: nn.Module):
    return [p for p in model.parameters() if p.requires_grad]


# ------------------------------------------------------------------------------------ per-expert classifiers
def test_each_task_classifier_gets_copies_of_its_own_and_answers_on_its_logit_scale():
    model = TaskNet()
    handle = _retrofit(model, schedule=SessionSchedule(TASKS))
    optimizer = torch.optim.SGD(_trainable(model), lr=0.5)
    handle.attach_optimizer(optimizer)
    _train(model, handle, optimizer, 0)
    handle.start_session(1)  # the method's own add-a-task call appends classifier 1 and freezes classifier 0
    optimizer = torch.optim.SGD(_trainable(model), lr=0.5)
    handle.attach_optimizer(optimizer)
    ensemble = handle.ensemble
    assert len(model.fc.heads) == 2 and len(ensemble.members) == 2
    banks_of_0 = ensemble.members[0].ema_weight.clone()
    _train(model, handle, optimizer, 1)
    assert torch.equal(ensemble.members[0].ema_weight, banks_of_0)  # classifier 0 is frozen: its copies stay
    assert int(ensemble.members[1].num_updates) == 3  # classifier 1's own copies follow it
    model.eval()
    x = torch.randn(6, D)
    with torch.no_grad():
        got = model(x)["logits"].double()
        features = model.prompt(model.encoder(x), task=handle.record.experts_for(model.encoder(x)))[0].double()
    expected = []
    for head, member in zip(model.fc.heads, ensemble.members):
        linear = head[0].online
        online = features @ linear.weight.double().t() + linear.bias.double()
        copies = torch.einsum("bd,hcd->bhc", features, member.ema_weight[0].double()) + member.ema_bias[0].double()
        members = torch.cat([online.unsqueeze(1), copies], dim=1)
        expected.append(members.softmax(-1).amax(1).log() + online.logsumexp(-1, keepdim=True))
    torch.testing.assert_close(got, torch.cat(expected, dim=1), rtol=1e-5, atol=1e-5)


def test_fresh_copies_answer_the_online_logits_in_every_classifier_of_the_pool():
    # One scale per tensor: copies equal to their classifier give back the codebase's own logits.
    model = TaskNet()
    handle = _retrofit(model)
    handle.start_expert(1)
    handle.start_expert(2)
    model.eval()
    x = torch.randn(5, D)
    with handle.forcing(torch.tensor([0, 1, 2, 0, 1])), torch.no_grad():
        ensembled = model(x)["logits"]
    handle.remove()
    with torch.no_grad():
        plain = model(x, task=torch.tensor([0, 1, 2, 0, 1]))["logits"]
    torch.testing.assert_close(ensembled, plain, rtol=1e-5, atol=1e-5)


def test_naming_one_classifier_of_a_pool_is_refused_with_the_pool_to_name():
    model = TaskNet()
    with pytest.raises(SeamError, match=r"one of the 1 per-expert classifiers of `fc\.heads` \(an nn.ModuleList\), which "
                                        r"would leave the others outside the ensemble; name the pool itself "
                                        r"\(head_owner=model\.fc, head_name='heads'\)"):
        _retrofit(model, head_owner=model.fc.heads[0], head_name="0")
    assert _hooks(model) == 0
    _retrofit(model, head_owner=model.fc, head_name="heads").remove()


def test_a_classifier_holding_one_linear_is_swapped_inside_and_keeps_its_dict_output():
    model = TaskNet()
    model.fc = nn.Sequential(nn.Dropout(0.0), nn.Linear(D, C))  # a small wrapper around the classifier
    handle = generic.retrofit(model, num_experts=2, router=False, head_owner=model, head_name="fc")
    assert isinstance(model.fc[1], generic.EnsembleLinear) and handle.ensemble.online is model.fc[1].online
    handle.remove()
    assert type(model.fc[1]) is nn.Linear


def test_the_pool_resumes_from_its_state_dict():
    model = TaskNet()
    handle = _retrofit(model, optimizer="auto")
    handle.start_expert(1)
    optimizer = torch.optim.SGD(_trainable(model), lr=0.5)
    _train(model, handle, optimizer, 1, steps=2)
    state = handle.state_dict()
    assert not any("online" in key for key in state["ensemble"])  # the classifiers are the model's own
    twin = TaskNet()
    twin.add_task()  # the run's pool, grown as it was
    twin.load_state_dict(model.state_dict())
    again = _retrofit(twin)
    again.load_state_dict(state)
    for mine, theirs in zip(handle.ensemble.members, again.ensemble.members):
        assert torch.equal(mine.ema_weight, theirs.ema_weight)
    assert again.ensemble.active_expert == handle.ensemble.active_expert == 1


def test_a_frozen_classifier_is_named_as_the_cause_not_a_missing_optimizer():
    model = TaskNet()
    model.fc = nn.Linear(D, C)
    handle = generic.retrofit(model, num_experts=2, router=False, head_owner=model, head_name="fc")
    model.fc.requires_grad_(False)  # frozen after its task
    model.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.randn(4, D), task=1)
        handle.end_batch()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "is frozen (requires_grad=False)" in messages[0] and "optimizer=" not in messages[0]


def _no_ema_warnings(handle, model, step) -> list:
    """The end_batch warnings of one training batch whose optimizer step is ``step()``."""
    model.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = model(torch.randn(4, D), task=0).sum()
        loss.backward()
        step()
        handle.end_batch()
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def _one_classifier(optimizer: bool):
    model = TaskNet()
    model.fc = nn.Linear(D, C)
    loop_optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)
    handle = generic.retrofit(model, num_experts=2, router=False, head_owner=model, head_name="fc",
                              optimizer=loop_optimizer if optimizer else None)
    return model, loop_optimizer, handle


def test_end_batch_warns_when_the_classifier_moved_without_its_copies_and_only_then():
    model, loop_optimizer, handle = _one_classifier(optimizer=True)
    assert _no_ema_warnings(handle, model, lambda: None) == []  # a first step GradScaler skipped: nothing lost
    assert _no_ema_warnings(handle, model, loop_optimizer.step) == []  # the copies follow the hooked optimizer
    assert int(handle.ensemble.num_updates.sum()) == 1
    assert _no_ema_warnings(handle, model, lambda: None) == []  # a later skipped step: the classifier did not move
    model.fc.requires_grad_(False)  # only the first task's classifier was named; it is frozen after its task
    messages = _no_ema_warnings(handle, model, lambda: None)
    assert len(messages) == 1 and "is frozen" in messages[0]  # although the copies moved before

    model, loop_optimizer, handle = _one_classifier(optimizer=False)
    messages = _no_ema_warnings(handle, model, loop_optimizer.step)  # the loop steps an optimizer nobody follows
    assert len(messages) == 1 and "optimizer=" in messages[0]


def test_a_router_only_retrofit_needs_no_classifier():
    model = TaskNet()
    model.fc = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, C))  # not one nn.Linear
    with pytest.raises(SeamError, match=r"holding 2 nn.Linear.*head_owner=.*or retrofit with ensemble=False"):
        _retrofit(model)
    with pytest.raises(SeamError, match=r"no nn.Linear classifier gives the width.*pass router_dim="):
        _retrofit(model, ensemble=False)
    handle = _retrofit(model, ensemble=False, router_dim=D)
    assert handle.ensemble is None and handle.router.in_features == D
    handle.remove()
    del model.fc  # no classifier at all
    _retrofit(model, ensemble=False, router_dim=D).remove()
    with pytest.raises(SeamError, match=r"TaskNet has no classifier.*pass head_owner=\.\.\. and head_name=\.\.\., or "
                                        r"retrofit with ensemble=False"):
        _retrofit(model)


# ------------------------------------------------------------------------------------------------- verify
def test_verify_proves_each_expert_reaches_its_samples_and_runs_the_checks_the_options_allow():
    model = TaskNet(slice_per_sample=True)
    handle = _retrofit(model)
    flags = [p.requires_grad for p in model.parameters()]
    report = handle.verify(torch.randn(8, D), forward=_forward(model, handle))
    assert report.ok, str(report)
    # the method's own start grew and froze classifiers inside verify: all of it is put back
    assert len(model.fc.heads) == 1 and [p.requires_grad for p in model.parameters()] == flags
    for name in ("training follows the current expert", "forcing each expert selects its prompts",
                 "inference uses the ensemble"):
        assert report[name].ok is True, str(report)
    assert "expert 0, expert 1, expert 2" in report["inference uses the ensemble"].detail


def test_verify_without_a_router_proves_the_copies_of_every_classifier_the_model_ran_reach_its_logits():
    # InfLoRA's evaluation: no per-sample selection, every task's classifier run and concatenated. Without a router
    # the banks to perturb are those of the classifiers that answered (recorded inside verify), here both.
    model = TaskNet()
    handle = generic.retrofit(model, num_experts=TASKS, router=False, head_owner=model, head_name="fc",
                              start_expert=_grow(model))
    handle.start_expert(1)
    report = handle.verify(torch.randn(8, D), forward=_forward(model, handle))
    assert report["inference uses the ensemble"].ok is True, str(report)
    online = [lambda x, linear=head[0]: getattr(linear, "online", linear)(x) for head in model.fc.heads]
    model.fc.forward = lambda x: {"logits": torch.cat([linear(x) for linear in online], dim=1)}
    check = handle.verify(torch.randn(8, D), forward=_forward(model, handle))["inference uses the ensemble"]
    assert check.ok is False, check.detail  # every classifier's own online head: no copy reaches the logits


def test_verify_fails_when_the_samples_of_an_expert_get_a_classifier_outside_the_ensemble():
    # Only classifier 0 is wrapped (the classifiers are numbered attributes, not a pool the retrofit can see); the
    # model keeps, per sample, its task's classifier's slice: the samples routed to tasks 1 and 2 never see the
    # ensemble although the wrapped head ran.
    model = NumberedHeads()
    handle = _retrofit(model, head_owner=model, head_name="head_0")
    report = handle.verify(torch.randn(8, D), forward=_forward(model, handle))
    check = report["inference uses the ensemble"]
    assert check.ok is False and "expert 1, expert 2" in check.detail and "expert 0" not in check.detail


def test_verify_after_the_last_task_says_everything_is_frozen():
    model = TaskNet()
    handle = _retrofit(model)
    model.requires_grad_(False)
    report = handle.verify(torch.randn(8, D), forward=_forward(model, handle))
    check = report["ensemble banks move after an optimizer step"]
    assert check.ok is None and "everything is frozen" in check.detail and "require grad" not in check.detail.replace(
        "requires grad", "")


def test_verify_names_a_frozen_classifier_when_the_prompts_still_train():
    model = TaskNet()
    model.fc = nn.Linear(D, C)
    handle = generic.retrofit(model, num_experts=TASKS, router=False, head_owner=model, head_name="fc")
    model.fc.requires_grad_(False)
    check = handle.verify(torch.randn(8, D), forward=_forward(model, handle))["ensemble banks move after an optimizer step"]
    assert check.ok is False and "is frozen (requires_grad=False)" in check.detail


class _SameQuery(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.ones(x.shape[0], D) + 0 * x.sum()


def test_a_query_that_is_the_same_for_every_sample_fails_verify():
    model = TaskNet()
    model.same = _SameQuery()
    handle = _retrofit(model, query_module=model.same)
    real = model.forward
    model.forward = lambda x, task=None: (model.same(x), real(x, task=task))[1]
    check = handle.verify(torch.randn(8, D), forward=_forward(model, handle))["router query varies across samples"]
    assert check.ok is False and "the same query" in check.detail


# --------------------------------------------------------------------------------- verify's own arguments
@pytest.mark.parametrize("call, message", [
    (lambda h, f: h.verify(torch.randn(0, D), forward=f), r"Retrofit\.verify: batch holds 0 samples"),
    (lambda h, f: h.verify(torch.randn(4, D), forward=f, targets=torch.tensor([0, 1, 2])),
     r"Retrofit\.verify: targets must be a tensor with one label per sample of the batch \(4\), got shape \(3,\)"),
    (lambda h, f: h.verify(torch.randn(4, D), forward=lambda x: h.model(x, tsk=0)),
     r"Retrofit\.verify: forward=\.\.\. raised TypeError: .*tsk.*\(training mode, on the model without the retrofit\)"),
])
def test_verify_refuses_its_own_bad_arguments_in_one_line_before_any_check(call, message):
    model = TaskNet()
    handle = _retrofit(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(InvalidParameterError, match=message) as error:
        call(handle, _forward(model, handle))
    assert "\n" not in str(error.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and handle.router.num_samples == 0


# ------------------------------------------------------------------------------------- families, smaller
class _Learner:
    """A trainer holding the network, as PyCIL's and LAMDA-PILOT's learners do."""

    def __init__(self) -> None:
        self._network = TaskNet()
        self._cur_task = 0


def test_retrofit_of_a_trainer_names_its_network():
    with pytest.raises(InvalidParameterError, match=r"expected an nn\.Module, got a _Learner; pass _learner\._network$"):
        retrofit(_Learner(), "l2p", num_experts=2)


def test_l2p_names_the_missing_prompt_before_asking_for_num_experts():
    with pytest.raises(SeamError, match=r"_NoPrompt has no `prompt`"):
        retrofit(_NoPrompt(), "l2p")


class _NoPrompt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(D, C)


def test_the_schedules_are_importable_from_the_adapters():
    from fly_modules.adapters import SampleBudgetSchedule as Budget
    from fly_modules.adapters import SessionSchedule as Sessions

    assert Budget is SampleBudgetSchedule and Sessions is SessionSchedule


# ------------------------------------------------------------------------------ forks of a supported layout
def _jhlee_fork():
    pytest.importorskip("timm")
    from upstream_standins import JLDualPrompt, Original

    return JLDualPrompt(), Original()


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_a_fork_whose_keys_live_in_another_space_is_refused_before_anything_is_installed():
    model, _ = _jhlee_fork()
    model.e_prompt.embed_dim = model.e_prompt.prompt_key.shape[1]
    model.e_prompt.prompt_key = nn.Parameter(torch.randn(model.e_prompt.prompt_key.shape[0], 16))  # projected keys
    with pytest.raises(SeamError, match=r"prompt_key \(4, 16\) holds keys of width 16 but the pool's queries are 32 "
                                        r"wide \(embed_dim\).*router=False"):
        retrofit(model, "dualprompt", num_experts=2)
    assert _hooks(model) == 0 and type(model.head) is nn.Linear
    retrofit(model, "dualprompt", num_experts=2, router=False).remove()


def test_a_router_wider_than_the_keys_it_reads_is_refused_with_the_option_to_fix_it():
    model, _ = _jhlee_fork()
    with pytest.raises(SeamError, match=r"be 16 wide \(router_dim.*pass router_dim=32, or query_module="):
        retrofit(model, "dualprompt", num_experts=2, router_dim=16)
    assert _hooks(model) == 0


def test_a_family_retrofit_without_the_ensemble_ignores_a_classifier_it_cannot_copy():
    model, _ = _jhlee_fork()
    width = model.head.in_features
    model.head = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, C))
    with pytest.raises(SeamError, match=r"holding 2 nn.Linear.*; retrofit with ensemble=False \(the router needs no "
                                        r"classifier\), or name the classifier with fly_modules\.adapters\.generic") as error:
        retrofit(model, "dualprompt", num_experts=2)
    assert "pass head_owner" not in str(error.value)  # an option the dualprompt family does not take
    handle = retrofit(model, "dualprompt", num_experts=2, ensemble=False)  # sized by the keys it routes on
    assert handle.router.in_features == width and handle.ensemble is None


class _TaskHeads(nn.Module):
    """A fork's per-task classifiers returning a dict, grown by the method."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(width, C)])

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        return {"logits": torch.cat([head(x) for head in self.heads], dim=1)}


def test_a_fork_with_per_task_classifiers_returning_dicts_is_retrofitted_and_verified():
    from upstream_standins import jhlee_forward

    model, original = _jhlee_fork()
    model.head = _TaskHeads(model.head.in_features)
    real = model.forward

    def forward(x: Tensor, **kwargs: Any) -> Dict[str, Any]:
        res = real(x, **kwargs)
        res["logits"] = res["logits"]["logits"]
        return res

    model.forward = forward

    def grow(expert: int) -> None:
        while len(model.head.heads) < expert + 1:
            model.head.heads[-1].requires_grad_(False)
            model.head.heads.append(nn.Linear(model.head.heads[0].in_features, C))

    handle = retrofit(model, "dualprompt", num_experts=2, start_expert=grow, **ROUTER)
    x = torch.randn(4, 3, 32, 32)
    report = handle.verify(x, forward=lambda x: jhlee_forward(model, original, x, handle.current_expert)["logits"])
    assert report.ok and report["inference uses the ensemble"].ok, str(report)


def test_a_layout_with_its_own_head_swap_refuses_a_wrapped_classifier_and_a_pool():
    pytest.importorskip("timm")
    from upstream_standins import MVP

    model = MVP(flygcl=False)
    linear = model.backbone.head
    model.backbone.head = nn.Sequential(linear)
    with pytest.raises(SeamError, match=r"classifier is a Sequential holding its nn.Linear, which the mvp layout's own "
                                        r"head swap does not take; retrofit with ensemble=False"):
        retrofit(model, "mvp")
    assert _hooks(model) == 0 and model.backbone.head[0] is linear
    model.backbone.head = nn.ModuleList([linear])
    with pytest.raises(SeamError, match=r"classifier is a pool of per-expert classifiers, which the mvp layout"):
        retrofit(model, "mvp")
    retrofit(model, "mvp", ensemble=False).remove()


def test_verify_fails_when_the_method_adds_no_classifier_for_the_next_expert():
    model = TaskNet()
    handle = _retrofit(model, start_expert=None)  # the pool is never grown: task 1 trains classifier 0
    check = handle.verify(torch.randn(8, D), forward=_forward(model, handle))["training follows the current expert"]
    assert check.ok is False and "per-expert classifiers) of expert(s) [0, 1]" in check.detail
