"""The studies on one training: the routing study's routers beside REAR change nothing else."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("timm")

from benchmarks.ablation.protocol import Protocol  # noqa: E402
from benchmarks.ablation.runner import run_training  # noqa: E402
from benchmarks.ablation.variants import ABLATION_VARIANTS  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.studies.router_set import ROUTERS  # noqa: E402

CPU = torch.device("cpu")
PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2),
    pretrained=False, image_size=32, batch_size=12, online_iter=2, eval_period=30, test_batch_size=16,
    num_experts=3, expansion_dim=64, ridge=1e2, amp=False,
)


@pytest.fixture(scope="module")
def data():
    return make_synthetic_train_test(6, train_per_class=12, test_per_class=4, seed=0, image_size=32)


@pytest.mark.parametrize("method,variants", [("dualprompt", list(ABLATION_VARIANTS)), ("flyprompt", ["full"])])
def test_every_router_is_scored_on_one_training_that_it_leaves_unchanged(data, method, variants):
    plain = run_training(method, "synthetic", 1, variants, PROTOCOL, *data, device=CPU)
    studied = run_training(method, "synthetic", 1, variants, PROTOCOL, *data, device=CPU, routers=list(ROUTERS))
    for variant in variants:
        for key in ("metrics", "log"):
            assert json.dumps(studied[variant][key]) == json.dumps(plain[variant][key]), (variant, key)
        diagnostics = dict(studied[variant]["diagnostics"])
        routers = diagnostics.pop("routers", None)
        assert json.dumps(diagnostics) == json.dumps(plain[variant]["diagnostics"])
        if variant in ("baseline", "ensemble"):
            assert routers is None  # the method's own selection: no router to replace
            continue
        assert list(routers) == list(ROUTERS)
        ridge = routers["ridge"]
        assert ridge["A_auc"] == pytest.approx(studied[variant]["metrics"]["A_auc"])
        assert ridge["routing"] == plain[variant]["diagnostics"]["routing"]["rear"]
        for name in ROUTERS:
            assert 0 <= routers[name]["routing"]["modal"]["last"] <= 1, name
            assert 0 <= routers[name]["A_last"] <= 1, name
        assert routers["prototype"]["seconds_per_update"] > 0


def test_unknown_router_is_refused_before_training(data):
    with pytest.raises(ValueError, match="unknown routers \\['lda'\\]"):
        run_training("l2p", "synthetic", 1, ["router"], PROTOCOL, *data, device=CPU, routers=["lda"])
