"""The RanPAC variants (RanPAC‡ ``ranpac-frozen``, RanPAC* ``ranpac-collect``) as the paper defines them, and
``--study ranpac``'s table beside the paper's numbers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from tiny_sweep import TINY_MODEL

pytest.importorskip("timm")

from benchmarks.ablation.runner import build_run  # noqa: E402
from benchmarks.core.protocol import Protocol  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.methods import create_method  # noqa: E402
from benchmarks.methods.base import frozen_cls  # noqa: E402
from benchmarks.studies.analysis_numbers import RANPAC_VARIANTS  # noqa: E402
from benchmarks.studies.ranpac_table import RANPAC_ROWS, format_ranpac, ranpac_rows  # noqa: E402

CPU = torch.device("cpu")
OPTIONS = {"ridge": 10.0, "adapter_width": 8, "adapter_layers": 2}
PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2),
    pretrained=False, image_size=32, batch_size=12, online_iter=2, eval_period=30, test_batch_size=16,
    num_sessions=3, num_experts=3, expansion_dim=64, ridge=1e2, amp=False, router_query="clean",
    method_kwargs={name: dict(OPTIONS) for name in ("ranpac", "ranpac-frozen", "ranpac-collect")},
)


@pytest.fixture(scope="module")
def data():
    return make_synthetic_train_test(8, train_per_class=12, test_per_class=4, seed=0, image_size=32)


def _trained(method, data, protocol=PROTOCOL):
    run = build_run(method, "synthetic", 1, ["baseline"], protocol, *data, device=CPU)
    initial = {k: v.clone() for k, v in run.model.state_dict().items() if k.startswith(("adapter", "head"))}
    run.trainer.train()
    return run, initial


def test_ranpac_frozen_adapts_nothing_and_feeds_every_batch_of_the_frozen_model(data):
    run, initial = _trained("ranpac-frozen", data)
    model = run.model
    assert all(torch.equal(initial[k], model.state_dict()[k]) for k in initial)  # nothing trained, ever
    assert not any(p.requires_grad for p in model.trainable_parameters())
    assert model.classifier.num_samples == len(run.stream)  # the first session's batches too
    images = data[1].get_batch(torch.arange(16))[0]
    with torch.no_grad():  # the untrained adapters are the identity: the pre-trained model's class token
        torch.testing.assert_close(model.adapted_cls(images), frozen_cls(model.backbone, images))


def test_ranpac_collect_is_ranpac_with_the_first_sessions_statistics(data):
    collect, _ = _trained("ranpac-collect", data)
    options = {"ranpac": {**OPTIONS, "first_session_statistics": True}}
    asked, _ = _trained("ranpac", data, replace(PROTOCOL, method_kwargs=options))
    dagger, _ = _trained("ranpac", data)
    assert collect.model.classifier.num_samples == len(collect.stream) > dagger.model.classifier.num_samples
    assert torch.equal(collect.model.classifier.gram_matrix(), asked.model.classifier.gram_matrix())
    assert not torch.equal(collect.model.classifier.gram_matrix(), dagger.model.classifier.gram_matrix())


def test_options_that_would_make_another_variant_are_refused():
    import timm

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **PROTOCOL.model_kwargs)
    with pytest.raises(TypeError, match="first_session_statistics is not an option"):
        create_method("ranpac-frozen", vit, 4, first_session_statistics=True)
    with pytest.raises(TypeError, match="first_session_statistics must stay True"):
        create_method("ranpac-collect", vit, 4, first_session_statistics=False)


def test_rows_put_each_variant_beside_the_papers_numbers():
    def record(method, variant, seed, auc):
        return {"spec": {"dataset": "imagenet-r", "method": method, "variant": variant, "seed": seed},
                "metrics": {"A_auc": auc, "A_last": auc + 0.01}}

    rows = ranpac_rows([record("ranpac-frozen", "baseline", 1, 0.30), record("ranpac-frozen", "baseline", 2, 0.40),
                        record("flyprompt", "full", 1, 0.5)])
    assert [r["row"] for r in rows] == ["RanPAC‡", "FlyPrompt"]
    assert rows[0]["A_auc"] == pytest.approx(0.35) and rows[0]["seeds"] == 2
    assert (rows[0]["paper_A_auc"], rows[0]["paper_A_last"]) == RANPAC_VARIANTS["ranpac-frozen"]["imagenet-r"]
    assert "| imagenet-r | RanPAC‡ (ranpac-frozen) | 2 | 35.00 ± 7.07 | 36.00 ± 7.07 | imagenet-r, sup21k | 36.90 | 44.39 |" \
        in format_ranpac(rows)


def test_the_ranpac_study_runs_the_three_variants_and_flyprompt(tmp_path):
    from benchmarks.ablation import cli

    flags = ["--preset", "cpu", "--study", "ranpac", "--synthetic-classes", "4", "--synthetic-train-per-class", "6",
             "--synthetic-test-per-class", "2", "--num-sessions", "2", "--num-experts", "2", "--batch-size", "4",
             "--expansion-dim", "32", "--eval-period", "8", "--model-kwargs", json.dumps(TINY_MODEL), "--no-progress"]
    assert cli.main([*flags, "--output", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "study_ranpac.json").read_text())
    assert [r["row"] for r in rows] == [label for _, _, label in RANPAC_ROWS]
    assert all(r["paper_dataset"] == "cifar100" for r in rows)  # the generated data: the paper's CIFAR-100
    assert (tmp_path / "study_ranpac.md").is_file() and (tmp_path / "study_ranpac.png").is_file()
