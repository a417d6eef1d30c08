"""benchmarks/gpu/suite.py: the whole suite at toy sizes on the CPU (so the one GPU run cannot fail on a typo),
its budgets and output limits, and how it records failing, crashing and hanging stages."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("timm")

from benchmarks.backbone import backbone_of  # noqa: E402
from benchmarks.core.protocol import Protocol  # noqa: E402
from benchmarks.gpu import proxy as _gpu_proxy
from benchmarks.gpu import suite as gpu_suite  # noqa: E402
from benchmarks.speed.timing import Report  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FAKE_CHECKOUT = REPO / "tests" / "fixtures" / "fake_flygcl"
FILE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # names a remote machine returns safely


def test_budgets_and_outputs_fit_a_short_gpu_session():
    assert gpu_suite.STAGES == ("environment", "cuda_tests", "kernels", "proxy", "vs_reference")
    assert sum(gpu_suite.STAGE_BUDGETS.values()) <= gpu_suite.TOTAL_BUDGET <= 8 * 60
    assert gpu_suite.STAGE_BUDGETS["cuda_tests"] <= 60 and gpu_suite.STAGE_BUDGETS["kernels"] <= 120
    assert gpu_suite.STAGE_BUDGETS["proxy"] <= 240 and gpu_suite.STAGE_BUDGETS["vs_reference"] <= 60
    names = list(gpu_suite.OUTPUT_FILES.values())
    assert len(set(names)) == len(names) <= 8 and all(FILE_NAME.match(name) for name in names)


def test_tiny_cpu_run_writes_every_stage(tmp_path):
    output = tmp_path / "out"
    command = [sys.executable, "-m", "benchmarks.gpu.suite", "--device", "cpu", "--tiny",
               "--output", str(output)]
    if FAKE_CHECKOUT.is_dir():
        command += ["--reference-repo", str(FAKE_CHECKOUT)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "GPU suite summary" in done.stdout

    written = sorted(path.name for path in output.iterdir())
    assert len(written) <= 8 and all(FILE_NAME.match(name) for name in written)
    assert set(written) <= set(gpu_suite.OUTPUT_FILES.values())
    summary = json.loads((output / "summary.json").read_text())
    assert summary["finished"] and summary["environment"]["torch"]
    statuses = {name: stage["status"] for name, stage in summary["stages"].items()}
    assert statuses["environment"] == statuses["cuda_tests"] == statuses["kernels"] == statuses["proxy"] == "passed"
    assert statuses["vs_reference"] == ("passed" if FAKE_CHECKOUT.is_dir() else "skipped")

    cuda_tests = json.loads((output / "cuda_tests.json").read_text())
    counts = cuda_tests["result"]["counts"]
    assert counts["skipped"] > 0 and counts["failure"] == counts["error"] == 0  # no GPU here: every CUDA test skips

    kernels = json.loads((output / "kernels.json").read_text())
    assert {t["key"] for t in kernels["result"]["router"]["targets"]} >= {"router.update_speedup",
                                                                          "router.update_vs_float32",
                                                                          "router.solve_vs_lu32"}
    keys = {t["key"]: t for t in summary["targets"]}
    for key in ("router.update_vs_float32", "router.solve_vs_lu32", "ensemble.speedup_batch32"):
        assert keys[key]["value"] > 0 and not keys[key]["applies"]  # the GPU targets are informational here

    proxy = json.loads((output / "proxy.json").read_text())["result"]
    pretraining = proxy["pretraining"]
    weights = output / gpu_suite.OUTPUT_FILES["weights"]
    assert pretraining["bytes"] == weights.stat().st_size <= _gpu_proxy.MAX_WEIGHT_BYTES
    assert pretraining["training"]["epochs_completed"] == _gpu_proxy.TINY_SCALE.epochs
    assert pretraining["training"]["deterministic_algorithms"] == "strict"
    backbone = backbone_of(Protocol(model=pretraining["model"], model_kwargs=pretraining["model_kwargs"],
                                       pretrained=True, weights=str(weights)))
    assert backbone.embed_dim == _gpu_proxy.TINY_SCALE.model_kwargs["embed_dim"]
    assert all(proxy["sweep"]["methods"][m]["status"] == "finished" for m in _gpu_proxy.SWEEP_METHODS)
    rows = json.loads((output / "proxy_table.json").read_text())
    assert {(r["method"], r["variant"]) for r in rows} == {
        (m, v) for m in _gpu_proxy.SWEEP_METHODS for v in _gpu_proxy.SWEEP_VARIANTS}
    assert "DualPrompt" in (output / "proxy_table.md").read_text()


class ScriptedSuite(gpu_suite.Suite):
    """Stages replaced by small scripted ones: one raises, one hangs, one passes."""

    def stage_environment(self, record, limit):
        record["status"] = "passed"

    def stage_cuda_tests(self, record, limit):
        raise RuntimeError("the stage broke")

    def stage_kernels(self, record, limit):
        child = gpu_suite.run_child([sys.executable, "-c", "import time; print('started', flush=True); "
                                     "time.sleep(60)"], limit=1.0)
        record["children"] = [gpu_suite.child_summary(child)]
        record["status"] = gpu_suite.child_status([child]) or "passed"

    def stage_proxy(self, record, limit):
        record["status"] = "passed"


def test_a_crashing_or_hanging_stage_is_recorded_and_the_next_still_runs(tmp_path):
    args = gpu_suite.parse_args(["--device", "cpu", "--tiny", "--output", str(tmp_path),
                                 "--stages", "cuda_tests,kernels,proxy"])
    status = ScriptedSuite(args).run()
    assert status == 1  # a stage crashed or timed out
    summary = json.loads((tmp_path / "summary.json").read_text())
    stages = summary["stages"]
    assert [stages[name]["status"] for name in gpu_suite.STAGES] == [
        "passed", "error", "timeout", "passed", "not requested"]
    assert "the stage broke" in stages["cuda_tests"]["reason"]
    kernels = json.loads((tmp_path / "kernels.json").read_text())
    assert kernels["children"][0]["timed_out"] and "started" in kernels["children"][0]["output_tail"]
    assert kernels["children"][0]["seconds"] < 30
    assert "the stage broke" in json.loads((tmp_path / "cuda_tests.json").read_text())["traceback"]


def test_stages_are_skipped_when_the_budget_is_spent(tmp_path):
    args = gpu_suite.parse_args(["--device", "cpu", "--output", str(tmp_path), "--stages", "proxy", "--budget", "5"])
    assert ScriptedSuite(args).run() == 0
    proxy = json.loads((tmp_path / "summary.json").read_text())["stages"]["proxy"]
    assert proxy["status"] == "skipped" and "budget" in proxy["reason"]


def test_a_smaller_budget_still_runs_the_shortest_stage(tmp_path):
    """--budget 420 scales the environment stage's 10 s to 8.75 s, below the skip threshold: it still runs."""
    args = gpu_suite.parse_args(["--device", "cpu", "--output", str(tmp_path), "--stages", "proxy", "--budget", "420"])
    assert ScriptedSuite(args).run() == 0
    stages = json.loads((tmp_path / "summary.json").read_text())["stages"]
    assert stages["environment"]["status"] == "passed" and stages["proxy"]["status"] == "passed"


