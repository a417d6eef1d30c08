"""CODA-Prompt and S-Prompt++ as reference methods: CODA-P's components (their drawing, which task trains
which, what an expert reads), S-Prompt's prototypes and routing, and a retrofit of each that ``verify()`` passes."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

timm = pytest.importorskip("timm")
from fly_modules.adapters import retrofit  # noqa: E402
from method_steps import train_step  # noqa: E402

from benchmarks.methods import create_method  # noqa: E402
from benchmarks.methods.base import QueryFeatures  # noqa: E402
from benchmarks.methods.coda_prompt import gram_schmidt_rows  # noqa: E402
from benchmarks.methods.prototypes import kmeans_centres  # noqa: E402

CLASSES, EMBED = 5, 32
KWARGS = {"coda-prompt": dict(num_experts=2, pool_size=4, prompt_length=3),
          "s-prompt": dict(num_experts=2, prompt_length=3, prototypes_per_task=2)}


def make(name: str, **options):
    torch.manual_seed(0)
    backbone = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, patch_size=8,
                                 embed_dim=EMBED, depth=4, num_heads=2)
    torch.manual_seed(1)
    return create_method(name, backbone, CLASSES, **{**KWARGS[name], **options})


def images(n: int = 6, seed: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def labels(n: int = 6) -> torch.Tensor:
    return torch.arange(n) % CLASSES


# ------------------------------------------------------------------------------------ CODA-P
def test_a_tasks_components_are_drawn_orthonormal_to_the_earlier_ones_and_later_ones_zeroed():
    earlier = torch.linalg.qr(torch.randn(12, 2, generator=torch.Generator().manual_seed(0))).Q.T  # 2 orthonormal rows
    rows = torch.cat((earlier, torch.rand(4, 12)))
    torch.manual_seed(5)
    drawn = gram_schmidt_rows(rows, 2, 4)
    assert torch.equal(drawn[:2], earlier) and not drawn[4:].any()
    torch.testing.assert_close(drawn[:4] @ drawn[:4].T, torch.eye(4), rtol=0, atol=1e-5)
    torch.manual_seed(5)
    assert torch.equal(gram_schmidt_rows(rows, 2, 4), drawn)  # the global generator's draws, nothing else


def test_coda_trains_only_the_current_tasks_components():
    method = make("coda-prompt")
    method.on_session_end(0)
    method.on_expert_start(1)
    method.train()
    output = method(images())
    method.loss(output, labels()).backward()
    for tensor in (method.prompts, method.keys, method.attention):
        grad = tensor.grad.transpose(0, 1).reshape(4, -1)  # components first; 2 per task
        assert not grad[:2].any() and grad[2:].abs().sum(dim=1).min() > 0


def test_a_coda_expert_reads_the_components_of_its_tasks_only():
    method = make("coda-prompt").eval()
    method.on_session_end(0)
    method.on_expert_start(1)
    x, first = images(), torch.zeros(6, dtype=torch.long)
    before, both = method(x, expert=first).features, method(x).features
    with torch.no_grad():
        method.prompts[:, 2:] += torch.randn(method.prompts[:, 2:].shape)  # task 1's components
    assert torch.equal(method(x, expert=first).features, before)
    assert (method(x).features - both).abs().max() > 1e-3
    assert torch.equal(method(x).selection, torch.ones(6, dtype=torch.long))  # its own: every started task


def test_coda_reference_quirks_freeze_the_components_after_the_first_session():
    quirky, fixed = make("coda-prompt", reference_quirks=True), make("coda-prompt")
    for method in (quirky, fixed):
        method.on_session_end(0)
    assert not quirky.prompts.requires_grad and quirky.head.weight.requires_grad and fixed.prompts.requires_grad
    restored = make("coda-prompt")
    restored.load_state_dict(quirky.state_dict())
    assert not restored.keys.requires_grad and len(restored.trainable_parameters()) == 5


# -------------------------------------------------------------------------------- S-Prompt++
def test_kmeans_finds_well_separated_clusters():
    generator = torch.Generator().manual_seed(0)
    means = torch.tensor([[5.0, 0.0], [-5.0, 0.0], [0.0, 5.0]])
    points = (means.repeat_interleave(20, dim=0) + 0.1 * torch.randn(60, 2, generator=generator))
    centres = kmeans_centres(points, 3, seed=0)
    torch.testing.assert_close(torch.cdist(means, centres).min(dim=1).values, torch.zeros(3), rtol=0, atol=0.1)
    with pytest.raises(ValueError, match="2 points cannot make 3 centres"):
        kmeans_centres(points[:2], 3)


def _fed(method, rows: torch.Tensor) -> None:
    method.on_batch_end(None, None, SimpleNamespace(query=QueryFeatures(query=rows, router=rows)))


def test_sprompt_routes_each_sample_to_the_task_of_its_nearest_prototype():
    method = make("s-prompt", max_features=5)
    direction = torch.nn.functional.normalize(torch.randn(EMBED, generator=torch.Generator().manual_seed(3)), dim=0)
    noise = lambda n: 0.05 * torch.randn(n, EMBED, generator=torch.Generator().manual_seed(n))  # noqa: E731
    for task, sign in enumerate((1.0, -1.0)):
        method.on_expert_start(task)
        _fed(method, sign * direction + noise(4))
        _fed(method, sign * direction + noise(4))
        assert len(method.features) == 5  # capped
        method.on_evaluate()
    assert method.prototype_count.tolist() == [2, 2]
    queries = torch.stack([direction, -direction, -direction, direction]) * 3.0
    assert method.route(queries).tolist() == [0, 1, 1, 0]
    restored = make("s-prompt", max_features=5)
    restored.load_state_dict(method.state_dict())
    assert torch.equal(restored.features, method.features) and restored.route(queries).tolist() == [0, 1, 1, 0]


def test_a_new_sprompt_expert_starts_from_the_mean_of_the_earlier_ones():
    method = make("s-prompt")
    expected = method.prompts[:, :1].mean(dim=1).detach().clone()
    method.on_expert_start(1)
    assert torch.equal(method.prompts[:, 1], expected)


# ------------------------------------------------------------------------------- retrofits
@pytest.mark.parametrize("name", sorted(KWARGS))
def test_a_retrofit_of_each_passes_verify(name):
    method = make(name)
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=1e-2)
    handle = retrofit(method, "reference", optimizer=optimizer, expansion_dim=64, ridge=1e-2)
    for expert in range(2):
        handle.start_expert(expert)
        for seed in range(2):
            output, _ = train_step(method, optimizer, images(seed=seed), labels())
            method.on_batch_end(None, None, output)
            handle.end_batch()
        method.on_evaluate()
        method.on_session_end(expert)
    method.eval()
    original = copy.deepcopy(method)
    report = handle.verify(images(seed=9))
    assert report.ok, str(report)
    assert report["forcing each expert changes the logits"].ok and report["batch independence, mixed experts"].ok
    assert torch.equal(method.predict(images(seed=9)), original.predict(images(seed=9)))


# ----------------------------------------------------------------------------- parameter counts
def test_at_the_papers_configuration_both_have_the_papers_counts():
    # ViT-B/16, 100 classes, 5 tasks (benchmarks/studies/cost.py counts them so); shapes only, on the meta device
    from benchmarks.studies.paper_numbers import COST

    for name, (total, trainable) in {"coda-prompt": (86_720_356, 921_700), "s-prompt": (86_259_556, 460_900)}.items():
        with torch.device("meta"):
            backbone = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0)
            method = create_method(name, backbone, 100, num_experts=5)
        counts = (sum(p.numel() for p in method.parameters()), sum(p.numel() for p in method.parameters() if p.requires_grad))
        assert counts == (total, trainable)
        assert (round(total / 1e6, 2), round(trainable / 1e6, 2)) == COST[name][2:4]


def test_both_admit_every_variant_and_name_their_departures_in_the_run_record():
    from benchmarks.core.protocol import Protocol
    from benchmarks.core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS, variants_for
    from benchmarks.methods import method_class

    every = [*ABLATION_VARIANTS, *ORACLE_VARIANTS]
    for name in KWARGS:
        assert variants_for(method_class(name), every) == every
    coda = method_class("coda-prompt")
    assert "reference_quirks=True reproduces" in coda.protocol_notes(Protocol())
    assert "freeze" in coda.protocol_notes(Protocol(method_kwargs={"coda-prompt": {"reference_quirks": True}}))
    assert "scikit-learn" in method_class("s-prompt").protocol_notes(Protocol())


def test_every_variant_of_one_training_equals_its_own_run():
    # The runner's plumbing: each variant scored on the shared training has the log of a run through the
    # reference adapter (S-Prompt's prototypes built before each evaluation, CODA-P's components at session ends).
    import json

    from benchmarks.ablation.runner import run_reference, run_training
    from benchmarks.core.protocol import Protocol, RunSpec
    from benchmarks.data import make_synthetic_train_test

    protocol = Protocol(
        model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2),
        pretrained=False, image_size=32, batch_size=12, online_iter=1, eval_period=40, test_batch_size=16,
        num_experts=3, num_sessions=3, expansion_dim=64, ridge=1e2, amp=False,
        method_kwargs={"coda-prompt": {"pool_size": 6, "prompt_length": 3},
                       "s-prompt": {"prompt_length": 3, "prototypes_per_task": 2}},
    )
    data = make_synthetic_train_test(6, train_per_class=8, test_per_class=4, seed=0, image_size=32)
    cpu = torch.device("cpu")
    variants = ["baseline", "router", "ensemble", "both"]
    for method in KWARGS:
        together = run_training(method, "synthetic", 1, variants, protocol, *data, device=cpu)
        for variant in variants:
            alone = run_reference(RunSpec(method, variant, "synthetic", 1), protocol, *data, device=cpu)
            assert json.dumps(together[variant]["log"]["records"]) == json.dumps(alone["log"]["records"]), variant
