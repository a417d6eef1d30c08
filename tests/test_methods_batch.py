"""Batch independence of the reference methods (a property test): at inference, any permutation of a batch
and any split of it into smaller batches leaves each sample's output unchanged, with the method's own
selection and with forced per-sample experts. HiDe-Prompt's ``mixed_assembly`` (the official code's prefix
assembly) must break it."""

from __future__ import annotations

from functools import lru_cache
from typing import List, Optional

import pytest
import torch
from torch import Tensor

timm = pytest.importorskip("timm")
from fly_modules.adapters._batch_independence import tolerance  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from benchmarks.methods.base import create_method, list_methods  # noqa: E402

CLASSES, BATCH = 5, 6
VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, num_classes=0)
KWARGS = {
    "l2p": dict(num_experts=2, pool_size=6, prompt_length=2, top_k=2),
    "dualprompt": dict(num_experts=2, pool_size=4, g_prompt_length=2, e_prompt_length=3),
    "misa": dict(num_experts=2, pool_size=4, g_prompt_length=2, e_prompt_length=3,
                 g_prompt=torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(7)),
                 e_prompt=torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(8))),
    "mvp": dict(num_experts=2, g_prompt_length=2, e_prompt_length=3),
    "hide": dict(num_tasks=2, prefix_length=2, ca_steps=0),
    "norga": dict(num_tasks=2, prefix_length=2, ca_steps=0),
    "flyprompt": dict(num_experts=2, prompt_length=3, router_expansion_dim=64, router_ridge=1.0),
    "hide-lora": dict(num_tasks=2, lora_rank=2, ca_steps=0),
    "hide-adapter": dict(num_tasks=2, adapter_width=3, ca_steps=0),
    "sd-lora": dict(num_tasks=2, lora_rank=2),
    "linear-probe": dict(),
    "ranpac": dict(adapter_width=3, expansion_dim=64, ridge=1.0),
    "ranpac-frozen": dict(adapter_width=3, expansion_dim=64, ridge=1.0),
    "ranpac-collect": dict(adapter_width=3, expansion_dim=64, ridge=1.0),
    "seq-ft": dict(),
    "seq-ft-sl": dict(),
    "coda-prompt": dict(num_experts=2, pool_size=4, prompt_length=3),
    "s-prompt": dict(num_experts=2, prompt_length=3, prototypes_per_task=2),
}


@lru_cache(maxsize=None)
def _method(name: str, mixed_assembly: bool = False):
    torch.manual_seed(0)
    backbone = timm.create_model("vit_tiny_patch16_224", pretrained=False, **VIT)
    torch.manual_seed(100)
    kwargs = dict(KWARGS[name], **({"mixed_assembly": True} if mixed_assembly else {}))
    method = create_method(name, backbone, CLASSES, **kwargs)
    with torch.no_grad():  # LoRA and adapter experts start as the identity: make the tasks differ
        for pname, parameter in method.named_parameters():
            if pname.startswith(("lora.", "adapter.", "banks.")):
                parameter.normal_(0.0, 0.2)
    for expert in range(method.num_experts):  # every expert started: the inference selection spans them
        method.on_expert_start(expert)
    if name == "flyprompt":  # its predict routes: fit the router on a few samples of each expert
        for expert in range(method.num_experts):
            method.router.update(method.compute_query(_images(4, seed=10 + expert)).router, expert)
    if name.startswith("ranpac"):  # after its first session: the ridge classifier, fitted on a few samples
        method.on_session_end(0)
        method.classifier.update(method.compute_query(_images(8, seed=10)).query, torch.arange(8) % CLASSES)
    return method.eval()


def _images(n: int = BATCH, seed: int = 1) -> Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _outputs(method, x: Tensor, experts: Optional[Tensor]) -> Tensor:
    if experts is None:
        return method.predict(x)
    return method(x, expert=experts).logits


def _pieces(order: List[int], cuts: List[int]) -> List[List[int]]:
    edges = [0, *sorted(set(c for c in cuts if 0 < c < len(order))), len(order)]
    return [order[a:b] for a, b in zip(edges, edges[1:])]


def _gap(method, x: Tensor, experts: Optional[Tensor], order: List[int], cuts: List[int]) -> float:
    """Largest |difference| between the whole batch's outputs and those of its permuted pieces, in units
    of the float-rounding tolerance."""
    whole = _outputs(method, x, experts)
    parts = torch.empty_like(whole)
    for piece in _pieces(order, cuts):
        index = torch.tensor(piece)
        parts[index] = _outputs(method, x[index], None if experts is None else experts[index])
    return float((whole - parts).abs().max()) / tolerance(whole)


@pytest.mark.parametrize("name", sorted(KWARGS))
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    order=st.permutations(list(range(BATCH))),
    cuts=st.lists(st.integers(1, BATCH - 1), max_size=3),
    forced=st.none() | st.lists(st.integers(0, 1), min_size=BATCH, max_size=BATCH),
)
def test_any_split_or_permutation_leaves_each_sample_unchanged(name, order, cuts, forced):
    method = _method(name)
    experts = None if forced is None else torch.tensor(forced) % method.num_experts  # one-expert methods: zeros
    assert _gap(method, _images(), experts, order, cuts) <= 1.0


def test_every_reference_method_is_covered():
    assert set(KWARGS) == set(list_methods())


@pytest.mark.parametrize("forced", [None, [0, 1, 0, 1, 0, 1]])
def test_the_official_mixed_assembly_breaks_it(forced):
    experts = None if forced is None else torch.tensor(forced)
    alone = list(range(BATCH))  # every sample its own batch
    assert _gap(_method("hide", mixed_assembly=True), _images(), experts, alone, alone) > 100
    assert _gap(_method("hide"), _images(), experts, alone, alone) <= 1.0
