"""benchmarks.fidelity's MISA rows on the stand-in checkout ``tests/fixtures/fake_misa``: with MISA's four
departures removed, our misa trains and decides as MISA's trainer does; each departure that remains is
seen where docs/verification.md says it is, and so is a different training."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from cli_errors import one_line_error

pytest.importorskip("timm")

from benchmarks.fidelity import misa_comparison  # noqa: E402
from benchmarks.fidelity.cli import main  # noqa: E402
from benchmarks.fidelity.evaluations import OfficialEvaluations  # noqa: E402
from benchmarks.fidelity.misa_checkout import load_misa  # noqa: E402
from benchmarks.fidelity.misa_comparison import (  # noqa: E402
    MASKED_A_AUC,
    MISA_ROWS,
    MaskedAccuracies,
    MISASetting,
    compare_misa,
)
from benchmarks.fidelity.misa_side import MISASide  # noqa: E402
from benchmarks.fidelity.ours import OursSide  # noqa: E402

FAKE = Path(__file__).parent / "fixtures" / "fake_misa"
SMALL = MISASetting(classes=4, train_per_class=8, test_per_class=2, batch_size=8, online_iter=2, num_sessions=2,
                    num_experts=2, eval_period=16)
WIDTH = 32  # the micro ViT's


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A copy of the stand-in with shipped prompts of the micro ViT's width in ``pretrained_prompt/``."""
    root = tmp_path_factory.mktemp("misa") / "checkout"
    shutil.copytree(FAKE, root)
    (root / "pretrained_prompt").mkdir()
    generator = torch.Generator().manual_seed(7)
    torch.save(torch.randn(1, 20, WIDTH, generator=generator), root / "pretrained_prompt" / "g_prompt.pt")
    torch.save(torch.randn(10, 60, WIDTH, generator=generator), root / "pretrained_prompt" / "e_prompt.pt")
    return root


@pytest.fixture(scope="module")
def checkout(folder):
    return load_misa(str(folder))


def shipped(folder: Path, setting: MISASetting = SMALL) -> MISASetting:
    return dataclasses.replace(setting, misa_prompts=str(folder / "pretrained_prompt"))


@pytest.mark.parametrize("prompts", ["shipped", "copied from ours"])
def test_without_its_departures_misa_trains_and_decides_as_its_own_trainer(checkout, folder, prompts):
    setting = shipped(folder) if prompts == "shipped" else SMALL
    row = compare_misa(checkout, MISA_ROWS["misa-one-session"], setting)
    assert row.weights_moved > 1e-3
    assert row.weights_relative < 1e-5, row
    assert row.predictions_trained == row.predictions_identical == row.selection_identical == 1.0
    assert row.a_last_ours == pytest.approx(row.a_last_official, abs=1e-9)
    assert abs(row.other[MASKED_A_AUC]) < 1e-9
    if prompts == "shipped":  # both sides loaded the same files; --load_pt's extra parameters never moved
        assert row.other["initial g_prompt.prompts"] == row.other["initial e_prompt.prompts"] == 0.0
        assert row.other["load_pt's scale, translation: change"] == 0.0


def test_every_session_trains_misas_first_prompt(checkout, folder, monkeypatch):
    # The training match's index is local to the step's slot range but reads the whole pool: from the
    # second session on, MISA trains prompt 0 again where ours trains a slot of the second step.
    built = []
    monkeypatch.setattr(misa_comparison, "MISASide", lambda *a, **k: built.append(MISASide(*a, **k)) or built[-1])
    row = compare_misa(checkout, MISA_ROWS["misa"], shipped(folder))
    assert row.weights_relative > 1e-3 and row.predictions_identical == row.selection_identical == 1.0
    files = torch.load(folder / "pretrained_prompt" / "e_prompt.pt", weights_only=True)
    official = built[-1].model.e_prompt.prompts.detach()
    moved = (official != files).flatten(1).any(1)
    assert moved.tolist() == [True] + [False] * 9


