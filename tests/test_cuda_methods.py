"""Every method's AMP training on CUDA (``pytest -m cuda``; skipped without a GPU).

For each registered method, two identical float16-autocast trainings of all its variants on a tiny stream
(``benchmarks.ablation.runner.run_training``) must have a finite loss at every step, bit-identical evaluation logs,
and every variant's log equal, bit for bit, to the variant's own run (``run_reference`` through the
adapters, or a training scoring that oracle variant alone), as ``tests/test_runner.py`` holds on the CPU.

Bit-equality on CUDA needs deterministic algorithms, which these tests switch on: without them the
backward pass of the fused attention kernels (flash / memory-efficient ``scaled_dot_product_attention``)
accumulates with atomics, and so does HiDe-Prompt's ``index_add_`` of class statistics. With them, and
cuBLAS given a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``, read when cuBLAS starts, hence set at import),
the same kernels run on the same shapes in the same order in both paths, so equal logs are expected.
"""

from __future__ import annotations

import contextlib
import json
import math
import os

import pytest
import torch

# Before any cuBLAS handle exists (collection precedes every test); without it deterministic matmuls raise.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
pytest.importorskip("timm")

from benchmarks.ablation.runner import run_reference, run_training  # noqa: E402
from benchmarks.core.protocol import Protocol, RunSpec  # noqa: E402
from benchmarks.core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS, variants_for  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.methods import list_methods, method_class  # noqa: E402

CUDA = torch.device("cuda")
PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=64, depth=4, num_heads=2),
    pretrained=False, image_size=32, batch_size=8, online_iter=2, eval_period=16, test_batch_size=16,
    num_experts=3, expansion_dim=128, ridge=1e2, amp=True, router_query="clean",
    method_kwargs={"l2p": {"pool_size": 6, "top_k": 2}, "hide": {"ca_steps": 10, "ca_samples_per_class": 8},
                   "norga": {"ca_steps": 10, "ca_samples_per_class": 8}},
)


@pytest.fixture(scope="module")
def data():
    return make_synthetic_train_test(6, train_per_class=8, test_per_class=4, seed=0, image_size=32)


class LossRecorder:
    """A progress bar for ``run_training``: keeps the loss it is shown after every stream batch."""

    def __init__(self, losses: list, **_: object) -> None:
        self.losses = losses

    def update(self, _: int = 1) -> None:
        pass

    def set_postfix(self, loss: str, **_: object) -> None:
        self.losses.append(float(loss))

    def close(self) -> None:
        pass


@contextlib.contextmanager
def deterministic_algorithms(warn_only: bool):
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def train(method: str, variants: list, data, losses: list) -> dict:
    return run_training(method, "synthetic", 1, variants, PROTOCOL, *data, device=CUDA,
                        progress=lambda **kwargs: LossRecorder(losses, **kwargs))


def log_text(record: dict) -> str:
    return json.dumps({"meta": record["log"]["meta"], "records": record["log"]["records"]})


@pytest.fixture(scope="module", params=list_methods())
def twice(request, data):
    """Two identical trainings of every variant of one method, under deterministic algorithms.

    Should an operation lack a deterministic CUDA implementation, the error is kept (the repeatability
    test reports it) and the runs are redone with ``warn_only`` so the other checks still run."""
    method = request.param
    variants = variants_for(method_class(method), [*ABLATION_VARIANTS, *ORACLE_VARIANTS])
    strict_error = None
    for warn_only in (False, True):
        losses: list = [[], []]
        try:
            with deterministic_algorithms(warn_only):
                runs = [train(method, variants, data, losses[k]) for k in range(2)]
            break
        except RuntimeError as error:
            if warn_only or "deterministic" not in str(error):
                raise
            strict_error = str(error).splitlines()[0]
    return {"method": method, "variants": variants, "runs": runs, "losses": losses, "strict_error": strict_error}


def test_every_amp_training_step_is_finite(twice):
    for run, losses in zip(twice["runs"], twice["losses"]):
        assert losses and all(math.isfinite(loss) for loss in losses), (twice["method"], losses)
        for variant, record in run.items():
            assert record["protocol"]["amp"] and record["device"].startswith("cuda")
            metrics = [record["metrics"][name] for name in ("A_auc", "A_last")]
            assert all(math.isfinite(value) and 0.0 <= value <= 1.0 for value in metrics), (variant, metrics)


def test_identical_runs_give_identical_logs(twice):
    assert twice["strict_error"] is None, f"{twice['method']}: {twice['strict_error']}"
    first, second = twice["runs"]
    assert twice["losses"][0] == twice["losses"][1], twice["method"]
    differing = [v for v in twice["variants"] if log_text(first[v]) != log_text(second[v])]
    assert not differing, f"{twice['method']}: the logs of {differing} differ between two identical runs"


def test_each_variant_of_one_training_equals_its_own_run(twice, data):
    method, together = twice["method"], twice["runs"][0]
    differing = {}
    with deterministic_algorithms(warn_only=twice["strict_error"] is not None):
        for variant in twice["variants"]:
            if variant in ORACLE_VARIANTS:
                alone = run_training(method, "synthetic", 1, [variant], PROTOCOL, *data, device=CUDA)[variant]
            else:
                alone = run_reference(RunSpec(method, variant, "synthetic", 1), PROTOCOL, *data, device=CUDA)
            if log_text(together[variant]) != log_text(alone):
                differing[variant] = [
                    (a["samples_seen"], sum(a["correct"]), sum(b["correct"]))
                    for a, b in zip(together[variant]["log"]["records"], alone["log"]["records"])
                    if a["correct"] != b["correct"]
                ]
    assert not differing, f"{method}: (samples seen, correct together, correct alone) where they differ: {differing}"
