"""The components' cost breakdown: each formula against the size of the real object, and the paper's table."""

import json

import pytest
import torch
from torch import nn

from benchmarks.studies.components_cost import COMPONENT_COSTS, CostSetting, cost_breakdown, main
from fly_modules import AnalyticRouter, TemporalEnsembleHead

SMALL = CostSetting(expansion_dim=37, experts=3, prompt_length=4, width=24, prompt_layers=2, classes=7, decays=3)


def _formula(key: str, what: str, setting: CostSetting = SMALL) -> int:
    return getattr(next(c for c in COMPONENT_COSTS if c.key == key), what)(setting)


def test_router_statistics_and_head_have_the_formulas_sizes():
    router = AnalyticRouter(SMALL.width, SMALL.experts, expansion_dim=SMALL.expansion_dim, seed=0)
    assert not list(router.parameters())  # G, Q, R: buffers, never parameters
    assert router.gram.numel() == _formula("G", "storage") and router.gram.element_size() == 8
    assert router.cross.numel() == _formula("Q", "storage") and router.cross.element_size() == 8
    assert router.expansion.weight.numel() == _formula("expansion", "storage")
    router.update(torch.randn(9, SMALL.width), torch.arange(9) % SMALL.experts)
    assert router.weight.numel() == _formula("router_head", "storage")
    assert "_solution" not in router.state_dict()  # recomputed from G and Q, as the note says


def test_ensemble_heads_have_the_formulas_sizes():
    head = TemporalEnsembleHead(nn.Linear(SMALL.width, SMALL.classes), SMALL.experts,
                                decays=[0.9, 0.99, 0.999][:SMALL.decays])
    state = head.state_dict()
    assert state["ema_weight"].numel() + state["ema_bias"].numel() == _formula("te2_heads", "storage")
    assert state["ema_weight"].numel() + state["ema_bias"].numel() == _formula("te2_heads", "total")
    trainable = sum(p.numel() for p in head.parameters() if p.requires_grad)
    assert trainable == _formula("te2_heads", "trainable")


def test_flyprompts_prompts_have_the_formulas_size():
    pytest.importorskip("timm")
    import timm

    from benchmarks.methods import create_method

    backbone = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, patch_size=8,
                                 embed_dim=SMALL.width, depth=3, num_heads=2)
    model = create_method("flyprompt", backbone, SMALL.classes, num_experts=SMALL.experts,
                          prompt_length=SMALL.prompt_length, prompt_layers=range(SMALL.prompt_layers),
                          router_expansion_dim=SMALL.expansion_dim)
    assert model.prompts.numel() == _formula("prompts", "total") == _formula("prompts", "trainable")
    assert model.router.gram.numel() == _formula("G", "storage")


def test_the_papers_defaults_give_the_papers_table():
    for row in cost_breakdown(CostSetting()):
        if row["paper_total"] is None:
            continue
        ours = (round(row["total"], 2), round(row["trainable"], 2), round(row["storage"], 2))
        assert ours == (row["paper_total"], row["paper_trainable"], row["paper_storage"]), row["component"]


def test_the_command_writes_table_json_and_figure(tmp_path, capsys):
    assert main(["--expansion-dim", "2000", "--output", str(tmp_path)]) == 0
    document = json.loads((tmp_path / "study_components_cost.json").read_text())
    assert document["setting"]["expansion_dim"] == 2000
    assert next(r for r in document["rows"] if r["component"] == "G")["storage"] == 4.0
    assert "| G matrix | 0.00 | 0.00 | 0.00 | 0.00 | 4.00 | 100.00 |" in (tmp_path / "study_components_cost.md").read_text()
    with pytest.raises(SystemExit):
        main(["--experts", "0", "--output", str(tmp_path)])
    assert "--experts: experts must be an int >= 1, got 0" in capsys.readouterr().err
