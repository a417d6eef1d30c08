"""Several processes on one output folder (benchmarks/ablation/claims.py): each training is claimed by one
process with an atomic lock file, stale claims of dead processes on this host are taken over, and two real
sweeps started together on one folder train every run once and both end with the complete table."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_sweep import TINY

from benchmarks.ablation import cli, execution
from benchmarks.ablation.claims import Claim, Claims, claim_path, this_process
from benchmarks.core.protocol import RunSpec
from benchmarks.parallel import DataParallel

REPOSITORY = Path(__file__).resolve().parents[1]
SPEC = RunSpec("l2p", "baseline", "synthetic", 1)


def dead_pid() -> int:
    """The id of a process of this host that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write_claim(path: Path, **holder) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**this_process(), **holder}))


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


def test_one_holder_at_a_time_and_release(tmp_path, sleeper):
    path = claim_path(tmp_path, SPEC)
    mine = Claim(path)
    assert mine.acquire() is None and json.loads(path.read_text())["pid"] == os.getpid()
    other = Claim(path)
    other.me = {**other.me, "pid": sleeper, "start": None}  # another live process of this host
    assert other.acquire()["pid"] == os.getpid()
    other.release()  # not the holder: leaves the claim alone
    assert path.exists()
    mine.release()
    assert not (tmp_path / "claims").exists()  # the lock and the folders it left empty
    assert other.acquire() is None and json.loads(path.read_text())["pid"] == sleeper


def test_stale_claims_are_taken_over_live_and_foreign_ones_are_not(tmp_path, sleeper):
    path = claim_path(tmp_path, SPEC)
    for holder, stale in (
        ({"pid": dead_pid()}, True),  # its process ended
        ({"pid": sleeper, "start": "1"}, True),  # its process id now belongs to a later process
        ({"pid": sleeper, "start": None}, False),  # a live process of this host
        ({"pid": dead_pid(), "host": socket.gethostname() + "-elsewhere"}, False),  # cannot be seen from here
    ):
        write_claim(path, **holder)
        found = Claim(path).acquire()
        assert (found is None) == stale, holder
        assert json.loads(path.read_text())["pid"] == (os.getpid() if stale else holder["pid"])
        path.unlink()


def test_a_sweep_waits_for_trainings_others_hold_and_says_who(tmp_path, sleeper):
    write_claim(claim_path(tmp_path, SPEC), pid=sleeper, start=None)
    lines, polls = [], []
    claims = Claims(tmp_path, parallel=DataParallel(), device=torch.device("cpu"), lead=True, poll=0.01,
                    notify=lines.append)
    free = RunSpec("dualprompt", "baseline", "synthetic", 1)
    yielded = list(claims.claimed([[SPEC], [free]], unfinished=lambda spec: True,
                                  stop=lambda: polls.append(1) or len(polls) > 4))
    assert yielded == [[free]]  # the free training, while the held one is waited for
    assert len(lines) == 1 and f"held by process {sleeper} on host {socket.gethostname()}" in lines[0]
    assert claim_path(tmp_path, SPEC).exists() and not claim_path(tmp_path, free).exists()


def test_a_dead_sweeps_claim_is_taken_over_by_the_next_sweep(tmp_path, capsys):
    output = tmp_path / "out"
    write_claim(claim_path(output, SPEC), pid=dead_pid())
    assert cli.main([*TINY, "--output", str(output)]) == 0
    assert "waiting" not in capsys.readouterr().err
    assert (output / "runs" / "synthetic" / "l2p" / "baseline" / "seed1.json").exists()
    assert not (output / "claims").exists()


@pytest.mark.slow
def test_two_sweeps_started_together_on_one_folder(tmp_path):
    output = tmp_path / "out"
    argv = [sys.executable, "benchmarks/cross_ablation.py", *TINY, "--methods", "l2p,dualprompt", "--seeds", "1,2",
            "--threads", "1", "--output", str(output)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    sweeps = [subprocess.Popen(argv, cwd=REPOSITORY, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for _ in range(2)]
    outputs = [sweep.communicate(timeout=400) for sweep in sweeps]
    for sweep, (_, err) in zip(sweeps, outputs):
        assert sweep.returncode == 0, err
        assert "Traceback" not in err, err
    trained = [line.split(":")[0] for out, _ in outputs for line in out.splitlines() if ": A_auc " in line]
    assert sorted(trained) == sorted(f"synthetic/{m}/baseline/seed{s}" for m in ("l2p", "dualprompt") for s in (1, 2))
    table = (output / "table.md").read_text()
    assert all(table.strip() in out for out, _ in outputs)  # each ends with the complete table
    rows = json.loads((output / "table.json").read_text())
    assert [(r["method"], r["seeds"]) for r in rows] == [("l2p", 2), ("dualprompt", 2)]
    # The same table as one sweep alone (timings and memory aside).
    assert cli.main([*argv[2:-1], str(tmp_path / "alone")]) == 0

    def metrics(table):
        return [{k: v for k, v in r.items() if k not in ("seconds_per_batch", "peak_memory_mb")} for r in table]

    assert metrics(rows) == metrics(json.loads((tmp_path / "alone" / "table.json").read_text()))
    assert not (output / "claims").exists() and not (output / "checkpoints").exists()
    assert not [p for p in output.glob("**/*") if re.search(r"\.tmp$", p.name)]


def test_a_sweep_of_another_setting_on_the_same_folder_is_caught_before_the_table(tmp_path, capsys, monkeypatch):
    output = tmp_path / "out"
    original = execution.run_training
    other = output / "runs" / "synthetic" / "dualprompt" / "baseline" / "seed1.json"

    def meanwhile(method, *args, **kwargs):  # another sweep, with another --lr, finishes dualprompt first
        records = original(method, *args, **kwargs)
        record = json.loads(json.dumps(records["baseline"]))
        record["spec"]["method"] = "dualprompt"
        record["setting"] = {"protocol": {**record["protocol"], "lr": 0.5}}
        record.update(wall_seconds=1.0, world_size=1)  # as the sweep's execution adds them
        other.parent.mkdir(parents=True)
        other.write_text(json.dumps(record))
        return records

    monkeypatch.setattr(execution, "run_training", meanwhile)
    assert cli.main([*TINY, "--methods", "l2p,dualprompt", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert f"error: {other} was run with another setting (lr: 0.5 -> None)" in err and err.count("\n") == 1, err
    assert not (output / "table.json").exists()
