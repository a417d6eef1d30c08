"""The CKA study: linear CKA against a direct reference formula and its known properties; the streamed float64
moments against CKA of the stored features; a training's CKA matrices against the trained model's features;
``--study cka`` writes its table, JSON and figure, and refuses a method without a common representation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_sweep import TINY_MODEL

from benchmarks.studies.cka import ExpertFeatureMoments, cka_matrices, linear_cka
from benchmarks.studies.cka_table import cka_rows, format_cka


def _features(n: int = 60, d: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _hsic_cka(x: np.ndarray, y: np.ndarray) -> float:
    """The kernel form (Kornblith et al., eq. 2 with linear kernels): HSIC on centred Gram matrices."""
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, lk = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h
    return float(np.sum(k * lk) / np.sqrt(np.sum(k * k) * np.sum(lk * lk)))


def test_linear_cka_equals_the_kernel_form():
    for seed in range(3):
        x, y = _features(seed=seed), _features(d=4, seed=seed + 10) + 0.5 * _features(seed=seed)[:, :4]
        assert linear_cka(x, y) == pytest.approx(_hsic_cka(x.numpy(), y.numpy()), rel=1e-10)


def test_linear_cka_has_its_known_properties():
    x, y = _features(seed=1), _features(seed=2) + _features(seed=1)
    rotation, _ = torch.linalg.qr(_features(n=7, d=7, seed=3))
    value = linear_cka(x, y)
    assert linear_cka(x, x) == pytest.approx(1.0, rel=1e-12)
    assert linear_cka(y, x) == pytest.approx(value, rel=1e-12)
    assert 0.0 < value < 1.0
    assert linear_cka(x @ rotation, y) == pytest.approx(value, rel=1e-10)  # orthogonal transforms
    assert linear_cka(3.7 * x, 0.2 * y) == pytest.approx(value, rel=1e-10)  # isotropic scaling
    assert linear_cka(x + 5.0, y - 2.0) == pytest.approx(value, rel=1e-10)  # a shift: centred away
    stretched = x * torch.tensor([10.0, 1, 1, 1, 1, 1, 0.1], dtype=torch.float64)
    assert abs(linear_cka(stretched, y) - value) > 1e-3  # not invariant to anisotropic scaling
    with pytest.raises(ValueError, match="two \\(n, d\\) matrices of the same n"):
        linear_cka(x, y[:-1])


def test_streamed_moments_give_the_cka_of_the_stored_features_residual_and_raw():
    experts = [_features(seed=s) + 2.0 * _features(seed=99) for s in range(3)]  # a shared component
    common = _features(seed=99) * 2.0 + 0.1 * _features(seed=7)
    moments = ExpertFeatureMoments(4, 7, torch.device("cpu"))
    for rows in (slice(0, 13), slice(13, 14), slice(14, 60)):  # any split into batches
        moments.add([block[rows].float() for block in (*experts, common)])
    found = cka_matrices(moments, [0, 2, 4])
    assert found["experts"] == [0, 2, 4] and found["samples"] == 60
    floats = [block.float().double() for block in experts]
    shared = common.float().double()
    for i in range(3):
        for j in range(3):
            assert found["residual"][i][j] == pytest.approx(linear_cka(floats[i] - shared, floats[j] - shared), rel=1e-9)
            assert found["raw"][i][j] == pytest.approx(linear_cka(floats[i], floats[j]), rel=1e-9)
    # Removing the common part is what tells the experts apart here.
    assert found["raw"][0][1] > 0.5 > found["residual"][0][1]
    with pytest.raises(ValueError, match="expected 4 blocks of shape"):
        moments.add(experts)


def test_rows_average_the_seeds_once_per_training():
    def record(seed, variant, value):
        matrix = [[1.0, value], [value, 1.0]]
        return {"spec": {"dataset": "d", "method": "mvp", "variant": variant, "seed": seed},
                "diagnostics": {"cka": {"experts": [0, 1], "residual": matrix, "raw": matrix, "samples": 9}}}

    rows = cka_rows([record(1, "baseline", 0.2), record(1, "oracle", 0.2), record(2, "baseline", 0.4)])
    assert len(rows) == 1 and rows[0]["seeds"] == 2
    assert rows[0]["residual_off_diagonal_mean"] == pytest.approx(0.3)
    assert "| E1 | 1.000 | 0.300 |" in format_cka(rows)


@pytest.fixture(scope="module")
def trained():
    pytest.importorskip("timm")
    from benchmarks.ablation.runner import build_run
    from benchmarks.core.protocol import Protocol
    from benchmarks.data import make_synthetic_train_test

    protocol = Protocol(
        model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2),
        pretrained=False, image_size=32, batch_size=8, online_iter=1, eval_period=40, test_batch_size=7,
        num_sessions=3, num_experts=3, expansion_dim=32, ridge=1e2, amp=False, router_query="clean")
    data = make_synthetic_train_test(6, train_per_class=8, test_per_class=3, seed=0, image_size=32)
    runs = {}
    for method in ("mvp", "flyprompt"):
        variant = "full" if method == "flyprompt" else "baseline"
        run = build_run(method, "synthetic", 1, [variant], protocol, *data, device=torch.device("cpu"), cka=True)
        run.trainer.train()
        runs[method] = (run, variant)
    return runs, data


@pytest.mark.parametrize("method", ["mvp", "flyprompt"])
def test_a_trainings_cka_is_that_of_its_experts_features_on_the_test_set(trained, method):
    runs, (_, test) = trained
    run, variant = runs[method]
    found = run.evaluator.diagnostics(variant)["cka"]
    experts = found["experts"]
    assert len(experts) >= 2 and found["samples"] == len(test)
    model = run.model.eval()
    images = test.get_batch(torch.arange(len(test)))[0]
    with torch.no_grad():
        query = model.compute_query(images)
        features = [model(images, expert=torch.full((len(images),), e), query=query).features.double() for e in experts]
        common = model.common_features(images).double()
    for i in range(len(experts)):
        assert found["residual"][i][i] == pytest.approx(1.0, rel=1e-9)
        for j in range(len(experts)):
            direct = linear_cka(features[i] - common, features[j] - common)
            assert found["residual"][i][j] == pytest.approx(direct, rel=1e-4, abs=1e-6)
            assert found["raw"][i][j] == pytest.approx(linear_cka(features[i], features[j]), rel=1e-4, abs=1e-6)


FLAGS = ["--preset", "cpu", "--synthetic-classes", "4", "--synthetic-train-per-class", "6",
         "--synthetic-test-per-class", "2", "--num-sessions", "2", "--num-experts", "2", "--batch-size", "4",
         "--expansion-dim", "32", "--eval-period", "8", "--model-kwargs", json.dumps(TINY_MODEL), "--no-progress"]


def test_the_cka_study_writes_its_table_json_and_figure(tmp_path, capsys):
    pytest.importorskip("timm")
    from benchmarks.ablation import cli

    assert cli.main([*FLAGS, "--study", "cka", "--methods", "mvp,flyprompt", "--output", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "study_cka.json").read_text())
    assert {row["method"] for row in rows} == {"mvp", "flyprompt"}
    record = json.loads((tmp_path / "runs/synthetic/mvp/baseline/seed1.json").read_text())
    assert record["diagnostics"]["cka"]["residual"] == next(r for r in rows if r["method"] == "mvp")["residual"]
    assert "cka study (study_cka.md)" in capsys.readouterr().out
    assert (tmp_path / "study_cka.md").is_file() and (tmp_path / "study_cka.png").is_file()


def test_the_cka_study_refuses_a_method_without_a_common_representation(tmp_path, capsys):
    pytest.importorskip("timm")
    from benchmarks.ablation import cli

    assert cli.main([*FLAGS, "--study", "cka", "--methods", "l2p", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--study cka: l2p defines no common representation" in err
