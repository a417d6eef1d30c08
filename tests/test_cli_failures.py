"""A training that fails becomes error rows in the tables, its traceback is kept, the sweep goes on and
its exit status says so; writes that fail (disk full, permissions) keep the previous file and end the
sweep with one line."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from tiny_sweep import TINY

from benchmarks.ablation import cli, execution, failures, report
from benchmarks.ablation.preemption import RunInterrupted
from benchmarks.core import checkpointing, files, results

TWO_METHODS = [*TINY, "--methods", "l2p,dualprompt"]


def test_a_failed_training_is_an_error_row_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    output = tmp_path / "out"
    original = execution.run_training
    trained = []

    def failing(method, dataset, seed, variants, *args, **kwargs):
        trained.append(method)
        if method == "l2p":
            raise RuntimeError("CUDA out of memory (injected)")
        return original(method, dataset, seed, variants, *args, **kwargs)

    monkeypatch.setattr(execution, "run_training", failing)
    assert cli.main([*TWO_METHODS, "--output", str(output)]) == failures.FAILED_RUNS_EXIT_CODE
    captured = capsys.readouterr()
    assert trained == ["l2p", "dualprompt"]  # the failure did not stop the sweep
    assert "Traceback (most recent call last)" in captured.err and "in failing" in captured.err
    assert "error: 1 of 2 runs failed" in captured.err
    rows = {r["method"]: r for r in json.loads((output / "table.json").read_text())}
    assert rows["dualprompt"]["seeds"] == 1 and rows["dualprompt"]["error"] is None
    assert rows["l2p"]["seeds"] == 0 and rows["l2p"]["A_auc_mean"] is None and rows["l2p"]["failed_seeds"] == [1]
    assert rows["l2p"]["error"] == "RuntimeError: CUDA out of memory (injected)"
    assert "| synthetic | L2P | baseline | 1 | RuntimeError: CUDA out of memory (injected) |" in captured.out
    record = json.loads((output / "failures" / "synthetic" / "l2p" / "baseline" / "seed1.json").read_text())
    assert "in failing" in record["traceback"] and record["spec"]["method"] == "l2p"
    assert not (output / "runs" / "synthetic" / "l2p").exists()

    # The next sweep trains only the failed run; its result replaces the failure.
    monkeypatch.setattr(execution, "run_training", original)
    trained.clear()
    monkeypatch.setattr(execution, "run_training", lambda method, *a, **k: trained.append(method) or original(method, *a, **k))
    assert cli.main([*TWO_METHODS, "--output", str(output)]) == 0
    assert trained == ["l2p"] and not (output / "failures").exists()
    rows = json.loads((output / "table.json").read_text())
    assert [r["seeds"] for r in rows] == [1, 1] and all(r["error"] is None for r in rows)


def test_what_is_not_recorded_as_a_failed_run():
    assert failures.recordable(RuntimeError("a bug or an out-of-memory"), world=1)
    assert not failures.recordable(RuntimeError("one rank failed"), world=2)  # the others would wait forever
    assert not failures.recordable(KeyboardInterrupt(), world=1)
    assert not failures.recordable(RunInterrupted("k", None, 1, 2), world=1)
    assert not failures.recordable(results.WriteError("disk full"), world=1)


def test_error_rows_in_the_markdown_and_csv(tmp_path):
    finished = [{"spec": {"method": "mvp", "variant": "baseline", "dataset": "d", "seed": 1},
                 "metrics": {"A_auc": 0.5, "A_last": 0.4, "A_avg": 0.45, "F_last": 0.1},
                 "seconds_per_batch": 0.01, "peak_memory_mb": 10.0}]
    failed = [{"spec": {"method": "mvp", "variant": "baseline", "dataset": "d", "seed": 2}, "error": "E: a|b"},
              {"spec": {"method": "l2p", "variant": "router", "dataset": "d", "seed": 1}, "error": "E: c"}]
    rows = report.add_failures(report.summarize_results(finished), failed)
    assert [(r["method"], r["seeds"], r["failed_seeds"]) for r in rows] == [("l2p", 0, [1]), ("mvp", 1, [2])]
    assert set(rows[0]) == set(rows[1])  # one set of columns
    markdown = report.write_tables(tmp_path, rows)
    assert "| d | MVP | baseline | 1 | 50.00 ± n/a |" in markdown  # the finished seed stays in the means
    assert "| d | L2P | router | 1 | E: c |" in markdown and "| d | MVP | baseline | 2 | E: a/b |" in markdown
    assert (tmp_path / "table.csv").read_text().count("\n") == 3


# ---------------------------------------------------------------------------- failed writes
def disk_full(monkeypatch, module, *, under=None):
    """Every file ``module`` opens for writing (under ``under``) fails as on a full disk."""
    original = os.fdopen

    class Full:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.stream.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.stream, name)

    def fdopen(handle, *args, **kwargs):
        stream = original(handle, *args, **kwargs)
        path = os.readlink(f"/proc/self/fd/{handle}") if os.path.exists("/proc/self/fd") else ""
        return Full(stream) if under is None or path.startswith(str(under)) else stream

    monkeypatch.setattr(module.os, "fdopen", fdopen)


def test_a_failed_result_write_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "runs" / "x.json"
    results.write_json_atomic(target, {"good": 1})
    disk_full(monkeypatch, files)
    with pytest.raises(results.WriteError) as raised:
        results.write_json_atomic(target, {"good": 2})
    assert str(raised.value).startswith(f"cannot write {target} (OSError: No space left on device); the previous "
                                        "file is kept")
    assert json.loads(target.read_text()) == {"good": 1} and os.listdir(target.parent) == ["x.json"]


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    store = checkpointing.CheckpointStore(tmp_path / "run")
    payload = {"format": checkpointing.FORMAT, "version": checkpointing.VERSION, "batches": 2, "x": torch.ones(3)}
    store.save(payload)
    disk_full(monkeypatch, files)
    with pytest.raises(checkpointing.WriteError, match="No space left on device"):
        store.save({**payload, "batches": 4})
    assert [p.name for p in store.folder.iterdir()] == ["batch0000002.pt"]
    assert store.latest()[1]["batches"] == 2


def test_a_sweep_whose_result_cannot_be_written_ends_with_one_line(tmp_path, monkeypatch, capsys):
    output = tmp_path / "out"
    assert cli.main([*TINY, "--output", str(output)]) == 0
    result = output / "runs" / "synthetic" / "l2p" / "baseline" / "seed1.json"
    before = result.read_bytes()
    capsys.readouterr()
    disk_full(monkeypatch, files, under=output / "runs")
    assert cli.main([*TINY, "--no-resume", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write {result} (OSError: No space left on device); the previous file is "
                          "kept") and err.count("\n") == 1, err
    assert result.read_bytes() == before
    assert not list(output.glob("**/.*.tmp"))


def test_a_damaged_result_file_is_one_line_before_any_work(tmp_path, capsys):
    output = tmp_path / "out"
    result = output / "runs" / "synthetic" / "l2p" / "baseline" / "seed1.json"
    result.parent.mkdir(parents=True)
    result.write_text('{"spec": {"method": "l2p"')  # cut short by an editor or a damaged disk
    assert cli.main([*TINY, "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {result} is not a result file (JSONDecodeError") and err.count("\n") == 1, err
    assert "delete it" in err


def test_a_failed_table_or_figure_write_keeps_the_previous_one(tmp_path, monkeypatch):
    rows = report.summarize_results([{"spec": {"method": "mvp", "variant": "baseline", "dataset": "d", "seed": 1},
                                      "metrics": {"A_auc": 0.5, "A_last": 0.4, "A_avg": 0.45, "F_last": 0.1},
                                      "seconds_per_batch": 0.01, "peak_memory_mb": 10.0}])
    report.write_tables(tmp_path, rows)
    before = {name: (tmp_path / name).read_bytes() for name in ("table.md", "table.json", "table.csv")}
    disk_full(monkeypatch, files)
    with pytest.raises(results.WriteError, match="table.md .*the previous file is kept"):
        report.write_tables(tmp_path, report.add_failures(rows, []))
    assert {name: (tmp_path / name).read_bytes() for name in before} == before

    class Figure:
        def savefig(self, stream, **kwargs):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")

    (tmp_path / "deltas.png").write_bytes(b"the previous figure")
    with pytest.raises(results.WriteError, match="Disk quota exceeded"):
        files.save_figure(Figure(), tmp_path / "deltas.png")
    assert (tmp_path / "deltas.png").read_bytes() == b"the previous figure"
    assert not list(tmp_path.glob(".*.tmp"))
