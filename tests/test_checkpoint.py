"""Mid-run checkpoints: atomic files and retention, exact resume after SIGKILL at three points and after
SIGTERM (real signals, subprocesses), refusal of other settings, and resume under torchrun."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.ablation import cli as cross_ablation
from benchmarks.ablation.preemption import RESUMABLE_EXIT_CODE, StopSignals
from benchmarks.ablation.training import OnlineTrainer
from benchmarks.core import checkpointing as checkpoint
from benchmarks.core.checkpointing import CheckpointError, CheckpointStore

ROOT = Path(__file__).resolve().parents[1]
# Three trainings: FlyPrompt (its own router and ensemble), HiDe-Prompt (sessions, classifier alignment
# drawing from torch's generator) and DualPrompt with added components; augmentation on, 2 steps a batch.
ARGS = [
    "--synthetic-classes", "6", "--synthetic-train-per-class", "12", "--synthetic-test-per-class", "4",
    "--batch-size", "12", "--online-iter", "2", "--eval-period", "30", "--expansion-dim", "64", "--no-progress",
    "--methods", "flyprompt,hide,dualprompt", "--variants", "baseline,both",
]
TIMINGS = ("wall_seconds", "seconds_per_batch", "peak_memory_mb", "checkpoints")


def interrupted(point: str, count: int, output: Path, *extra: str) -> subprocess.CompletedProcess:
    """The sweep in a subprocess, interrupted by tests/interrupt_run.py at ``point``."""
    command = [sys.executable, str(ROOT / "tests" / "interrupt_run.py"), point, str(count), "--", *ARGS, *extra,
               "--output", str(output)]
    return subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)


def final_records(output: Path) -> dict:
    """Every result file, as JSON text without the timings (NaN compares equal as text)."""
    records = {}
    for path in sorted((output / "runs").glob("**/*.json")):
        record = json.loads(path.read_text())
        records[str(path.relative_to(output))] = json.dumps({k: v for k, v in record.items() if k not in TIMINGS},
                                                            sort_keys=True)
    return records


def files(output: Path, folder: str) -> list:
    return sorted(str(p.relative_to(output / folder)) for p in (output / folder).glob("**/*") if p.is_file())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    output = tmp_path_factory.mktemp("uninterrupted")
    done = interrupted("none", 0, output)
    assert done.returncode == 0, done.stderr[-3000:]
    records = final_records(output)
    assert len(records) == 5 and not (output / "checkpoints").exists()  # the results replaced the checkpoints
    return records


@pytest.mark.slow
def test_sigkill_at_three_points_then_resume_equals_the_uninterrupted_run(uninterrupted, tmp_path):
    # 1. In the middle of HiDe-Prompt's third batch (FlyPrompt's 7 batches x 2 steps come first).
    first = interrupted("step", 20, tmp_path)
    assert first.returncode == -signal.SIGKILL
    assert files(tmp_path, "checkpoints") == ["cifar100-like/hide/seed1/batch0000002.pt"]
    assert files(tmp_path, "runs") == ["cifar100-like/flyprompt/full/seed1.json"]
    # 2. Inside a checkpoint write, between the complete temporary file and its rename: only the
    # temporary file of DualPrompt's first checkpoint exists, which the next run ignores and removes.
    second = interrupted("write", 2, tmp_path)
    assert second.returncode == -signal.SIGKILL and "1 training resumes from a checkpoint" in second.stdout
    assert [re.sub(r"\.pt\..*\.tmp$", ".pt.*.tmp", name) for name in files(tmp_path, "checkpoints")] == [
        "cifar100-like/dualprompt/seed1/.batch0000002.pt.*.tmp"
    ]
    # 3. Between the two result files of DualPrompt's training: the next run resumes it to write the
    # missing variant, scoring both as the training did.
    third = interrupted("result", 1, tmp_path)
    assert third.returncode == -signal.SIGKILL and "0 trainings resume" in third.stdout
    assert "cifar100-like/dualprompt/baseline/seed1.json" in files(tmp_path, "runs")
    assert "cifar100-like/dualprompt/both/seed1.json" not in files(tmp_path, "runs")
    assert len(files(tmp_path, "checkpoints")) == 2  # at most two per training
    last = interrupted("none", 0, tmp_path)
    assert last.returncode == 0, last.stderr[-3000:]
    assert "4 already finished, 1 training resumes" in last.stdout
    assert not (tmp_path / "checkpoints").exists()
    assert final_records(tmp_path) == uninterrupted
    history = {name: json.loads((tmp_path / name).read_text())["checkpoints"] for name in uninterrupted}
    assert history["runs/cifar100-like/hide/both/seed1.json"]["resumed_at_batches"] == [2]
    assert history["runs/cifar100-like/dualprompt/both/seed1.json"]["resumed_at_batches"] == [5]


@pytest.mark.slow
def test_sigterm_saves_at_the_batch_boundary_exits_75_and_resumes_exactly(uninterrupted, tmp_path):
    only = ["--methods", "flyprompt"]
    stopped = interrupted("term", 5, tmp_path, *only)  # during FlyPrompt's third batch
    assert stopped.returncode == RESUMABLE_EXIT_CODE == 75, stopped.stderr[-3000:]
    saved = tmp_path / "checkpoints" / "cifar100-like" / "flyprompt" / "seed1" / "batch0000003.pt"
    assert files(tmp_path, "checkpoints")[-1] == "cifar100-like/flyprompt/seed1/batch0000003.pt"
    assert f"stopped by SIGTERM: cifar100-like/flyprompt/seed1 at batch 3 of 7, saved in {saved}" in stopped.stderr
    command = re.search(r"resume with the same command: (.*)\n", stopped.stderr).group(1)
    assert command.endswith(" ".join([*ARGS, *only, "--output", str(tmp_path)]))
    assert checkpoint.read_checkpoint(saved)["batches"] == 3
    resumed = interrupted("none", 0, tmp_path, *only)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert final_records(tmp_path) == {name: uninterrupted[name] for name in ["runs/cifar100-like/flyprompt/full/seed1.json"]}


# ------------------------------------------------------------------------------- in process
SMALL = [*ARGS[: ARGS.index("--methods")], "--methods", "dualprompt", "--variants", "baseline,both"]


def stop_at_step(monkeypatch, step: int) -> None:
    """A real SIGTERM to this process before the ``step``-th optimizer step."""
    original, calls = OnlineTrainer.train_step, []

    def train_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(OnlineTrainer, "train_step", train_step)


def test_a_checkpoint_of_another_setting_or_other_variants_is_refused(tmp_path, monkeypatch, capsys):
    calls = []

    def handler(signum, frame):
        calls.append(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        stop_at_step(monkeypatch, 3)
        assert cross_ablation.main([*SMALL, "--output", str(tmp_path)]) == RESUMABLE_EXIT_CODE
        assert calls == []  # the sweep's handler took the signal, and put the previous ones back
        assert signal.getsignal(signal.SIGTERM) is handler and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
    monkeypatch.undo()
    folder = tmp_path / "checkpoints" / "cifar100-like" / "dualprompt" / "seed1"
    assert [p.name for p in CheckpointStore(folder).paths()] == ["batch0000002.pt"]
    capsys.readouterr()
    for changed, needle in (
        (["--lr", "0.5"], "lr: None -> 0.5"),
        (["--synthetic-test-per-class", "5"], "test_per_class: 4 -> 5"),
        (["--variants", "router"], "trains the variants baseline,both, not router; rerun with --variants baseline,both"),
    ):
        assert cross_ablation.main([*SMALL, *changed, "--output", str(tmp_path)]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and str(folder / "batch0000002.pt") in error and needle in error, error
    # A subset of the trained variants resumes; --no-resume starts afresh and leaves no checkpoint.
    assert cross_ablation.main([*SMALL, "--variants", "both", "--output", str(tmp_path)]) == 0
    assert "1 training resumes from a checkpoint" in capsys.readouterr().out
    assert not (tmp_path / "checkpoints").exists()
    assert cross_ablation.main([*SMALL, "--no-resume", "--checkpoint-every", "2", "--output", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "runs" / "cifar100-like" / "dualprompt" / "both" / "seed1.json").read_text())
    assert record["checkpoints"]["written"] == record["num_batches"] // 2 and record["checkpoints"]["resumed_at_batches"] == []


@pytest.mark.parametrize("value, expected", [("evaluation", "evaluation"), ("off", 0), ("0", 0), ("25", 25)])
def test_checkpoint_period_flag(value, expected, capsys):
    assert cross_ablation.build_parser().parse_args(["--checkpoint-every", value]).checkpoint_every == expected


def test_checkpoint_period_flag_rejects_other_values(capsys):
    assert cross_ablation.main(["--checkpoint-every", "often"]) == 2
    error = capsys.readouterr().err
    assert error == ("error: argument --checkpoint-every: expected 'evaluation', 'off' or a number of batches >= 0, "
                     "got 'often' (see --help)\n")


def test_store_writes_atomically_keeps_two_and_reads_only_plain_data(tmp_path):
    store = CheckpointStore(tmp_path / "run")

    def payload(batches, **extra):
        return {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "batches": batches,
                "state": torch.arange(batches), **extra}

    store.save(payload(2))
    (store.folder / ".batch0000004.pt.x1y2.tmp").write_bytes(b"an interrupted write")
    for batches in (5, 9):
        store.save(payload(batches))
    assert sorted(p.name for p in store.folder.iterdir()) == ["batch0000005.pt", "batch0000009.pt"]
    with pytest.raises(Exception):  # noqa: B017 - whatever pickling raises, nothing is left behind
        store.save(payload(12, bad=lambda: None))
    assert sorted(p.name for p in store.folder.iterdir()) == ["batch0000005.pt", "batch0000009.pt"]
    path, latest = store.latest()
    assert path.name == "batch0000009.pt" and torch.equal(latest["state"], torch.arange(9))

    # A damaged newest file falls back to the one before it, with a warning; a later save from there
    # removes the newer file.
    (store.folder / "batch0000009.pt").write_bytes(b"damaged")
    with pytest.warns(UserWarning, match="batch0000009.pt cannot be read"):
        assert store.latest()[1]["batches"] == 5
    store.save(payload(7))
    assert [p.name for p in store.paths()] == ["batch0000005.pt", "batch0000007.pt"]

    # Objects that need unpickling are never loaded; nor is another format.
    torch.save(payload(1, stream=StopSignals()), tmp_path / "object.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        checkpoint.read_checkpoint(tmp_path / "object.pt")
    torch.save({"format": "other", "batches": 1}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a run checkpoint"):
        checkpoint.read_checkpoint(tmp_path / "other.pt")
    store.clear()
    assert not store.folder.exists()


def test_random_number_states_round_trip():
    import random

    import numpy as np

    state = checkpoint.rng_states(torch.device("cpu"))
    expected = (torch.rand(3), np.random.rand(3), random.random())
    checkpoint.restore_rng_states(state, torch.device("cpu"))
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and (expected[1] == again[1]).all() and expected[2] == again[2]


@pytest.mark.distributed
@pytest.mark.slow
def test_torchrun_resumes_every_process_from_the_checkpoint_one_process_wrote(uninterrupted, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def torchrun(point, count):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                   "127.0.0.1", "--master_port", str(port), "tests/interrupt_run.py", point, str(count), "--", *ARGS,
                   "--methods", "hide", "--output", str(tmp_path)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "INTERRUPT_RANK": "1"}  # the process that does not write
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    assert torchrun("step", 6).returncode != 0  # killed in the middle of the third batch
    assert files(tmp_path, "checkpoints") == ["cifar100-like/hide/seed1/batch0000002.pt"]
    done = torchrun("none", 0)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 training resumes from a checkpoint" in done.stdout
    names = [name for name in uninterrupted if "/hide/" in name]
    assert sorted(files(tmp_path, "runs")) == sorted(name[len("runs/"):] for name in names)
    for name in names:
        one, two = json.loads(uninterrupted[name]), json.loads((tmp_path / name).read_text())
        assert two["world_size"] == 2
        # Same evaluations class by class as one process (summation order could in principle flip a
        # prediction; on these sizes it does not).
        assert [r["correct"] for r in two["log"]["records"]] == [r["correct"] for r in one["log"]["records"]], name
    resumed = json.loads((tmp_path / "runs/cifar100-like/hide/both/seed1.json").read_text())["checkpoints"]
    assert resumed["resumed_at_batches"] == [2]