def test_targets_are_read_from_the_report_lines(capsys):
    report = Report()
    report.check("router.update_speedup", 2.345, ">=", 1.6, unit="x", detail="reference 1 ms vs ours 0.4 ms")
    report.check("ensemble.scores_match", 2.2e-06, "<=", 1e-05, fmt=".1e")
    report.check("router.solve_vs_lu", 0.5, ">=", 1.8, unit="x")
    found = gpu_suite.scrape_targets(capsys.readouterr().out)
    assert [(t["key"], t["passed"], t["op"]) for t in found] == [
        ("router.update_speedup", True, ">="), ("ensemble.scores_match", True, "<="), ("router.solve_vs_lu", False, ">=")]
    assert found[0]["value"] == 2.35 and found[0]["unit"] == "x" and found[1]["value"] == pytest.approx(2.2e-6)


def test_pytest_outcomes_are_read_from_junit_and_from_verbose_output(tmp_path):
    (tmp_path / "test_sample.py").write_text(textwrap.dedent("""
        import pytest

        def test_passes():
            pass

        def test_fails():
            assert 1 == 2, "one is not two"

        @pytest.mark.skip(reason="not here")
        def test_skipped():
            pass
    """))
    junit = tmp_path / "junit.xml"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # its own root: none of the repository's settings
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", f"--junitxml={junit}",
                           "test_sample.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout
    from_junit = gpu_suite.parse_junit(junit)
    assert from_junit["counts"] == {"passed": 1, "failure": 1, "error": 0, "skipped": 1}
    failed = [t for t in from_junit["tests"] if t["outcome"] == "failure"]
    assert len(failed) == 1 and "one is not two" in failed[0]["message"]
    assert gpu_suite.parse_junit(tmp_path / "missing.xml") is None
    assert gpu_suite.parse_pytest_lines(done.stdout)["counts"] == from_junit["counts"]


def test_usage_errors_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        gpu_suite.main(["--output", str(tmp_path), "--device", "cpu", "--stages", "kernels,benchmarks"])
    assert stopped.value.code == 2
    assert "--stages: expected names from environment" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_suite.main(["--output", str(tmp_path), "--device", "cpu", "--reference-repo", str(tmp_path / "nowhere")])
    assert "nowhere: no folder there; expected an existing folder (check --reference-repo)" in capsys.readouterr().err
