"""``--log``: the runner's curves read back by TensorBoard's own reader and from W&B's offline run files, a
killed and resumed run's curves, the refusal of a missing package, and the records unchanged by logging."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_sweep import TINY_MODEL

from benchmarks.ablation import cli as cross_ablation
from benchmarks.ablation import loggers
from benchmarks.core.protocol import RunSpec

ROOT = Path(__file__).resolve().parents[1]
# DualPrompt's one training scored as three variants: 8 batches of 4 samples, 2 sessions, 4 anytime evaluations.
ARGS = ["--preset", "cpu", "--methods", "dualprompt", "--variants", "baseline,router,both", "--synthetic-classes", "4",
        "--synthetic-train-per-class", "8", "--synthetic-test-per-class", "2", "--num-sessions", "2",
        "--num-experts", "2", "--batch-size", "4", "--eval-period", "8", "--model-kwargs", json.dumps(TINY_MODEL),
        "--no-progress"]
RUN = Path("synthetic") / "dualprompt"
TIMINGS = ("wall_seconds", "seconds_per_batch", "peak_memory_mb", "checkpoints")


def needs(package: str):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"{package} is not installed (pip install -e \".[log]\")")


def record(output: Path, variant: str) -> dict:
    return json.loads((output / "runs" / RUN / variant / "seed1.json").read_text())


def anytime_curve(result: dict) -> list:
    """``(samples seen, accuracy)`` of every anytime evaluation of a run record."""
    return [(r["samples_seen"], sum(r["correct"]) / sum(r["total"])) for r in result["log"]["records"]
            if r["kind"] == "anytime"]


def assert_curve(points: list, curve: list) -> None:
    """``points`` are ``curve``: the same steps, values within float32 rounding (TensorBoard stores float32)."""
    assert [step for step, _ in points] == [step for step, _ in curve]
    assert [value for _, value in points] == pytest.approx([value for _, value in curve], rel=1e-6)


def tensorboard_scalars(folder: Path) -> dict:
    """``{tag: [(step, value), ...]}`` as TensorBoard's reader serves them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@needs("tensorboard")
def test_tensorboard_events_hold_every_variant_curve_at_the_samples_seen(tmp_path):
    assert cross_ablation.main([*ARGS, "--output", str(tmp_path), "--log", "tensorboard"]) == 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for variant in ("baseline", "router", "both"):
        folder = tmp_path / "logs" / "tensorboard" / RUN / variant / "seed1"
        scalars, result = tensorboard_scalars(folder), record(tmp_path, variant)
        curve = anytime_curve(result)
        assert len(curve) == 4
        assert_curve(scalars["accuracy/anytime"], curve)
        steps = [step for step, _ in curve]
        for tag in ("routing/modal", "train/loss", "train/samples_per_second", "experts/trained_share/1"):
            assert [step for step, _ in scalars[tag]] == steps, tag
        for name in ("A_auc", "A_last", "A_avg", "F_last"):
            assert_curve(scalars[f"metrics/{name}"], [(steps[-1], result["metrics"][name])])
        shares = [scalars[f"experts/routed_share/{e}"][-1][1] for e in (0, 1)]
        assert sum(shares) == pytest.approx(1.0)
        assert ("accuracy/member/ema_0.9" in scalars) == (variant == "both")
        events = EventAccumulator(str(folder))
        events.Reload()
        assert set(events.PluginTagToContent("hparams")) >= {"_hparams_/experiment", "_hparams_/session_start_info"}
    # The routed variant's routing is REAR's, the baseline's the method's own: they differ on this run.
    baseline = tensorboard_scalars(tmp_path / "logs" / "tensorboard" / RUN / "baseline" / "seed1")
    router = tensorboard_scalars(tmp_path / "logs" / "tensorboard" / RUN / "router" / "seed1")
    routing = record(tmp_path, "router")["diagnostics"]["routing"]
    assert baseline["routing/modal"][-1][1] == pytest.approx(routing["own"]["modal"]["last"])
    assert router["routing/modal"][-1][1] == pytest.approx(routing["rear"]["modal"]["last"])