def test_misas_evaluation_counts_unexposed_classes(checkout):
    # online_evaluate adds no seen-class mask: a large logit of a class not yet seen takes every sample.
    torch.manual_seed(SMALL.seed)
    train, test = SMALL.data()
    pair = MISA_ROWS["misa-one-session"].pair
    ours = OursSide(pair, SMALL, train, test)
    official = MISASide(checkout, pair, SMALL, ours.model.backbone, num_classes=SMALL.classes, lr=0.005,
                        load_pt=False)
    batch = next(iter(ours.batches()))
    official.stream_batch(train.get_batch(batch.indices)[0], batch.targets)
    first_unseen = len(official.trainer.exposed_classes)
    with torch.no_grad():
        official.model.backbone.fc.bias[first_unseen:] = 100.0
    seen = batch.samples_seen
    evaluations, masked = OfficialEvaluations(official, ours.run.exposure, test, 64), MaskedAccuracies(
        official, ours.run.exposure, test)
    evaluations("anytime", seen)
    masked("anytime", seen)
    assert first_unseen < SMALL.classes and evaluations.accuracies[-1][2] == 0.0 < masked.accuracies[-1][1]


def test_a_different_training_is_seen(checkout, folder):
    changed = dataclasses.replace(shipped(folder), lr=0.004)  # MISA's side trains at its script's 0.005
    row = compare_misa(checkout, MISA_ROWS["misa-one-session"], changed)
    assert row.weights_relative > 1e-3


def test_prompts_other_than_the_checkouts_are_refused(checkout, tmp_path):
    with pytest.raises(ValueError, match="the folder MISA's --load_pt reads"):
        compare_misa(checkout, MISA_ROWS["misa"], dataclasses.replace(SMALL, misa_prompts=str(tmp_path)))


def test_a_folder_that_is_not_a_misa_checkout_fails_with_one_line(tmp_path, capsys):
    assert main(["--misa", str(tmp_path)]) == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "missing configuration/config.py" in message


def test_a_flygcl_checkout_given_as_misa_fails_with_one_line(tmp_path, capsys):
    # FlyGCL has every file MISA's loader needs (its layout is MISA's), and its trainers import scikit-learn.
    flygcl = tmp_path / "FlyGCL"
    shutil.copytree(FAKE, flygcl)
    (flygcl / "models" / "flyprompt.py").write_text("")
    error = one_line_error(capsys, main, ["--misa", str(flygcl)])
    assert "expected a checkout of kangzhiq/MISA, found one of AnAppleCore/FlyGCL (models/flyprompt.py)" in error


def test_a_checkout_whose_imports_fail_fails_with_one_line(tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(FAKE, other)
    (other / "models" / "dualprompt.py").write_text("import a_package_this_machine_lacks\n")
    error = one_line_error(capsys, main, ["--misa", str(other)])
    assert "importing its code failed: No module named 'a_package_this_machine_lacks'" in error


def test_nothing_to_compare_fails_with_one_line(capsys):
    assert main([]) == 2
    assert "name a checkout with --flygcl, --misa or both" in capsys.readouterr().err


def test_the_command_writes_the_misa_rows(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(misa_comparison, "MISASetting", lambda **options: dataclasses.replace(SMALL, **options))
    table, record = tmp_path / "table.md", tmp_path / "rows.json"
    assert main(["--misa", str(folder), "--misa-vit", "micro", "--json", str(record), "--markdown", str(table)]) == 0
    assert table.read_text().count("\n| misa | MISA DualPrompt") == 1
    assert table.read_text().count("\n| misa (one session, task_num 1) |") == 1
    assert '"misa_setting"' in record.read_text() and '"setting"' not in record.read_text()
    assert '"misa_prompts": "<--misa>/pretrained_prompt"' in record.read_text() and str(folder) not in record.read_text()
