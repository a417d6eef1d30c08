"""benchmarks.fidelity on the stand-in checkout: each reference method trains as the stand-in's official
trainer does, and a difference in training is seen."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("timm")

from fidelity_stand_in import FAKE_FLYGCL as FAKE  # noqa: E402
from fidelity_stand_in import SMALL  # noqa: E402

from benchmarks.core import reference_checkout as ref  # noqa: E402
from benchmarks.fidelity.cli import main  # noqa: E402
from benchmarks.fidelity.comparison import compare_method  # noqa: E402
from benchmarks.fidelity.measures import base_name, tensor  # noqa: E402
from benchmarks.fidelity.ours import OursSide  # noqa: E402
from benchmarks.fidelity.pairs import PAIRS  # noqa: E402
from benchmarks.fidelity.setting import Setting  # noqa: E402


@pytest.fixture(scope="module")
def checkout():
    return ref.load_checkout(str(FAKE), ["l2p", "dualprompt", "mvp", "flyprompt", "hide", "norga", "ranpac"])


@pytest.mark.parametrize("method", ["l2p", "dualprompt", "mvp", "misa", "flyprompt", "hide-no-orth", "norga-no-orth"])
def test_each_method_trains_and_decides_as_the_official_trainer(checkout, method):
    row = compare_method(checkout, PAIRS[method], SMALL)
    # both sides really trained (NoRGa's act_scale stays at its initial value in this stream, on both sides)
    assert row.weights_moved > 1e-3 or method == "norga-no-orth"
    assert row.weights_relative < 1e-5, row
    assert row.predictions_trained == row.predictions_identical == row.selection_identical == 1.0
    assert row.a_auc_ours == pytest.approx(row.a_auc_official, abs=1e-9)
    assert row.a_last_ours == pytest.approx(row.a_last_official, abs=1e-9)
    assert all(difference < 1e-5 for difference in row.other.values()), row.other  # routers, EMA heads, RanPAC's G, Q


def test_ranpac_trains_collects_and_solves_as_the_official_trainer(checkout):
    # The default setting: SMALL's first session is one batch of one class, where the batch mask leaves
    # nothing to train.
    row = compare_method(checkout, PAIRS["ranpac"], Setting())
    assert row.weights_moved > 1e-3
    assert row.weights_relative < 1e-4, row
    assert row.predictions_trained == row.predictions_identical == 1.0
    assert row.a_auc_ours == pytest.approx(row.a_auc_official, abs=1e-9)
    assert row.a_last_ours == pytest.approx(row.a_last_official, abs=1e-9)
    assert set(row.other) == {"classifier G", "classifier Q", "classifier scores"}
    assert all(difference < 1e-5 for difference in row.other.values()), row.other


def test_ranpac_without_the_first_sessions_statistics_is_seen(checkout):
    # The official trainer folds the first session's features in; our default leaves them out.
    row = compare_method(checkout, dataclasses.replace(PAIRS["ranpac"], ours_kwargs={}), Setting())
    assert row.other["classifier G"] > 1e-2


def test_hide_prompts_orthogonality_term_is_where_the_official_code_differs(checkout):
    # docs/protocol.md 6.2.4: the official term reads its old classes by dataset class id from a table in
    # exposure order; ours by exposure index. Same inference code, different training from session 2.
    row = compare_method(checkout, PAIRS["hide"], SMALL)
    assert row.predictions_identical == row.selection_identical == 1.0
    assert row.weights_relative > 1e-3


def test_a_different_training_is_seen(checkout):
    changed = dataclasses.replace(SMALL, lr=0.004)  # the official side trains at the launch scripts' 0.005
    row = compare_method(checkout, PAIRS["l2p"], changed)
    assert row.weights_relative > 1e-3


def test_a_trainable_tensor_left_out_of_the_map_is_an_error(checkout):
    weights = {k: v for k, v in PAIRS["l2p"].weights.items() if k != "prompt.key"}
    with pytest.raises(ValueError, match=r"\['prompt.key'.*not in the method's weight map"):
        compare_method(checkout, dataclasses.replace(PAIRS["l2p"], weights=weights), SMALL)


def test_a_map_name_the_models_lack_is_an_error(checkout):
    weights = {**PAIRS["l2p"].weights, "prompt.key_of_another_version": "keys"}
    with pytest.raises(ValueError, match=r"names \['prompt.key_of_another_version'\], which the models do not have"):
        compare_method(checkout, dataclasses.replace(PAIRS["l2p"], weights=weights), SMALL)


def test_a_name_reads_a_view_of_one_entry():
    state = {"bank": torch.arange(24.0).reshape(2, 3, 4)}
    assert torch.equal(tensor(state, "bank[1,2]"), state["bank"][1, 2])
    assert torch.equal(tensor(state, "bank[0,1:3]"), state["bank"][0, 1:3])
    assert torch.equal(tensor(state, "bank#1"), state["bank"][:, 1])
    assert base_name("bank[0,1:3]") == base_name("bank#1") == "bank"


@pytest.mark.parametrize("method", ["hide-lora", "hide-adapter", "sd-lora"])
def test_an_expert_map_reads_each_of_our_trainable_elements_once(method):
    # The stand-in checkout has no task-expert models: their official half is compared on a FlyGCL
    # checkout (docs/verification.md); here, that the map splits our banks into disjoint, complete views.
    pair, setting = PAIRS[method], Setting()
    ours = OursSide(pair, setting, *setting.data())
    parameters = dict(ours.model.named_parameters())  # SD-LoRA's later banks are trainable from their task on
    mapped = {base_name(name) for name in pair.weights.values()}
    assert {name for name, p in parameters.items() if p.requires_grad} <= mapped <= set(parameters)
    reads = {name: torch.zeros_like(parameters[name], dtype=torch.int64) for name in mapped}
    for name in pair.weights.values():
        tensor(reads, name).add_(1)
    assert all(bool((count == 1).all()) for count in reads.values())


def test_a_folder_that_is_not_a_checkout_fails_with_one_line(tmp_path, capsys):
    assert main(["--flygcl", str(tmp_path), "--methods", "l2p"]) == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "missing models/__init__.py" in message


def test_the_command_writes_its_table(tmp_path, monkeypatch):
    monkeypatch.setattr("benchmarks.fidelity.cli.Setting", lambda **options: dataclasses.replace(SMALL, **options))
    table, record = tmp_path / "table.md", tmp_path / "rows.json"
    assert main(["--flygcl", str(FAKE), "--methods", "dualprompt", "--json", str(record), "--markdown", str(table)]) == 0
    assert table.read_text().count("\n| dualprompt |") == 1
    assert '"method": "dualprompt"' in record.read_text()
    assert torch.get_num_threads() == 1