def wandb_records(path: Path):
    """The records of a W&B transaction log (``run-<id>.wandb``): LevelDB's log format after a 7-byte header."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    position, payload = 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's trailer
            position += block - position % block
            continue
        length, kind = struct.unpack("<HB", data[position + 4:position + 7])
        payload += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == 0:
            break
        if kind in (1, 4):  # a full record, or the last piece of one
            yield wandb_internal_pb2.Record.FromString(payload)
            payload = b""


def wandb_run(folder: Path, name: str) -> dict:
    """The run named ``name`` in an offline W&B folder: its group, tags, config keys, history and summary."""
    def key(item):
        return item.key or "/".join(item.nested_key)

    for path in folder.glob("wandb/offline-run-*/run-*.wandb"):
        run = {"history": [], "summary": {}}
        for entry in wandb_records(path):
            kind = entry.WhichOneof("record_type")
            if kind == "run":
                run.update(name=entry.run.display_name, group=entry.run.run_group, tags=list(entry.run.tags),
                           config={key(item) for item in entry.run.config.update})
            elif kind == "history":
                run["history"].append({key(item): json.loads(item.value_json) for item in entry.history.item})
            elif kind == "summary":
                run["summary"].update({key(item): json.loads(item.value_json) for item in entry.summary.update})
        if run.get("name") == name:
            return run
    raise AssertionError(f"no W&B run named {name} in {folder}")


@needs("wandb")
def test_wandb_offline_run_holds_the_history_and_the_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb_dir").mkdir()
    output = tmp_path / "out"
    assert cross_ablation.main([*ARGS, "--variants", "baseline,both", "--output", str(output), "--log", "wandb"]) == 0
    for variant in ("baseline", "both"):
        run, result = wandb_run(tmp_path / "wandb_dir", f"{RUN.as_posix()}/{variant}/seed1"), record(output, variant)
        assert run["group"] == output.as_posix()
        assert run["tags"] == ["dualprompt", variant, "synthetic", "seed1"]
        assert {"method", "variant", "seed", "protocol.expansion_dim", "data.num_classes"} <= run["config"]
        curve = [(h["_step"], h["accuracy/anytime"]) for h in run["history"]]
        assert_curve(curve, anytime_curve(result))
        for name in ("A_auc", "A_last", "A_avg", "F_last"):
            assert run["summary"][name] == pytest.approx(result["metrics"][name])


@needs("tensorboard")
@pytest.mark.slow
def test_a_killed_and_resumed_run_has_one_curve_per_scalar(tmp_path):
    """SIGKILL in the middle of the stream (a checkpoint every 5 batches: the killed process logged an evaluation
    after its last checkpoint), then the same command: one curve per scalar, at the record's steps."""
    args = [*ARGS, "--variants", "baseline,both", "--checkpoint-every", "5", "--log", "tensorboard,csv",
            "--output", str(tmp_path)]

    def run(point: str, count: int) -> subprocess.CompletedProcess:
        command = [sys.executable, str(ROOT / "tests" / "interrupt_run.py"), point, str(count), "--", *args]
        return subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                              text=True, timeout=300)

    # The first of 3 steps of the 7th of 8 batches: evaluations at 8, 16 and 24 samples logged, a checkpoint at 20.
    killed = run("step", 19)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = run("none", 0)
    assert resumed.returncode == 0 and "1 training resumes from a checkpoint" in resumed.stdout, resumed.stderr[-2000:]
    for variant in ("baseline", "both"):
        folder = tmp_path / "logs" / "tensorboard" / RUN / variant / "seed1"
        assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # one file per process
        curve, scalars = anytime_curve(record(tmp_path, variant)), tensorboard_scalars(folder)
        assert_curve(scalars["accuracy/anytime"], curve)
        steps = [step for step, _ in curve]
        for tag, points in scalars.items():
            if not tag.startswith("metrics/"):
                assert [step for step, _ in points] == steps, tag
        with (tmp_path / "logs" / "csv" / RUN / variant / "seed1.csv").open(newline="") as file:
            rows = [row for row in csv.DictReader(file) if row["tag"] == "accuracy/anytime"]
        assert_curve([(int(r["step"]), float(r["value"])) for r in rows], curve)


def test_a_missing_package_is_one_line_naming_the_extra_before_any_work(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert cross_ablation.main([*ARGS, "--output", str(tmp_path), "--log", "csv,wandb"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and 'pip install -e ".[wandb]"' in error
    assert not tmp_path.joinpath("runs").exists()
    assert cross_ablation.main([*ARGS, "--output", str(tmp_path), "--log", "mlflow"]) == 2
    assert "tensorboard, wandb, csv" in capsys.readouterr().err


def test_logging_changes_no_record_and_without_it_nothing_is_written(tmp_path):
    plain, logged = tmp_path / "plain", tmp_path / "logged"
    assert cross_ablation.main([*ARGS, "--output", str(plain)]) == 0
    assert cross_ablation.main([*ARGS, "--output", str(logged), "--log", "csv"]) == 0
    assert not (plain / "logs").exists()
    for variant in ("baseline", "router", "both"):
        a, b = record(plain, variant), record(logged, variant)
        assert json.dumps({k: v for k, v in a.items() if k not in TIMINGS}, sort_keys=True) == \
            json.dumps({k: v for k, v in b.items() if k not in TIMINGS}, sort_keys=True)


def test_a_resumed_training_continues_its_wandb_run_and_a_fresh_one_starts_another(tmp_path, monkeypatch):
    """The W&B run id is kept beside the logs: a resumed training (start step > 0) reopens its run, a training
    started afresh (e.g. --no-resume) opens a new one (``wandb`` replaced by a recorder of ``init``)."""
    opened = []

    class Run:
        def __init__(self, **options):
            opened.append(options)

    monkeypatch.setitem(sys.modules, "wandb", type(sys)("wandb"))
    sys.modules["wandb"].init = Run
    target, run = loggers.LogTarget(tmp_path, "results/sweep"), RunSpec("l2p", "both", "synthetic", 2)
    for start in (0, 41, 0):
        loggers.WandbLogger(target, run, start_step=start, hparams={"protocol.decays": [0.9, 0.99], "seed": 2})
    first, resumed, fresh = opened
    assert resumed["id"] == first["id"] != fresh["id"]
    assert {o["resume"] for o in opened} == {"allow"} and {o["group"] for o in opened} == {"results/sweep"}
    assert first["name"] == "synthetic/l2p/both/seed2" and first["tags"] == ["l2p", "both", "synthetic", "seed2"]
    assert first["config"] == {"protocol.decays": "[0.9, 0.99]", "seed": 2}
