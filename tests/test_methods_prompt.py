"""L2P, DualPrompt, MISA, MVP and FlyPrompt reference implementations on a tiny random timm ViT."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

timm = pytest.importorskip("timm")
from method_steps import train_step  # noqa: E402
from upstream_standins import FcViT  # noqa: E402

from benchmarks.methods import base  # noqa: E402
from benchmarks.methods.base import create_method, frozen_cls, list_methods  # noqa: E402
from benchmarks.methods.mvp import mcr_gradients  # noqa: E402
from benchmarks.methods.prompting import resolve_layers  # noqa: E402

EMBED, DEPTH, CLASSES = 32, 6, 5
VIT_KW = dict(img_size=32, patch_size=8, embed_dim=EMBED, depth=DEPTH, num_heads=2)
METHODS = ["l2p", "dualprompt", "misa", "mvp", "flyprompt"]



def make_vit(seed: int = 0, **overrides: Any) -> nn.Module:
    torch.manual_seed(seed)
    kw = dict(VIT_KW, num_classes=0)
    kw.update(overrides)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, **kw)


def misa_prompts(seed: int = 7) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # G: 2 layers x 2 tokens; E: 3 layers x 3 tokens, 3 slots (tiled to the pool of 6).
    return {
        "g_prompt": torch.randn(1, 4, EMBED, generator=gen),
        "e_prompt": torch.randn(3, 9, EMBED, generator=gen),
    }


def method_kwargs(name: str) -> Dict[str, Any]:
    return {
        "l2p": dict(num_experts=2, pool_size=6, prompt_length=2, top_k=2),
        "dualprompt": dict(num_experts=3, pool_size=6, g_prompt_length=2, e_prompt_length=3),
        "misa": dict(num_experts=3, pool_size=6, g_prompt_length=2, e_prompt_length=3, **misa_prompts()),
        "mvp": dict(num_experts=3, g_prompt_length=2, e_prompt_length=3),
        "flyprompt": dict(num_experts=3, prompt_length=3, router_expansion_dim=64, router_ridge=1.0),
    }[name]


def make_method(name: str, seed: int = 0, backbone: nn.Module = None, **overrides: Any) -> base.PromptMethod:
    backbone = make_vit(seed) if backbone is None else backbone
    torch.manual_seed(seed + 100)
    kwargs = method_kwargs(name)
    kwargs.update(overrides)
    return create_method(name, backbone, CLASSES, **kwargs)


def batch(seed: int = 1, n: int = 8):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=gen), torch.randint(0, CLASSES, (n,), generator=gen)


def train_steps(method: base.PromptMethod, x, y, steps: int, lr: float = 0.01):
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        output, loss = train_step(method, optimizer, x, y)
        losses.append(loss.item())
    method.on_batch_end(x, y, output)
    return losses


def test_all_registered():
    assert set(METHODS) <= set(list_methods())


# ------------------------------------------------------------------------------ every method
@pytest.mark.parametrize("name", METHODS)
def test_training_lowers_loss_and_keeps_frozen_parameters(name):
    method = make_method(name)
    trainable = {id(p) for p in method.trainable_parameters()}
    assert not any(id(p) in trainable for p in method.backbone.parameters())
    frozen = {k: v.detach().clone() for k, v in method.named_parameters() if id(v) not in trainable}
    frozen.update({f"backbone.{k}": v.clone() for k, v in method.backbone.named_buffers()})
    assert any(k.startswith("backbone.") for k in frozen)
    x, y = batch()
    losses = train_steps(method, x, y, steps=10)
    assert losses[-1] < losses[0] - 0.05, losses
    state = dict(method.named_parameters())
    state.update({f"backbone.{k}": v for k, v in method.backbone.named_buffers()})
    for key, before in frozen.items():
        assert torch.equal(state[key], before), key
    assert not method.backbone.training  # stays in eval mode in a training method


@pytest.mark.parametrize("name", METHODS)
def test_state_dict_round_trip_reproduces_predictions(name):
    method = make_method(name)
    x, y = batch()
    train_steps(method, x, y, steps=2)
    method.on_expert_start(1)
    train_steps(method, x, y, steps=2)
    method.eval()
    expected = method.predict(x)
    fresh = make_method(name, seed=3)
    fresh.load_state_dict(method.state_dict())
    fresh.eval()
    assert fresh.current_expert == 1
    assert torch.equal(fresh.predict(x), expected)


@pytest.mark.parametrize("name", METHODS)
def test_expert_restricts_selection_and_output(name):
    method = make_method(name).eval()
    for e in range(1, method.num_experts):
        method.on_expert_start(e)
    x, _ = batch(n=4)
    expert = torch.tensor([0, 1, 1, 0])
    output = method(x, expert=expert)
    assert torch.equal(output.expert, expert)
    assert output.logits.shape == (4, CLASSES)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("classifier", ["head", "fc", "identity"])
def test_backbone_classifier_names(name, classifier):
    if classifier == "fc":
        torch.manual_seed(0)
        backbone = FcViT(num_classes=10, **VIT_KW)
    else:
        backbone = make_vit(num_classes=10 if classifier == "head" else 0)
    own = backbone.get_classifier()
    method = make_method(name, backbone=backbone)
    assert isinstance(method.head, nn.Linear) and method.head is not own
    assert method.head.in_features == EMBED and method.head.out_features == CLASSES
    assert torch.count_nonzero(method.head.bias) == 0 and method.head.weight.std() < 0.05
    assert all(not p.requires_grad for p in own.parameters())
    x, y = batch(n=4)
    losses = train_steps(method, x, y, steps=2)
    assert all(torch.isfinite(torch.tensor(losses)))


def test_optimizer_keeps_the_same_parameters_across_expert_starts():
    for name in METHODS:
        method = make_method(name)
        before = [id(p) for p in method.trainable_parameters()]
        for e in range(1, method.num_experts):
            method.on_expert_start(e)
        assert [id(p) for p in method.trainable_parameters()] == before, name


# ------------------------------------------------------------------------------ layers / sizes
def test_layer_positions_clamp_to_depth_or_fail_clearly():
    assert resolve_layers(None, 3, default=(0, 1, 2, 3, 4), what="x") == (0, 1, 2)
    with pytest.raises(ValueError, match="do not fit a backbone of depth 2"):
        resolve_layers(None, 2, default=(2, 3, 4), what="DualPrompt E-prompt")
    with pytest.raises(ValueError, match=r"outside the backbone's 6 blocks"):
        resolve_layers((1, 6), 6, default=(0,), what="x")
    shallow = make_vit(depth=3)
    fly = create_method("flyprompt", shallow, CLASSES, prompt_length=2, router_expansion_dim=16)
    assert fly.prompt_layers == (0, 1, 2) and fly.prompts.shape == (3, 5, 2, EMBED)
    dual = create_method("dualprompt", make_vit(depth=3), CLASSES, e_prompt_length=2)
    assert dual.g_layers == (0, 1) and dual.e_layers == (2,)
    with pytest.raises(ValueError, match="DualPrompt E-prompt"):
        create_method("dualprompt", make_vit(depth=2), CLASSES)
    with pytest.raises(ValueError, match="fewer than top_k"):
        create_method("l2p", make_vit(), CLASSES, num_experts=7)


def test_defaults_use_reference_sizes():
    dual = create_method("dualprompt", make_vit(), CLASSES)
    assert dual.pool_size == 10 and dual.slots_per_step == 2
    assert dual.g_prompts.shape == (1, 10, EMBED) and dual.e_prompts.shape == (10, 60, EMBED)
    l2p = create_method("l2p", make_vit(), CLASSES)
    assert l2p.prompts.shape == (30, 5, EMBED) and l2p.top_k == 5
    mvp = create_method("mvp", make_vit(), CLASSES)
    assert mvp.e_prompts.shape == (5, 60, EMBED) and torch.all(mvp.logit_mask == -1)


# --------------------------------------------------------------------------------------- L2P
def test_l2p_top_k_keys_and_slices():
    method = make_method("l2p").eval()
    query = torch.randn(4, EMBED)
    distance = 1 - F.cosine_similarity(query[:, None], method.keys[None], dim=-1)
    selection = method.select(query, train=False)
    assert torch.equal(selection, distance.argsort(dim=1)[:, :2])
    assert torch.equal(method.expert_of(selection), method.key_expert[selection[:, 0]])
    assert method.key_expert.tolist() == [0, 0, 0, 1, 1, 1]
    expert = torch.tensor([1, 0, 1, 1])
    restricted = method.select(query, train=False, expert=expert)
    assert torch.equal(method.key_expert[restricted], expert[:, None].expand(-1, 2))
    inside = distance.masked_fill(method.key_expert[None] != expert[:, None], float("inf"))
    assert torch.equal(restricted, inside.argsort(dim=1)[:, :2])


def test_l2p_diversified_selection_uses_past_session_frequency():
    method = make_method("l2p", diversified=True)
    query = torch.randn(1, EMBED, generator=torch.Generator().manual_seed(5))
    best = int(method.select(query, train=True)[0, 0])
    x, _ = batch(n=4)
    method.train()(x)
    assert int(method.selection_count.sum()) == 4 * 2
    method.selection_count.zero_()
    method.selection_count[best] = 1000
    method.on_session_end(0)
    assert method.frequency[best] == 1001 and int(method.selection_count.sum()) == 0
    assert best not in method.select(query, train=True)[0].tolist()  # penalised in training
    assert method.select(query, train=False)[0, 0] == best  # inference is plain top-k


# -------------------------------------------------------------------------------- DualPrompt
def test_dualprompt_step_slices_in_training_started_slots_at_inference():
    method = make_method("dualprompt", pool_size=7)  # 3 steps x 2 slots + 1 slot owned by no step
    assert method.slot_step.tolist() == [0, 0, 1, 1, 2, 2, 3]
    queries = method.e_keys.detach().clone()  # query p matches slot p best
    assert set(method.select(queries, train=True).tolist()) <= {0, 1}
    method.on_expert_start(1)
    assert set(method.select(queries, train=True).tolist()) <= {2, 3}
    inference = method.select(queries, train=False)
    assert torch.equal(inference[:4], torch.arange(4)) and set(inference[4:].tolist()) <= {0, 1, 2, 3}
    quirky = make_method("dualprompt", pool_size=7, reference_quirks=True)
    quirky.e_keys.data.copy_(method.e_keys.data)
    assert torch.equal(quirky.select(queries, train=False), torch.arange(7))  # never-trained slots too
    assert method.expert_of(torch.arange(7)).tolist() == [0, 0, 1, 1, 2, 2, 2]
    expert = torch.tensor([2, 2, 0, 0, 1, 1, 2])
    restricted = method.select(queries, train=False, expert=expert)
    assert torch.equal(method.slot_step[restricted], expert)
    method.on_expert_start(2)
    assert torch.equal(method.select(queries, train=False)[:6], torch.arange(6))


def test_dualprompt_key_pull_loss():
    method = make_method("dualprompt").train()
    x, _ = batch(n=4)
    output = method(x)
    key = method.e_keys[output.selection]
    expected = (1 - F.cosine_similarity(output.query.query, key, dim=-1)).mean()
    torch.testing.assert_close(output.aux_loss, expected)


# -------------------------------------------------------------------------------------- MISA
def test_misa_loads_and_tiles_prompt_files(tmp_path):
    from safetensors.torch import save_file

    prompts = misa_prompts()
    g_path, e_path = tmp_path / "g_prompt.pt", tmp_path / "e_prompt.safetensors"
    torch.save(prompts["g_prompt"], g_path)
    save_file({"prompt": prompts["e_prompt"]}, str(e_path))
    kwargs = {k: v for k, v in method_kwargs("misa").items() if k not in prompts}
    method = create_method("misa", make_vit(), CLASSES, g_prompt=g_path, e_prompt=str(e_path), **kwargs)
    assert torch.equal(method.g_prompts.data, prompts["g_prompt"])
    assert torch.equal(method.e_prompts.data, prompts["e_prompt"].repeat(2, 1, 1))
    smaller = create_method("misa", make_vit(), CLASSES, **dict(kwargs, pool_size=3, num_experts=3), **prompts)
    assert torch.equal(smaller.e_prompts.data, prompts["e_prompt"])
    with pytest.raises(ValueError, match=r"MISA e_prompt: loaded shape \(3, 9, 16\)"):
        create_method(
            "misa", make_vit(), CLASSES, g_prompt=prompts["g_prompt"], e_prompt=torch.zeros(3, 9, 16), **kwargs
        )
    with pytest.raises(ValueError, match="MISA g_prompt"):
        create_method("misa", make_vit(), CLASSES, g_prompt=torch.zeros(2, 4, EMBED), e_prompt=e_path, **kwargs)
    with pytest.raises(FileNotFoundError):
        create_method("misa", make_vit(), CLASSES, g_prompt=tmp_path / "missing.pt", e_prompt=e_path, **kwargs)
    torch.save({"a": torch.zeros(1), "b": torch.zeros(1)}, tmp_path / "two.pt")
    with pytest.raises(ValueError, match="single prompt tensor"):
        create_method("misa", make_vit(), CLASSES, g_prompt=tmp_path / "two.pt", e_prompt=e_path, **kwargs)


# --------------------------------------------------------------------------------------- MVP
def test_mvp_query_and_router_from_one_pass():
    method = make_method("mvp")
    x, _ = batch(n=4)
    query = method.compute_query(x)
    torch.testing.assert_close(query.query, frozen_cls(method.backbone, x, depth=DEPTH - 1, norm=False))
    torch.testing.assert_close(query.router, frozen_cls(method.backbone, x))


def test_mvp_count_scaled_selection_and_counting():
    method = make_method("mvp")
    noise = 0.05 * torch.randn(3, EMBED, generator=torch.Generator().manual_seed(5))
    query = method.keys.detach() + noise  # query p matches key p best, at a distance > 0
    assert torch.equal(method.select(query, train=False), torch.arange(3))
    method.count[0] = 10**6
    selection = method.select(query, train=False)
    distance = 1 - F.cosine_similarity(query[:, None], method.keys[None], dim=-1)
    assert torch.equal(selection, (distance * (method.count + 1)).argmin(dim=1))
    assert selection[0] != 0
    assert torch.equal(method.select(query, train=False, expert=torch.tensor([2, 2, 0])), torch.tensor([2, 2, 0]))
    method.count.zero_()
    x, _ = batch(n=4)
    output = method.train()(x)
    assert torch.equal(method.count, torch.bincount(output.selection, minlength=3))
    method.eval()(x)
    assert int(method.count.sum()) == 4  # never counted at inference
    assert torch.equal(method.expert_of(output.selection), output.selection)


def test_mvp_instance_mask_applies_to_ensembles():
    method = make_method("mvp")
    with torch.no_grad():
        method.logit_mask.copy_(torch.randn_like(method.logit_mask))
    selection = torch.tensor([0, 2])
    logits = torch.randn(2, 3, CLASSES)
    scale = 2 * torch.sigmoid(method.logit_mask[selection])
    torch.testing.assert_close(method.transform_logits(logits, selection), logits * scale[:, None])
    torch.testing.assert_close(method.transform_logits(logits[:, 0], selection), logits[:, 0] * scale)


def test_mcr_closed_form_matches_per_sample_autograd():
    gen = torch.Generator().manual_seed(0)
    features, scale = torch.randn(6, 4, generator=gen), 2 * torch.rand(6, 5, generator=gen)
    target = torch.tensor([0, 1, 1, 3, 4, 0])
    mask = torch.tensor([0.0, 0.0, float("-inf"), 0.0, 0.0])  # class 2 unseen (no target)
    head = nn.Linear(4, 5)
    logits = head(features) * scale + mask
    sample_grad, batch_grad = mcr_gradients(features, logits.softmax(dim=1).detach(), scale, target)
    for i in range(6):
        loss_i = F.cross_entropy(logits[i : i + 1], target[i : i + 1])
        (grad,) = torch.autograd.grad(loss_i, head.weight, retain_graph=True)
        torch.testing.assert_close(sample_grad[i], grad[target[i]])
    (grad,) = torch.autograd.grad(F.cross_entropy(logits, target), head.weight)
    torch.testing.assert_close(batch_grad, grad[target])


def test_mvp_reference_quirk_losses():
    x, y = batch(n=6)
    fixed = make_method("mvp").train()
    quirky = make_method("mvp", reference_quirks=True).train()
    fixed.count.copy_(torch.tensor([3, 0, 7]))
    quirky.count.copy_(fixed.count)
    out_f, out_q = fixed(x), quirky(x)
    assert torch.equal(out_f.selection, out_q.selection)
    sel, q = out_f.selection, out_f.query.query
    mass = (torch.tensor([3, 0, 7]) + 1).float()[sel]
    key_d = (1 - F.cosine_similarity(fixed.keys[:, None], fixed.keys[None], dim=-1))[sel]
    query_d = 1 - F.cosine_similarity(q, fixed.keys[sel], dim=-1)
    a_pairs = torch.stack([(key_d[i] / mass[j]).exp() for i in range(6) for j in range(6)]).mean()
    b_pairs = torch.stack([(query_d[i] / mass[j]).exp() for i in range(6) for j in range(6)]).mean()
    torch.testing.assert_close(out_q.aux_loss, -(a_pairs / (a_pairs + b_pairs) + 1e-6).log())
    a, b = (key_d / mass[:, None]).exp().mean(), (query_d / mass).exp().mean()
    torch.testing.assert_close(out_f.aux_loss, -(a / (a + b) + 1e-6).log())
    assert torch.isfinite(fixed.loss(out_f, y)) and torch.isfinite(quirky.loss(out_q, y))
    assert not torch.equal(fixed.loss(out_f, y), quirky.loss(out_q, y))


# --------------------------------------------------------------------------------- FlyPrompt
def test_flyprompt_routes_among_started_experts_and_ensembles():
    method = make_method("flyprompt")
    x, y = batch(n=8)
    x0, x1 = x + 2.0, x - 2.0
    method.eval()
    assert torch.equal(method.select(method.compute_query(x).query, train=False), torch.zeros(8, dtype=torch.long))
    train_steps(method, x0, y, steps=2)  # router learns expert 0 on x0
    method.on_expert_start(1)
    assert torch.equal(method.prompts[:, 1], method.prompts[:, 0])  # mean of the one earlier expert
    torch.testing.assert_close(method.ensemble.ema_weight[1], method.head.weight.detach().expand(2, -1, -1))
    method.eval()
    assert torch.equal(method.route(method.compute_query(x1).router), torch.zeros(8, dtype=torch.long))
    train_steps(method, x1, y, steps=2)  # expert 1 on x1
    method.eval()
    routed = method.route(method.compute_query(torch.cat([x0, x1])).router)
    assert torch.equal(routed, torch.tensor([0] * 8 + [1] * 8))
    scores = method.router(method.compute_query(x).router)
    assert scores.shape == (8, 3) and bool((method.route(method.compute_query(x).router) < 2).all())
    method.on_expert_start(2)
    torch.testing.assert_close(method.prompts[:, 2], method.prompts[:, :2].mean(dim=1))
    prompts_2 = method.prompts.detach().clone()
    method.on_expert_start(2)  # restarting a started expert keeps its prompts
    assert torch.equal(method.prompts, prompts_2)
    mask = torch.tensor([0.0, 0.0, 0.0, float("-inf"), float("-inf")])
    expected = method.ensemble(method.forward_features(x1, routed[8:]), routed[8:], mask)
    scores = method.predict(x1, mask)
    assert torch.equal(scores, expected) and bool((scores.argmax(dim=1) < 3).all())


def test_flyprompt_ema_follows_optimizer_steps_of_the_active_expert():
    method = make_method("flyprompt")
    method.on_expert_start(1)
    bank_0 = method.ensemble.ema_weight[0].clone()
    x, y = batch(n=4)
    train_steps(method, x, y, steps=3)
    assert torch.equal(method.ensemble.ema_weight[0], bank_0)
    assert int(method.ensemble.num_updates[1]) == 3
    assert int(method.router.counts[1]) == 4 and int(method.router.counts[0]) == 0
