"""The ``reference`` adapter on the project's reference methods (``fly_modules.adapters.SeamContract``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
from method_steps import train_step
from torch import nn

timm = pytest.importorskip("timm")

from fly_modules.adapters import SeamContract, SeamError, list_families, retrofit  # noqa: E402
from fly_modules.adapters.contract import SEAM_MEMBERS, missing_seams  # noqa: E402

from benchmarks.methods import list_methods, method_class  # noqa: E402
from benchmarks.methods.base import PromptMethod, QueryFeatures, create_method  # noqa: E402
from fly_modules import InvalidParameterError, SessionSchedule, _compat  # noqa: E402

EMBED, CLASSES = 32, 5
METHODS = ["l2p", "dualprompt", "misa", "mvp", "hide", "norga"]
VARIANTS = {"baseline": (False, False), "router": (True, False), "ensemble": (False, True), "both": (True, True)}
SMALL_ROUTER = dict(expansion_dim=128, ridge=1e-2)



def make_vit(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, patch_size=8, embed_dim=EMBED,
        depth=4, num_heads=2,
    )


def method_kwargs(name: str, tmp_path) -> Dict[str, Any]:
    if name == "misa":
        # G: layers (0, 1) x 2 tokens; E: layers (2, 3) of the depth-4 backbone x 3 tokens, 2 slots in the file.
        gen = torch.Generator().manual_seed(7)
        g_file, e_file = tmp_path / "g_prompt.pt", tmp_path / "e_prompt.pt"
        torch.save(torch.randn(1, 4, EMBED, generator=gen), g_file)
        torch.save(torch.randn(2, 6, EMBED, generator=gen), e_file)
        return dict(num_experts=2, pool_size=4, g_prompt_length=2, e_prompt_length=3, g_prompt=g_file, e_prompt=e_file)
    return {
        "l2p": dict(num_experts=2, pool_size=4, prompt_length=2, top_k=2),
        "dualprompt": dict(num_experts=2, pool_size=4, g_prompt_length=2, e_prompt_length=3),
        "mvp": dict(num_experts=2, g_prompt_length=2, e_prompt_length=3),
        "hide": dict(num_tasks=2, prefix_length=2, prefix_layers=2, ca_steps=2, ca_samples_per_class=4),
        "norga": dict(num_tasks=2, prefix_length=2, prefix_layers=2, ca_steps=2, ca_samples_per_class=4),
    }[name]


def make_method(name: str, tmp_path, seed: int = 0) -> nn.Module:
    backbone = make_vit(seed)
    torch.manual_seed(seed + 100)
    return create_method(name, backbone, CLASSES, **method_kwargs(name, tmp_path))


def batch(seed: int = 1, n: int = 8) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=gen), torch.randint(0, CLASSES, (n,), generator=gen)


def hook_counts(module: nn.Module) -> List[Tuple[int, int]]:
    return [_compat.hook_counts(m) for m in module.modules()]


# ------------------------------------------------------------------------------ the contract
def test_every_registered_method_implements_the_seam_contract(tmp_path):
    assert SeamContract in PromptMethod.__mro__  # declared, not only matched
    single_expert = {"linear-probe", "ranpac", "ranpac-frozen", "ranpac-collect", "seq-ft", "seq-ft-sl"}
    task_experts = {"coda-prompt", "s-prompt"}  # tests/test_methods_coda_sprompt.py retrofits and verifies them
    assert set(METHODS) | {"flyprompt", "hide-lora", "hide-adapter", "sd-lora"} | single_expert | task_experts == set(
        list_methods())
    for name in list_methods():
        assert issubclass(method_class(name), PromptMethod), name
        if name in METHODS:
            method = make_method(name, tmp_path)
        else:
            method = create_method(name, make_vit(), CLASSES, **({} if name in single_expert else {"num_experts": 2}))
        assert isinstance(method, SeamContract) and missing_seams(method) == (), name
    assert not isinstance(nn.Linear(2, 2), SeamContract)
    assert missing_seams(nn.Linear(2, 2)) == tuple(m for m in SEAM_MEMBERS if m != "forward")


def test_the_installed_package_states_the_contract_without_the_benchmarks():
    root = Path(__file__).resolve().parents[1]
    for path in sorted([*(root / "adapters").rglob("*.py"), *(root / "fly_modules").rglob("*.py")]):
        assert "benchmarks.methods" not in path.read_text(), path


def test_upstream_families_refuse_a_seam_contract_model_and_name_the_reference_family(tmp_path):
    method = make_method("dualprompt", tmp_path)
    for name in METHODS:
        with pytest.raises(InvalidParameterError, match=r"implements fly_modules\.adapters\.SeamContract.*'reference'"):
            retrofit(method, name, router=False, ensemble=False)
    handle = retrofit(method, "reference", router=False, ensemble=False)  # no refused call left a retrofit behind
    assert handle.family == "reference"


# ----------------------------------------------------------------------------------- registry
def test_every_method_name_is_registered():
    assert set(METHODS) | {"reference", "generic"} <= set(list_families())


def test_unknown_structure_names_the_missing_seam_and_the_generic_adapter():
    for name in METHODS:
        with pytest.raises(SeamError, match=r"generic\.retrofit") as info:
            retrofit(nn.Sequential(nn.Linear(3, 3)), name, num_experts=2)
        assert "prompt" in str(info.value) or "backbone" in str(info.value), str(info.value)


# ------------------------------------------------------------------------------ the four checks
@pytest.mark.parametrize("name", METHODS)
def test_baseline_variant_is_bit_identical(name, tmp_path):
    method = make_method(name, tmp_path)
    original = copy.deepcopy(method)
    hooks = hook_counts(method)
    handle = retrofit(method, "reference", router=False, ensemble=False)
    assert hook_counts(method) == hooks and handle.router is None and handle.ensemble is None
    x, _ = batch()
    for mode in (True, False):
        method.train(mode), original.train(mode)
        assert torch.equal(method(x).logits, original(x).logits)
    assert torch.equal(method.predict(x), original.predict(x))


def _clusters(dim: int, n: int, seed: int = 3) -> Tuple[torch.Tensor, torch.Tensor]:
    """Two well-separated clusters (same centres for every seed; the seed draws the noise)."""
    direction = torch.nn.functional.normalize(torch.randn(dim, generator=torch.Generator().manual_seed(0)), dim=0)
    gen = torch.Generator().manual_seed(seed)
    noise = lambda: 0.1 * torch.randn(n, dim, generator=gen)  # noqa: E731
    return noise() + 3 * direction, noise() - 3 * direction


@pytest.mark.parametrize("name", METHODS)
def test_router_restricts_inference_selection_and_leaves_training_alone(name, tmp_path):
    method = make_method(name, tmp_path)
    for expert in range(1, method.num_experts):
        method.on_expert_start(expert)
    original = copy.deepcopy(method)
    handle = retrofit(method, "reference", router=True, ensemble=False, **SMALL_ROUTER)
    x, _ = batch(n=4)
    # training: selection and logits unchanged, and the batch's query is recorded for the router
    method.train(), original.train()
    out, ref = method(x), original(x)
    assert torch.equal(out.selection, ref.selection) and torch.equal(out.logits, ref.logits)
    handle.end_batch()
    assert handle.router.num_samples == 4
    handle.router.reset_statistics()
    # crafted router features: two clusters labelled 0 and 1
    zero, one = _clusters(handle.router.in_features, 16)
    handle.router.update(zero, 0)
    handle.router.update(one, 1)
    probe_zero, probe_one = _clusters(handle.router.in_features, 2, seed=4)
    crafted = torch.stack([probe_zero[0], probe_one[0], probe_one[1], probe_zero[1]])
    expected = torch.tensor([0, 1, 1, 0])
    real_query = method.compute_query
    method.compute_query = lambda images: QueryFeatures(query=real_query(images).query, router=crafted)
    method.eval()
    out = method(x)
    assert torch.equal(out.expert, expected)
    direct = original.eval()(x, expert=expected)
    assert torch.equal(out.selection, direct.selection) and torch.equal(out.logits, direct.logits)


def _naive_ensemble(method, handle, x, mask):
    output = method(x)
    banks = method.bank_of(output.selection)
    ensemble = handle.ensemble
    scores = []
    for i in range(x.shape[0]):
        f, b = output.features[i], int(banks[i])
        members = [ensemble.online(f)] + [
            ensemble.ema_weight[b, j] @ f + ensemble.ema_bias[b, j] for j in range(ensemble.num_decays)
        ]
        logits = method.transform_logits(torch.stack(members).unsqueeze(0), output.selection[i : i + 1])[0] + mask
        scores.append(logits.softmax(dim=-1).amax(dim=0))
    return torch.stack(scores)


@pytest.mark.parametrize("name", METHODS)
def test_ensemble_trains_online_head_follows_ema_and_aggregates_the_bank(name, tmp_path):
    method = make_method(name, tmp_path)
    original = copy.deepcopy(method)
    optimizer = torch.optim.SGD(method.trainable_parameters(), lr=0.5)
    handle = retrofit(method, "reference", router=False, ensemble=True, optimizer=optimizer)
    ensemble = handle.ensemble
    assert ensemble.online is method.get_classifier()
    x, y = batch()
    method.train(), original.train()
    assert torch.equal(method(x).logits, original(x).logits)
    # closed form: a bank trained at steps with online weights W_1..W_n holds d^n W_0 + sum_i (1-d) d^(n-i) W_i
    w0 = ensemble.online.weight.detach().clone()
    history: Dict[int, List[torch.Tensor]] = {b: [] for b in range(ensemble.num_experts)}
    for _ in range(3):
        output, _ = train_step(method, optimizer, x, y)
        for b in torch.unique(method.bank_of(output.selection)).tolist():
            history[b].append(ensemble.online.weight.detach().clone())
    for b, weights in history.items():
        n = len(weights)
        for j, d in enumerate(ensemble.decays.tolist()):
            expected = d**n * w0 + sum((1 - d) * d ** (n - i) * w for i, w in enumerate(weights, start=1))
            torch.testing.assert_close(ensemble.ema_weight[b, j], expected, rtol=0, atol=1e-6)
    method.eval()
    mask = torch.zeros(CLASSES)
    mask[-1] = float("-inf")
    torch.testing.assert_close(method.predict(x, mask), _naive_ensemble(method, handle, x, mask))


@pytest.mark.parametrize("name", METHODS)
def test_undo_restores_everything(name, tmp_path):
    method = make_method(name, tmp_path)
    head = method.get_classifier()
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=1e-3)
    hooks = hook_counts(method)
    handle = retrofit(method, "reference", optimizer=optimizer, **SMALL_ROUTER)
    assert "predict" in vars(method) and hook_counts(method) != hooks
    assert len(_compat.step_post_hooks(optimizer)) == 1
    handle.remove()
    handle.remove()  # idempotent
    assert "predict" not in vars(method) and method.get_classifier() is head
    assert hook_counts(method) == hooks and len(_compat.step_post_hooks(optimizer)) == 0


# ----------------------------------------------------------------------------------- online run
def online_run(name: str, tmp_path, router: bool, ensemble: bool) -> torch.Tensor:
    method = make_method(name, tmp_path)
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=1e-3)
    handle = retrofit(method, "reference", router=router, ensemble=ensemble, optimizer=optimizer,
                      schedule=SessionSchedule(method.num_experts), **SMALL_ROUTER)
    seen = torch.full((CLASSES,), float("-inf"))
    for session in range(2):
        handle.start_session(session)
        for step in range(2):
            x, y = batch(seed=10 * session + step)
            y = y % 3 + 2 * session  # classes {0,1,2} then {2,3,4}
            seen[y] = 0
            for _ in range(2):
                train_step(method, optimizer, x, y)
            handle.end_batch()
        method.on_session_end(session)
    assert handle.current_expert == 1
    method.eval()
    scores = method.predict(batch(seed=99)[0], seen)
    assert torch.isfinite(scores[:, :5][:, seen == 0]).all()
    if router:
        assert handle.router.num_samples == 32 and bool((handle.router.counts > 0).all())
    return scores


@pytest.mark.parametrize("name", METHODS)
def test_online_run_in_every_variant(name, tmp_path):
    for variant, (router, ensemble) in VARIANTS.items():
        scores = online_run(name, tmp_path, router, ensemble)
        assert scores.shape == (8, CLASSES), variant


def test_a_method_with_a_router_refusal_refuses_the_router_with_its_reason():
    from fly_modules.adapters.sdlora import ROUTER_REFUSAL

    method = create_method("sd-lora", make_vit(), CLASSES, num_experts=2)
    assert method.router_refusal == ROUTER_REFUSAL
    hooks = hook_counts(method)
    with pytest.raises(SeamError, match=r"reference: router=True refused for SDLoRA: SD-LoRA combines every task"):
        retrofit(method, "reference", router=True, ensemble=True)
    assert hook_counts(method) == hooks
    handle = retrofit(method, "reference", router=False, ensemble=True)
    assert handle.router is None and handle.ensemble.num_experts == 2
    handle.remove()
    routed = create_method("hide-lora", make_vit(), CLASSES, num_experts=2)
    assert retrofit(routed, "reference", router=True).router is not None  # no refusal: routed as before


def test_a_method_with_an_ensemble_refusal_refuses_the_ensemble_with_its_reason():
    method = create_method("ranpac", make_vit(), CLASSES)
    hooks = hook_counts(method)
    with pytest.raises(SeamError, match=r"reference: ensemble=True refused for RanPAC: its head trains in the first"):
        retrofit(method, "reference", router=False, ensemble=True)
    assert hook_counts(method) == hooks
    probe = create_method("linear-probe", make_vit(), CLASSES)
    assert retrofit(probe, "reference", router=False, ensemble=True).ensemble is not None  # no refusal
