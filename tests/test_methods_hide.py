"""Tests of the HiDe-Prompt / NoRGa reference implementations (benchmarks/methods/hide.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

timm = pytest.importorskip("timm")
from timm.layers import Attention  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

from benchmarks.methods.base import create_method, frozen_cls, list_methods  # noqa: E402
from benchmarks.methods.hide import HiDeOutput, HiDePrompt, NoRGa  # noqa: E402
from benchmarks.methods.prefix_attention import prefix_attention, prefixed_block  # noqa: E402

NUM_CLASSES = 6
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=6, num_heads=2)
FAST_CA = dict(ca_samples_per_class=8, ca_steps=5, ca_batch_size=16)



def tiny_vit(seed: int = 0, **kwargs) -> VisionTransformer:
    torch.manual_seed(seed)
    cfg = dict(TINY, num_classes=0)
    cfg.update(kwargs)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, **cfg)


def make(method: str, seed: int = 0, backbone=None, **kwargs):
    kw = dict(num_tasks=2, **FAST_CA)
    kw.update(kwargs)
    backbone = tiny_vit(seed) if backbone is None else backbone
    torch.manual_seed(seed + 100)
    return create_method(method, backbone, NUM_CLASSES, **kw)


def images(n: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def batch_mask(y: torch.Tensor) -> torch.Tensor:
    mask = torch.full((NUM_CLASSES,), float("-inf"))
    mask[y] = 0.0
    return mask


def train_steps(method, optimizer, x, y, steps: int):
    method.train()
    losses = []
    for _ in range(steps):
        out = method(x)
        loss = method.loss(out, y, batch_mask(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# ------------------------------------------------------------------------- prefixed attention
@pytest.mark.parametrize(
    "extra",
    [{}, {"qk_norm": True, "init_values": 0.1}],
    ids=["plain", "qknorm-layerscale"],
)
def test_prefixed_block_without_prefix_equals_timm_block(extra):
    vit = tiny_vit(**extra).eval()
    x = torch.randn(3, 17, 32)
    empty = torch.zeros(3, 2, 0, 16)
    with torch.no_grad():
        for block in vit.blocks:
            expected = block(x)
            torch.testing.assert_close(prefixed_block(block, x), expected, rtol=0, atol=1e-6)
            torch.testing.assert_close(prefixed_block(block, x, empty, empty), expected, rtol=0, atol=1e-6)
            # the explicit-score (NoRGa) path with no prefix is plain attention too
            gated = prefixed_block(block, x, empty, empty, gate=torch.tensor([0.5, 2.0]))
            torch.testing.assert_close(gated, expected, rtol=1e-5, atol=1e-5)
            block.attn.fused_attn = False  # timm's explicit path agrees as well
            torch.testing.assert_close(prefixed_block(block, x), block(x), rtol=1e-5, atol=1e-5)
            x = expected


def _naive_prefix_attention(attn, x, pk, pv, gate):
    """Loop-by-loop prefix attention over scalars (the formula of docs/protocol.md §4.7/§4.8)."""
    B, N, D = x.shape
    H, hd = attn.num_heads, attn.head_dim
    qkv = attn.qkv(x).reshape(B, N, 3, H, hd)
    out = torch.zeros(B, N, H, hd, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            keys = [pk[b, h, j] for j in range(pk.shape[2])] + [qkv[b, n, 1, h] for n in range(N)]
            values = [pv[b, h, j] for j in range(pv.shape[2])] + [qkv[b, n, 2, h] for n in range(N)]
            for i in range(N):
                q = qkv[b, i, 0, h]
                scores = []
                for j, key in enumerate(keys):
                    s = float(q @ key) * hd**-0.5
                    if gate is not None and j < pk.shape[2]:
                        a, g = float(gate[0]), float(gate[1])
                        s = s + g / (1.0 + torch.exp(torch.tensor(-a * s, dtype=torch.float64)).item())
                    scores.append(s)
                probs = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
                out[b, i, h] = sum(p * val.double() for p, val in zip(probs, values))
    return attn.proj(out.reshape(B, N, H * hd).float())


@pytest.mark.parametrize(
    "gate", [None, (0.7, -1.3), (1.0, 1.0)], ids=["hide", "norga-a0.7-b-1.3", "norga-init"]
)
def test_prefix_attention_matches_naive_reference(gate):
    torch.manual_seed(3)
    attn = Attention(4, num_heads=2, qkv_bias=True).eval()
    x = torch.randn(2, 3, 4)
    pk, pv = torch.randn(2, 2, 2, 2), torch.randn(2, 2, 2, 2)
    gate_t = None if gate is None else torch.tensor(gate)
    with torch.no_grad():
        got = prefix_attention(attn, x, pk, pv, gate=gate_t)
        expected = _naive_prefix_attention(attn, x, pk, pv, gate_t)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_norga_gating_changes_only_prefix_scores():
    torch.manual_seed(4)
    attn = Attention(4, num_heads=2).eval()
    x = torch.randn(1, 3, 4)
    pk, pv = torch.randn(1, 2, 2, 2), torch.randn(1, 2, 2, 2)
    with torch.no_grad():
        plain = prefix_attention(attn, x, pk, pv)
        # b = 0 switches the gate off whatever a is
        torch.testing.assert_close(prefix_attention(attn, x, pk, pv, gate=torch.tensor([3.0, 0.0])), plain)
        assert not torch.allclose(prefix_attention(attn, x, pk, pv, gate=torch.tensor([1.0, 1.0])), plain)


def test_zero_length_prefix_method_equals_frozen_backbone():
    for name in ("hide", "norga"):
        method = make(name, prefix_length=0).eval()
        x = images(4)
        with torch.no_grad():
            expected = frozen_cls(method.backbone, x)
            torch.testing.assert_close(method.forward_features(x, 1), expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- construction
def test_registry_and_class_attributes():
    assert {"hide", "norga"} <= set(list_methods())
    hide, norga = make("hide"), make("norga")
    assert type(hide) is HiDePrompt and type(norga) is NoRGa
    for m in (hide, norga):
        assert m.session_aware and m.default_lr == 0.003
        assert m.num_experts == m.num_tasks == 2 and m.current_expert == 0
        assert m.get_classifier() is m.head is m.prompt_head
        assert m.prefix_layers == (0, 1, 2, 3, 4)
        assert m.e_prompt.prompt.shape == (5, 2, 2, 5, 2, 16)
    assert hide.e_prompt.act_scale is None
    assert norga.e_prompt.act_scale.shape == (5, 2, 1, 1) and bool((norga.e_prompt.act_scale == 1).all())


def test_prefix_layers_clamped_and_checked():
    shallow = create_method("hide", tiny_vit(depth=3), NUM_CLASSES, num_tasks=2)
    assert shallow.prefix_layers == (0, 1, 2)
    explicit = create_method("hide", tiny_vit(), NUM_CLASSES, num_tasks=2, prefix_layers=[4, 1])
    assert explicit.prefix_layers == (1, 4)
    with pytest.raises(ValueError, match="block indices"):
        create_method("hide", tiny_vit(), NUM_CLASSES, prefix_layers=[6])
    with pytest.raises(ValueError, match="prefix_layers"):
        create_method("hide", tiny_vit(), NUM_CLASSES, prefix_layers=0)
    with pytest.raises(ValueError, match="class token"):
        create_method("hide", tiny_vit(class_token=False, global_pool="avg"), NUM_CLASSES)
    with pytest.raises(ValueError, match="router_features"):
        create_method("hide", tiny_vit(), NUM_CLASSES, router_features="prompt")
    with pytest.raises(ValueError, match="disagree"):
        create_method("hide", tiny_vit(), NUM_CLASSES, num_tasks=3, num_experts=4)


def test_router_features_option():
    x = images(4)
    default = make("hide").eval()
    q = default.compute_query(x)
    torch.testing.assert_close(q.router, frozen_cls(default.backbone, x))
    assert q.router is q.query and default.router_dim == 32
    reference = make("hide", router_features="g_mlp").eval()
    q = reference.compute_query(x)
    with torch.no_grad():
        torch.testing.assert_close(q.router, reference.g_mlp(q.query))
    assert not q.router.requires_grad


# --------------------------------------------------------------------------------- training
@pytest.mark.parametrize("name", ["hide", "norga"])
def test_training_decreases_loss_and_keeps_backbone_frozen(name):
    method = make(name)
    frozen = {k: v.clone() for k, v in method.backbone.state_dict().items()}
    trainable = {id(p) for p in method.trainable_parameters()}
    heads = [*method.head.parameters(), *method.g_mlp.parameters(), *method.g_head.parameters()]
    expected = {id(p) for p in [method.e_prompt.prompt, *heads]}
    if name == "norga":
        expected.add(id(method.e_prompt.act_scale))
    assert trainable == expected
    before = {n: p.detach().clone() for n, p in method.named_parameters() if p.requires_grad}

    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=0.01)
    x, y = images(8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    method.on_expert_start(0)
    losses = train_steps(method, optimizer, x, y, 8)
    assert losses[-1] < losses[0]
    out = method(x)
    assert isinstance(out, HiDeOutput) and out.gate_logits.shape == (8, NUM_CLASSES)
    assert out.logits.shape == (8, NUM_CLASSES) and out.features.shape == (8, 32)
    assert torch.equal(out.selection, torch.zeros(8, dtype=torch.long))
    assert torch.equal(out.expert, out.selection)

    for k, v in method.backbone.state_dict().items():
        assert torch.equal(v, frozen[k]), k
    assert all(not p.requires_grad for p in method.backbone.parameters())
    assert not method.backbone.training
    for n, p in method.named_parameters():
        if p.requires_grad:
            assert not torch.equal(p, before[n]), f"{n} did not train"
    # only task 0's prefix received gradients (task 1's slice is untouched by Adam: zero grads, zero moments)
    assert torch.equal(method.e_prompt.prompt[:, :, 1], before["e_prompt.prompt"][:, :, 1])


@pytest.mark.parametrize("name", ["hide", "norga"])
def test_two_sessions_and_state_dict_round_trip(name):
    method = make(name)
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=0.01)
    x0, y0 = images(8, seed=1), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    # class 1 is blurry: it reappears in session 1 and keeps session 0 as its first session
    x1, y1 = images(8, seed=2), torch.tensor([3, 4, 5, 1, 3, 4, 5, 3])
    method.on_expert_start(0)
    train_steps(method, optimizer, x0, y0, 3)
    method.on_session_end(0)
    method.on_expert_start(1)
    train_steps(method, optimizer, x1, y1, 3)
    method.on_session_end(1)
    assert method.class_first_session.tolist() == [0, 0, 0, 1, 1, 1]
    assert int(method.sessions_completed) == 2

    method.eval()
    x = torch.cat([x0, x1])
    scores = method.predict(x)
    assert scores.shape == (16, NUM_CLASSES) and torch.isfinite(scores).all()

    fresh = make(name, seed=7)  # other random backbone and heads: everything must come from the state
    fresh.load_state_dict(method.state_dict())
    fresh.eval()
    assert fresh.current_expert == 1
    assert torch.equal(fresh.predict(x), scores)
    assert torch.equal(fresh(x).selection, method(x).selection)
    if name == "norga":
        assert not fresh.e_prompt.act_scale.requires_grad
    clone = copy.deepcopy(method)
    assert torch.equal(clone.predict(x), scores)


def test_norga_gate_frozen_after_first_session():
    method = make("norga")
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=0.01)
    x, y = images(8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    method.on_expert_start(0)
    train_steps(method, optimizer, x, y, 3)
    scale = method.e_prompt.act_scale
    assert not torch.equal(scale, torch.ones_like(scale)), "a, b must train in the first session"
    method.on_session_end(0)
    assert not scale.requires_grad and scale.grad is None
    assert all(p is not scale for p in method.trainable_parameters())
    frozen = scale.detach().clone()
    method.on_expert_start(1)
    train_steps(method, optimizer, images(8, seed=5), torch.tensor([3, 4, 5, 3, 4, 5, 0, 1]), 3)  # same Adam
    assert torch.equal(scale, frozen)
    method.on_session_end(1)
    assert not scale.requires_grad


# ----------------------------------------------------------------------- task identification
def test_task_from_gate_uses_first_session_of_exposed_class():
    method = make("hide")
    method.class_first_session.copy_(torch.tensor([0, 0, 1, 1, -1, -1]))
    method.current_expert = 1
    logits = torch.tensor(
        [
            [5.0, 0, 0, 0, 0, 0],  # class 0 -> task 0
            [0, 0, 5.0, 0, 0, 0],  # class 2 -> task 1
            [0, 3.0, 0, 0, 9.0, 9.0],  # unexposed classes 4, 5 are masked out -> class 1 -> task 0
            [0, 0, 0, 2.0, 0, 0],  # class 3 -> task 1
        ]
    )
    assert method.task_from_gate(logits).tolist() == [0, 1, 0, 1]
    method.class_first_session.fill_(-1)  # nothing exposed yet: current task
    assert method.task_from_gate(logits).tolist() == [1, 1, 1, 1]


def test_observe_keeps_first_session():
    method = make("hide")
    method.on_expert_start(0)
    method.observe(torch.tensor([0, 1, 1, 0]))
    method.on_expert_start(1)
    method.observe(torch.tensor([1, 2, 3, 2]))
    assert method.class_first_session.tolist() == [0, 0, 1, 1, -1, -1]
    assert method.exposed_mask().tolist() == [True, True, True, True, False, False]


@pytest.mark.parametrize("name", ["hide", "norga"])
def test_inference_picks_the_prefix_of_the_predicted_class_session(name):
    method = make(name).eval()
    with torch.no_grad():
        method.e_prompt.prompt.normal_(0, 1.0)  # make the two tasks' prefixes clearly different
        method.class_first_session.copy_(torch.tensor([0, 0, 1, 1, -1, -1]))
        method.g_head.weight.zero_()
        # class 4 is not exposed, so the gate predicts class 2, first seen in session 1
        method.g_head.bias.copy_(torch.tensor([0.0, 0, 4.0, 0, 9.0, 0]))
    x = images(4)
    out = method(x)
    assert out.selection.tolist() == [1, 1, 1, 1]
    with torch.no_grad():
        task1 = method.head(method.forward_features(x, 1))
        task0 = method.head(method.forward_features(x, 0))
    torch.testing.assert_close(out.logits, task1)
    assert not torch.allclose(task0, task1)
    # a routed expert (or the official task_id override) replaces the gate's choice
    routed = method(x, expert=torch.tensor([0, 1, 0, 1]))
    assert routed.selection.tolist() == [0, 1, 0, 1]
    torch.testing.assert_close(routed.logits[0], task0[0])
    torch.testing.assert_close(routed.logits[1], task1[1])
    torch.testing.assert_close(method(x, task_id=0).logits, task0)
    with pytest.raises(ValueError):
        method(x, task_id=2)


# --------------------------------------------------------------- statistics, orthogonality, CA
def test_statistics_are_per_class_diagonals():
    method = make("hide")
    torch.manual_seed(0)
    y = torch.tensor([0, 2, 2, 5, 0, 2])
    p, g = torch.randn(6, 32), torch.randn(6, 32)
    method._update_statistics(p, g, y)
    method._update_statistics(p, g, y)  # twice: sums accumulate
    for c in range(NUM_CLASSES):
        sel = y == c
        assert method.class_count[c] == 2 * sel.sum()
        torch.testing.assert_close(method.prompt_sum[c], 2 * p[sel].double().sum(0))
        torch.testing.assert_close(method.gate_sqsum[c], 2 * g[sel].double().square().sum(0))
    classes, mean, var = method.class_gaussians("prompt")
    assert classes.tolist() == [0, 2, 5]
    for k, c in enumerate(classes.tolist()):
        feats = p[y == c].double()
        torch.testing.assert_close(mean[k], feats.mean(0))
        torch.testing.assert_close(var[k], feats.var(0, unbiased=False).clamp_min(1e-5))


def test_old_class_mask_and_orthogonality_use_exposure_indices():
    """6.2.4: the old-class mask, the statistics and the logits share one (exposure-order) index space."""
    method = make("hide")
    torch.manual_seed(0)
    method.class_first_session.copy_(torch.tensor([0, 1, 0, -1, 1, -1]))
    method.current_expert = 1
    y = torch.tensor([0, 1, 2, 4])
    method._update_statistics(torch.randn(4, 32), torch.randn(4, 32), y)
    assert method.old_class_mask().tolist() == [True, False, True, False, False, False]
    feats = torch.randn(5, 32)
    protos = F.normalize(method.prompt_sum[[0, 2]].float(), dim=-1)
    expected = (feats @ protos.t()).square().mean()
    got = method._orthogonality(feats, method.prompt_sum, method.old_class_mask())
    torch.testing.assert_close(got, expected)
    method.current_expert = 0  # no old classes in the first session
    assert method._orthogonality(feats, method.prompt_sum, method.old_class_mask()) == 0


def test_loss_composition():
    method = make("hide", lam_orth=0.5)
    method.on_expert_start(1)
    method.class_first_session.copy_(torch.tensor([0, 0, -1, -1, -1, -1]))
    method._update_statistics(torch.randn(2, 32), torch.randn(2, 32), torch.tensor([0, 1]))
    method.train()
    x, y = images(4), torch.tensor([2, 3, 1, 2])
    out = method(x)
    mask = batch_mask(y)
    loss = method.loss(out, y, mask)  # updates the table and statistics first, like the reference
    exposed = torch.tensor([True, True, True, True, False, False])
    old = method.old_class_mask()
    assert old.tolist() == [True, True, False, False, False, False]
    orth_prompt = method._orthogonality(out.features, method.prompt_sum, old)
    orth_gate = method._orthogonality(out.gate_features, method.gate_sum, old)
    assert orth_prompt > 0 and orth_gate > 0
    expected = (
        F.cross_entropy(out.logits + mask, y)
        + F.cross_entropy(out.gate_logits.masked_fill(~exposed, float("-inf")), y)
        + 0.5 * (orth_prompt + orth_gate)
    )
    torch.testing.assert_close(loss, expected)
    assert method.class_count.tolist() == [1, 2, 2, 1, 0, 0]


def test_classifier_alignment_changes_both_heads_only():
    method = make("hide")
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=0.01)
    method.on_expert_start(0)
    train_steps(method, optimizer, images(8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), 2)
    state = {k: v.clone() for k, v in method.state_dict().items() if k != "_extra_state"}
    with torch.no_grad():  # CA must train even when called under no_grad
        method.on_session_end(0)
    after = method.state_dict()
    changed = {k for k, v in state.items() if not torch.equal(v, after[k])}
    assert changed == {"head.weight", "head.bias", "g_head.weight", "g_head.bias", "sessions_completed"}

    no_ca = make("hide", ca_steps=0)
    before = copy.deepcopy(no_ca.head.state_dict())
    no_ca._update_statistics(torch.randn(4, 32), torch.randn(4, 32), torch.tensor([0, 0, 1, 1]))
    no_ca.on_session_end(0)
    assert all(torch.equal(v, no_ca.head.state_dict()[k]) for k, v in before.items())


# ------------------------------------------------------------------------- other classifiers
class FcViT(VisionTransformer):
    """A ViT whose classifier is called ``fc`` (as in FlyGCL's vendored ViT)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.fc = self.head
        del self.head

    def get_classifier(self):
        return self.fc

    def forward_head(self, x, pre_logits: bool = False):
        x = self.head_drop(self.fc_norm(self.pool(x)))
        return x if pre_logits else self.fc(x)


@pytest.mark.parametrize("kind", ["head", "fc"])
@pytest.mark.parametrize("name", ["hide", "norga"])
def test_backbones_with_head_or_fc_classifier(name, kind):
    torch.manual_seed(0)
    if kind == "head":
        backbone = tiny_vit(num_classes=10)
        assert isinstance(backbone.get_classifier(), torch.nn.Linear)
    else:
        backbone = FcViT(num_classes=10, **TINY)
        assert not hasattr(backbone, "head") and backbone.get_classifier() is backbone.fc
    classifier = copy.deepcopy(backbone.get_classifier().state_dict())
    method = create_method(name, backbone, NUM_CLASSES, num_tasks=2, **FAST_CA)
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=0.01)
    x, y = images(4), torch.tensor([0, 1, 0, 1])
    method.on_expert_start(0)
    train_steps(method, optimizer, x, y, 2)
    method.on_session_end(0)
    method.eval()
    assert method.predict(x).shape == (4, NUM_CLASSES)
    assert method.get_classifier() is method.head
    assert backbone(x).shape == (4, 10)  # the backbone itself still works (its classifier is unused)
    after = backbone.get_classifier().state_dict()
    assert all(torch.equal(v, after[k]) for k, v in classifier.items())
