"""``benchmarks/speed/vs_reference.py`` end to end on a fake FlyGCL checkout (tests/fixtures/fake_flygcl).

The fake has the official code's layout, class names, signatures and attributes, with small bodies of
our own. No timing is asserted; the tests check that the script runs from the repository root as
documented, reports every target, leaves no trace of the checkout in the process, fails early with a
one-line message on bad input, and that the retrofit trains the same weights and predicts the same
classes as the checkout's own router and EMA heads.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("timm")

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fixtures" / "fake_flygcl"
SCRIPT = "benchmarks.speed.vs_reference"
TARGETS = [f"vs_reference.{method}.{figure}" for method in ("dualprompt", "mvp")
           for figure in ("train_overhead", "eval_speedup")]
TARGET_LINE = re.compile(r"^\[(PASS|FAIL)\] (?P<key>[\w.]+): \S+ \(target (>=|<=) [^)]+\)", re.MULTILINE)


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    figures = tmp_path_factory.mktemp("bench") / "figures.json"
    result = run_script("--reference-repo", str(FAKE.relative_to(ROOT)), "--quick", "--clock", "process",
                        "--json", str(figures))
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout, json.loads(figures.read_text())


def test_quick_run_reports_every_target_and_the_environment(quick_run):
    output, figures = quick_run
    assert [m.group("key") for m in TARGET_LINE.finditer(output)] == TARGETS, output
    assert re.search(r"^\d+/4 targets passed", output, re.MULTILINE), output
    assert "timm" in output and "load average" in output and "torch threads 1" in output, output
    for method in ("dualprompt", "mvp"):
        timing = figures[method]["timing"]
        assert set(timing["train_seconds"]) == {"baseline", "official", "ours"}
        assert all(seconds > 0 for seconds in timing["train_seconds"].values())
        assert timing["eval_speedup_fresh"] > 0 and timing["eval_speedup_repeat"] > 0
        parts = timing["train_overhead_breakdown"]  # ours' overhead in parts, % of the baseline step
        assert set(parts) == {"total", "calls", "folds", "hooks", "rest"}
        assert parts["calls"] > 0 and 0 <= parts["folds"] <= parts["calls"] and parts["hooks"] >= 0
        # Every timed block ends with its rows folded into G: the blocked update is counted in training,
        # not left to the next evaluation's solve (which would hide it from the training overhead).
        assert timing["block_batches"] == 2 and parts["folds"] > 0
        arithmetic = timing["fold_arithmetic"]
        assert arithmetic["gflop_per_batch"] > 0 and arithmetic["gflops"] > 0
    # DualPrompt's retrofit swaps its pool's forward (no forward hook); MVP's runs forward hooks, which were
    # wrapped and timed: an empty record would read 0 for every method.
    assert any(figures[method]["timing"]["train_overhead_breakdown"]["hooks"] > 0 for method in ("dualprompt", "mvp"))
    assert set(figures["environment"]["gemm_gflops"]) == {"float64", "float32"}
    assert figures["environment"]["threads"] == 1


@pytest.mark.parametrize("method", ["dualprompt", "mvp"])
def test_retrofit_trains_like_the_checkouts_router_and_ema_heads(quick_run, method):
    # Same initial weights, same batches: the retrofit must not change training, its EMA copies must
    # follow the checkout's EMA heads bank by bank, and its statistics (float64) the checkout's (float32).
    training = quick_run[1][method]["training_equivalence"]
    assert training["weights"] <= 1e-6
    assert training["ema"] <= 1e-5
    assert training["gram"] <= 1e-5 and training["cross"] <= 1e-5


@pytest.mark.parametrize("method", ["dualprompt", "mvp"])
def test_identical_state_routes_and_predicts_like_the_checkout(quick_run, method):
    # Float32 LU against a float64 solve: a near-tie may flip one of the 32 samples, a wiring error many.
    inference = quick_run[1][method]["inference_agreement"]
    assert inference["scores"] <= 1e-4
    assert inference["routed"] >= 0.9 and inference["predictions"] >= 0.9
    assert inference["probabilities"] <= 1e-3
    if method == "dualprompt":
        assert inference["slots"] >= 0.9


def test_every_forward_hook_of_the_retrofit_is_timed_and_nothing_else():
    from benchmarks.speed.vs_reference_variants import time_forward_hooks

    module, calls = torch.nn.Linear(2, 2), []
    pre = module.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    post = module.register_forward_hook(lambda m, args, out: calls.append("post"))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    step = optimizer.register_step_post_hook(lambda *a: calls.append("step"))
    install = types.SimpleNamespace(_hooks=[(pre, "forward pre-hook on Linear"), (post, "forward hook on Linear"),
                                            (step, "step hook on SGD")])
    ticks, sink = iter(range(100)), []
    time_forward_hooks(types.SimpleNamespace(install=install), sink, lambda: None, lambda: float(next(ticks)))
    module(torch.zeros(1, 2))
    module.weight.sum().backward()
    optimizer.step()
    assert calls == ["pre", "post", "step"] and sink == [1.0, 1.0]  # one tick per timed call; the step hook untimed


def test_a_block_holds_one_fold_of_the_routers_buffer():
    from benchmarks.speed.vs_reference import block_batches

    # What block_batches reads of a router at M = 10,000 (a real one would allocate G's 763 MiB).
    router = types.SimpleNamespace(fold_rows=None, expansion_dim=10_000, device=torch.device("cpu"))
    handle = types.SimpleNamespace(router=router)
    assert block_batches(handle, 64) == 8  # 512 rows buffered on the CPU at M = 10,000
    assert block_batches(handle, 48) == 11  # the last, partial fold is the block's final flush
    handle.router.fold_rows = 100
    assert block_batches(handle, 64) == 2


def test_train_only_times_training_and_reports_its_target_only(tmp_path):
    figures = tmp_path / "figures.json"
    result = run_script("--reference-repo", str(FAKE.relative_to(ROOT)), "--quick", "--clock", "process",
                        "--methods", "dualprompt", "--train-only", "--json", str(figures))
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout}\n{result.stderr}"
    assert [m.group("key") for m in TARGET_LINE.finditer(result.stdout)] == ["vs_reference.dualprompt.train_overhead"]
    assert "target <= 10.0%" in result.stdout  # the CPU target
    measured = json.loads(figures.read_text())["dualprompt"]
    assert "eval_seconds" not in measured["timing"] and "inference_agreement" not in measured
    assert measured["training_equivalence"]["weights"] <= 1e-6


def test_fold_flops_count_the_lower_triangle_panels():
    from benchmarks.speed.vs_reference import fold_flops

    assert fold_flops(3, 100) == 2 * 3 * 100 * 100  # one panel: the full product
    assert fold_flops(1, 1024) == 2 * (512 * 512 + 512 * 1024)  # panel i: 512 rows x its end column


def test_loading_leaves_no_checkout_module_or_path_behind():
    from benchmarks.core import reference_checkout as ref

    sentinel = types.ModuleType("utils")  # an unrelated top-level `utils` of the user's process
    previous = sys.modules.get("utils")
    sys.modules["utils"] = sentinel
    path_before = list(sys.path)
    try:
        checkout = ref.load_checkout(str(FAKE))
        leaked = sorted(name for name in sys.modules if name.split(".")[0] in ("models", "methods", "datasets"))
        assert leaked == [] and sys.modules["utils"] is sentinel and "utils.data_loader" not in sys.modules
        assert sys.path == path_before
        baseline, official = ref.build_models(
            checkout, "dualprompt", "micro", num_classes=4, num_experts=2, expansion_dim=16, ridge=1.0, seed=0,
            device=torch.device("cpu"),
        )
    finally:
        if previous is None:
            sys.modules.pop("utils", None)
        else:
            sys.modules["utils"] = previous
    assert official.rp_head is not None and baseline.rp_head is None
    shared = [k for k in official.state_dict() if not k.startswith(("rp_head.", "experts_fc."))]
    assert all(torch.equal(official.state_dict()[k], baseline.state_dict()[k]) for k in shared)
    assert not hasattr(checkout.vit, "bench_vit_micro")  # the swapped ViT factory was put back


def test_a_folder_that_is_not_a_checkout_fails_with_one_line(tmp_path):
    result = run_script("--reference-repo", str(tmp_path), "--quick")
    assert result.returncode == 2
    message = result.stderr.strip()
    assert "\n" not in message and f"--reference-repo {tmp_path}: " in message and "missing models/__init__.py" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed when CUDA is absent")
def test_cuda_without_cuda_fails_with_one_line(capsys):
    from benchmarks.speed.vs_reference import main

    assert main(["--reference-repo", str(FAKE), "--device", "cuda", "--quick"]) == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and message.startswith("error: --device cuda") and "CUDA is not available" in message
