"""Routing that binds like Python, the query from the call the user means, and training in eval mode, on
stand-ins reproducing the calls of codebases outside the nine: an evaluation that passes the per-sample
selection positionally (``net(inputs, selection, train=False)``), a selection made in a plain method
(``net.interface(x, selection)``), one soft prompt mixture called at every prompted layer, an encoder run
with and without prompts in each training step, and a loop that trains with the model in eval mode."""

from __future__ import annotations

import copy
from typing import Any, Optional

import pytest
import torch
import torch.nn.functional as F
from fly_modules.adapters import SeamError, expert_slot_mask, generic, retrofit
from fly_modules.adapters._routed_call import RoutedArgument
from torch import Tensor, nn

from fly_modules import InvalidParameterError

E, D, C, B = 2, 8, 5, 6
ROUTER = dict(expansion_dim=64, ridge=1e-2)


def _batch(seed: int = 0) -> Tensor:
    return torch.randn(B, D, generator=torch.Generator().manual_seed(seed))


class SelectionNet(nn.Module):
    """Its evaluation calls ``net(inputs, selection, train=False)`` (the selection positionally, ``None``: the
    method's own choice by key matching), and the choice is an argument of the plain method
    ``interface(x, selection)``, which ``forward`` calls positionally too."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.query = nn.Linear(D, D).requires_grad_(False)  # frozen, prompt-free
        self.keys = nn.Parameter(torch.randn(E, D))
        self.prompts = nn.Parameter(torch.randn(E, D))
        self.body = nn.Linear(D, D)
        self.head = nn.Linear(D, C)
        self.task = 0

    def interface(self, x: Tensor, selection: Optional[Tensor] = None) -> Tensor:
        if selection is None:
            selection = (F.normalize(self.query(x), dim=1) @ F.normalize(self.keys, dim=1).t()).argmax(1)
        return self.head(torch.relu(self.body(x) + self.prompts[selection]))

    def forward(self, inputs: Tensor, selection: Optional[Tensor] = None, train: bool = False) -> Tensor:
        self.query(inputs)  # the query pass the method runs anyway (read by the router's hook)
        if train:
            selection = torch.full((inputs.shape[0],), self.task, dtype=torch.long)
        return self.interface(inputs, selection)


def _selected(net: SelectionNet, x: Tensor, expert: int) -> Tensor:
    """The un-retrofitted model's output with every sample given ``expert``'s prompt."""
    clean = copy.deepcopy(net)
    clean.eval()
    with torch.no_grad():
        return clean.interface(x, torch.full((x.shape[0],), expert, dtype=torch.long))


@pytest.mark.parametrize("method", [None, "interface"])
def test_a_selection_passed_positionally_is_replaced_by_the_routed_one(method):
    net = SelectionNet()
    handle = generic.retrofit(net, num_experts=E, query_module=net.query, route_kwarg="selection",
                              route_module=net, route_method=method, ensemble=False, **ROUTER)
    x = _batch()
    net.eval()
    for expert in range(E):
        with torch.no_grad(), handle.forcing(expert):
            net.query(x)  # a routed forward needs its query first: the loop's query pass
            routed = net(x, None, train=False)  # the codebase's own evaluation call, selection by position
        assert torch.equal(routed, _selected(net, x, expert))
        assert handle.record.routed.tolist() == [expert] * B
    handle.remove()
    assert "interface" not in vars(net)  # the routed method unpatched
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in net.modules())  # the routed forward unhooked


def test_forcing_routes_a_call_made_before_the_query_module_ran():
    """PGP's task-start memory pass runs the model before ``original_model``: no query of these images is
    recorded when the routed call runs. Unforced it raises (never another batch's query); forced, it needs
    no query. ``verify`` keeps asking for the query (its query checks compare it)."""
    net, x = SelectionNet(), _batch()
    expected = [_selected(net, x, expert) for expert in range(E)]
    handle = generic.retrofit(net, num_experts=E, query_module=net.query, route_kwarg="selection", route_module=net,
                              route_method="interface", ensemble=False, **ROUTER)
    net.train()
    net(x, train=True)
    handle.end_batch()
    net.eval()
    with torch.no_grad(), pytest.raises(RuntimeError, match="no query features were recorded"):
        net.interface(x)  # the memory pass: the routed method, no query pass before it
    for expert in range(E):
        with torch.no_grad(), handle.forcing(expert):
            out = net.interface(x)
        assert handle.record.routed.tolist() == [expert] * B
        assert torch.equal(out, expected[expert])
    with torch.no_grad(), handle.forcing(torch.tensor([1, 0, 1, 0, 1, 0])):
        net.interface(x)
    assert handle.record.routed.tolist() == [1, 0, 1, 0, 1, 0]
    with torch.no_grad(), handle.forcing(1), pytest.raises(RuntimeError, match="no query features were recorded"):
        handle.record.verifying = True  # inside verify() the recorded query is required
        net.interface(x)
    handle.record.verifying = False
    handle.remove()


def test_unrouted_keeps_the_codebases_own_selection_and_records_nothing():
    """HiDe-PET's class statistics call the model in eval mode under ``no_grad`` with the task they are about
    (``model(x, task_id=t, train=True)``): routing it would replace that task. Inside ``handle.unrouted()`` the
    call keeps its own selection, needs no query, and leaves nothing for the next forward or ``end_batch``."""
    net, x = SelectionNet(), _batch()
    own = [_selected(net, x, expert) for expert in range(E)]
    handle = generic.retrofit(net, num_experts=E, query_module=net.query, route_kwarg="selection", route_module=net,
                              ensemble=False, train_in_eval=True, **ROUTER)
    net.train()
    net(x, train=True)
    handle.end_batch()
    net.eval()
    with torch.no_grad():
        net.query(x)
        net(x, torch.zeros(B, dtype=torch.long))  # outside the block the call's own selection is replaced
    assert handle.record.routed is not None
    for expert in range(E):
        handle.record.routed = None
        with torch.no_grad(), handle.unrouted():
            out = net(x, torch.full((B,), expert, dtype=torch.long))
            net.query(x)  # a query pass after the model (PGP's memory pass) is not left for the next forward
        assert torch.equal(out, own[expert]) and handle.record.routed is None
        assert handle.record.eval_query is None and handle.record.query is None and handle.record.size is None
    handle.remove()


def test_the_routed_value_replaces_the_argument_where_the_call_passes_it():
    def forward(inputs, selection=None, train=False, *, scale=1.0, **options):
        return None

    def positional_only(inputs, selection=None, /, train=False):
        return None

    selection, extra = RoutedArgument(forward, "selection"), RoutedArgument(forward, "temperature")
    x = torch.zeros(1)
    assert selection.bind((x, None), {"train": False}, 7) == ((x, 7), {"train": False})
    assert selection.bind((x,), {"selection": None, "train": False}, 7) == ((x,), {"selection": 7, "train": False})
    assert selection.bind((x,), {}, 7) == ((x,), {"selection": 7})
    assert extra.bind((x,), {"temperature": 2}, 7) == ((x,), {"temperature": 7})  # through **options
    assert selection.bind((x, 1, 2, 3), {}, 7) == ((x, 1, 2, 3), {})  # not a call: Python's own error follows
    assert RoutedArgument(positional_only, "selection").bind((x,), {"train": True}, 7) == ((x, 7, True), {})


def test_a_routed_method_is_patched_on_the_instance_and_remove_restores_it():
    net = SelectionNet()
    keys = list(net.state_dict())
    handle = generic.retrofit(net, num_experts=E, query_module=net.query, route_method="interface",
                              route_kwarg="selection", ensemble=False, **ROUTER)
    assert "interface" in vars(net) and list(net.state_dict()) == keys
    x = _batch(1)
    net.eval()
    with torch.no_grad(), handle.forcing(1):
        net.query(x)  # the loop runs the query pass, then calls the method itself
        direct = net.interface(x, selection=None)
    assert torch.equal(direct, _selected(net, x, 1))
    assert handle.record.eval_query is None  # called outside the model's forward: its query is forgotten
    report = handle.verify(x, forward=lambda images: net(images, None, train=net.training))
    assert report.ok, str(report)
    handle.remove()
    assert "interface" not in vars(net) and list(net.state_dict()) == keys
    assert net.interface.__func__ is SelectionNet.interface


def test_a_bound_method_as_route_module_names_the_option_to_use():
    net = SelectionNet()
    with pytest.raises(SeamError, match=r"route_module is the method SelectionNet\.interface.*route_method='interface'"):
        generic.retrofit(net, num_experts=E, query_module=net.query, route_module=net.interface,
                         route_kwarg="selection")
    with pytest.raises(SeamError, match=r"route_method='query' names a submodule"):
        generic.retrofit(net, num_experts=E, query_module=net.query, route_method="query", route_kwarg="selection")
    assert "interface" not in vars(net) and not net._forward_pre_hooks and not net.query._forward_hooks


class KwargsOnly(SelectionNet):
    def interface(self, x: Tensor, **options: Any) -> Tensor:  # the selection only through **options
        return super().interface(x, options.get("selection"))


def test_a_target_taking_the_argument_only_through_kwargs_is_refused_naming_route_method():
    net = KwargsOnly()
    with pytest.raises(SeamError, match=r"KwargsOnly\.interface\(x.*\*\*options.*swallow.*route_method must name"):
        generic.retrofit(net, num_experts=E, query_module=net.query, route_method="interface", route_kwarg="selection")
    assert "interface" not in vars(net)


# ------------------------------------------------------------------- one prompt module at every layer
class SoftPrompts(nn.Module):
    """A soft mixture of a pool (CODA-Prompt's components): every slot weighted by its key's match with the
    query, ``weights_mask`` (``(B, P)``) restricting the mix; called once per prompted layer."""

    def __init__(self, layers: int, pool: int) -> None:
        super().__init__()
        self.keys = nn.Parameter(torch.randn(pool, D))
        self.prompts = nn.Parameter(torch.randn(layers, pool, D))
        self.register_buffer("expert_of_slot", torch.arange(pool) // (pool // E))

    def forward(self, h: Tensor, layer: int, query: Tensor, weights_mask: Optional[Tensor] = None) -> Tensor:
        weights = torch.softmax(query @ self.keys.t(), dim=1)
        if weights_mask is not None:
            weights = weights * weights_mask
        return h + weights @ self.prompts[layer]


class LayeredNet(nn.Module):
    def __init__(self, layers: int = 3, pool: int = 4) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.query = nn.Linear(D, D).requires_grad_(False)
        self.blocks = nn.ModuleList(nn.Linear(D, D) for _ in range(layers))
        self.prompt = SoftPrompts(layers, pool)
        self.head = nn.Linear(D, C)

    def forward(self, x: Tensor, weights_mask: Optional[Tensor] = None) -> Tensor:
        query, h = self.query(x), x
        for layer, block in enumerate(self.blocks):
            h = torch.tanh(block(self.prompt(h, layer, query, weights_mask=weights_mask)))
        return self.head(h)


def _slot_mask(experts: Tensor, module: nn.Module, args: Any, kwargs: Any) -> Tensor:
    return expert_slot_mask(experts, module.expert_of_slot).to(experts.device, torch.float32)


def test_a_prompt_module_called_at_every_layer_gets_the_routed_value_at_every_call():
    net = LayeredNet()
    clean = copy.deepcopy(net).eval()
    handle = generic.retrofit(net, num_experts=E, query_module=net.query, route_module=net.prompt,
                              route_kwarg="weights_mask", route_value=_slot_mask, ensemble=False, **ROUTER)
    calls = []
    net.prompt.register_forward_pre_hook(lambda module, args: calls.append(1))
    x, experts = _batch(2), torch.tensor([0, 1, 1, 0, 1, 0])
    net.eval()
    with torch.no_grad(), handle.forcing(experts):
        routed = net(x)
    mask = expert_slot_mask(experts, net.prompt.expert_of_slot).float()
    assert mask.tolist()[0] == [1.0, 1.0, 0.0, 0.0] and mask.tolist()[1] == [0.0, 0.0, 1.0, 1.0]
    with torch.no_grad():
        assert torch.equal(routed, clean(x, weights_mask=mask))
    assert len(calls) == 3 and handle.record.eval_query is None  # forgotten once the forward returned
    with torch.no_grad(), handle.forcing(1):
        query = net.query(x)  # the loop calls the routed module itself, outside the model's forward
        alone = net.prompt(x, 0, query)
        assert torch.equal(alone, clean.prompt(x, 0, query, weights_mask=expert_slot_mask(
            torch.ones(B, dtype=torch.long), net.prompt.expert_of_slot).float()))
    assert handle.record.eval_query is None  # that call was the whole forward: its query is forgotten
    report = handle.verify(x)
    assert report.ok, str(report)


def test_the_router_fitted_routes_every_layer_of_a_forward_with_one_routing():
    net = LayeredNet()
    handle = generic.retrofit(net, num_experts=E, query_module=net.query, route_module=net.prompt,
                              route_kwarg="weights_mask", route_value=_slot_mask, ensemble=False, **ROUTER)
    net.train()
    for expert in range(E):
        handle.start_expert(expert)
        net(_batch(10 + expert) + 3 * expert)
        handle.end_batch()
    routes = []
    original = handle.router.route
    handle.router.route = lambda features: routes.append(1) or original(features)
    net.eval()
    with torch.no_grad():
        net(_batch(3))
    assert len(routes) == 1 and handle.record.routed.shape == (B,)


def test_expert_slot_mask_refuses_other_shapes():
    with pytest.raises(ValueError, match=r"expert_slot_mask: expected \(B,\) experts"):
        expert_slot_mask(torch.zeros(2, 1, dtype=torch.long), torch.arange(4))


# ---------------------------------------------------------------------- the query from the right call
class PromptedEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, x: Tensor, prompt: Optional[Tensor] = None) -> Tensor:
        return self.proj(x if prompt is None else x + prompt)


class TwoPassNet(nn.Module):
    """One encoder, run prompted and prompt-free in each training step (the prompted pass first, the
    prompt-free one for the key-matching term), prompt-free then prompted at inference; the routed choice is
    ``pick(query, expert=None)``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.encoder = PromptedEncoder()
        self.keys = nn.Parameter(torch.randn(E, D))
        self.prompts = nn.Parameter(3 * torch.randn(E, D))
        self.head = nn.Linear(D, C)
        self.task = 0

    def pick(self, query: Tensor, expert: Optional[Tensor] = None) -> Tensor:
        return (query @ self.keys.t()).argmax(1) if expert is None else expert

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            features = self.encoder(x, prompt=self.prompts[self.task])
            with torch.no_grad():
                query = self.encoder(x)
            return self.head(features) + 0.0 * (query @ self.keys.t()).sum()
        with torch.no_grad():
            query = self.encoder(x)
        return self.head(self.encoder(x, prompt=self.prompts[self.pick(query)]))


def _two_pass(**options: Any):
    net = TwoPassNet()
    handle = generic.retrofit(net, num_experts=E, query_module=net.encoder, route_method="pick", route_kwarg="expert",
                              start_expert=lambda task: setattr(net, "task", task), **ROUTER, **options)
    return net, handle


def test_query_when_records_the_prompt_free_call_in_training_and_verify_proves_it():
    net, handle = _two_pass(query_when=lambda args, kwargs: kwargs.get("prompt") is None)
    x = _batch(4)
    net.train()
    net(x)
    with torch.no_grad():
        assert torch.equal(handle.record.query, net.encoder(x))
    report = handle.verify(x)
    assert report.ok, str(report)
    assert report["router's training and inference queries match"].ok is True
    assert report["router query varies across samples"].ok is True


def test_query_when_must_be_a_function():
    net = TwoPassNet()
    with pytest.raises(InvalidParameterError, match=r"query_when must be a function .* PromptedEncoder .* got str"):
        generic.retrofit(net, num_experts=E, query_module=net.encoder, route_method="pick", route_kwarg="expert",
                         query_when="prompt-free")
    assert "pick" not in vars(net) and not net.encoder._forward_hooks


def test_a_query_recorded_from_another_call_than_the_routed_one_fails_verify():
    net, handle = _two_pass()  # no query_when: the first call of a training step, the prompted one, is recorded
    report = handle.verify(_batch(4))
    check = report["router's training and inference queries match"]
    assert check.ok is False and "query_when" in check.detail, str(report)
    assert not report.ok


class ConstantQuery(nn.Module):
    """The fork's ``cls_features``: one vector for every sample of the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.vector = nn.Parameter(torch.randn(D), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.vector.expand(x.shape[0], D)


def test_a_degenerate_query_fails_verify():
    net = SelectionNet()
    net.query = ConstantQuery()
    handle = generic.retrofit(net, num_experts=E, query_module=net.query, route_method="interface",
                              route_kwarg="selection", **ROUTER)
    report = handle.verify(_batch(5), forward=lambda images: net(images, None, train=net.training))
    check = report["router query varies across samples"]
    assert check.ok is False and "same query" in check.detail, str(report)
    assert report["router's training and inference queries match"].ok is True  # the same call, but useless


# ----------------------------------------------------------------------------- training in eval mode
class DropoutNet(SelectionNet):
    """A model whose loop calls ``model.eval()`` before training (to freeze its dropout)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def interface(self, x: Tensor, selection: Optional[Tensor] = None) -> Tensor:
        return super().interface(self.drop(x), selection)


def _eval_mode_step(net: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor) -> Tensor:
    net.eval()
    logits = net(x, None, train=True)
    loss = F.cross_entropy(logits, torch.arange(x.shape[0]) % C)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return logits.detach()


def test_a_backward_through_an_eval_mode_output_names_train_in_eval():
    net = DropoutNet()
    optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
    handle = generic.retrofit(net, num_experts=E, query_module=net.query, route_method="interface",
                              route_kwarg="selection", optimizer=optimizer, **ROUTER)
    with pytest.raises(RuntimeError, match=r"^fly_modules\.adapters\.generic: a backward reached .* eval mode.*"
                                           r"train_in_eval=True"):
        _eval_mode_step(net, optimizer, _batch(6))
    net.eval()
    with torch.no_grad():
        net(_batch(6), None)  # inference under no_grad: nothing to refuse
    handle.remove()


def test_train_in_eval_trains_the_online_head_and_records_the_query():
    net = DropoutNet()
    clean = copy.deepcopy(net)
    optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
    handle = generic.retrofit(net, num_experts=E, query_module=net.query, route_method="interface",
                              route_kwarg="selection", optimizer=optimizer, train_in_eval=True, **ROUTER)
    x = _batch(7)
    logits = _eval_mode_step(net, optimizer, x)
    clean_optimizer = torch.optim.SGD([p for p in clean.parameters() if p.requires_grad], lr=0.1)
    assert torch.equal(logits, _eval_mode_step(clean, clean_optimizer, x))  # the online head, not the ensemble
    assert handle.record.query is not None and handle.record.ensemble_steps == 1
    handle.end_batch()
    assert handle.router.num_samples == B
    net.eval()
    with torch.no_grad():
        net(x, None)
    assert handle.record.ensembled is not None and handle.record.routed is not None  # inference: the ensemble


def test_train_in_eval_holds_for_a_family():
    pytest.importorskip("timm")
    from flygcl_standins import FlyGCLSPrompt
    from upstream_cases import batch

    def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> Tensor:
        model.eval()
        logits = model(x)
        optimizer.zero_grad()
        F.cross_entropy(logits, y).backward()
        optimizer.step()
        return logits.detach()

    x, y = batch()
    for train_in_eval in (False, True):
        model = FlyGCLSPrompt()
        clean = copy.deepcopy(model)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        handle = retrofit(model, "sprompt", optimizer=optimizer, train_in_eval=train_in_eval, **ROUTER)
        if not train_in_eval:
            with pytest.raises(RuntimeError, match=r"^fly_modules\.adapters\.sprompt: a backward .*train_in_eval"):
                step(model, optimizer)
            continue
        clean_optimizer = torch.optim.SGD([p for p in clean.parameters() if p.requires_grad], lr=0.1)
        assert torch.equal(step(model, optimizer), step(clean, clean_optimizer))
        handle.end_batch()
        assert handle.router.num_samples == x.shape[0]
        with torch.no_grad():
            model(x)
        assert handle.record.routed is not None and handle.record.ensembled is not None
