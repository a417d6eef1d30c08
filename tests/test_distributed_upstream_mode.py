"""``python -m benchmarks.upstream.distributed``: the processes' shares are the samples the codebases' samplers give
them, every share holds the classes of its global batch in the same order, and usage errors are one line (no
upstream code is needed)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("timm")
from benchmarks.upstream import distributed  # noqa: E402


@pytest.mark.parametrize("world", [2, 4])
def test_each_process_gets_every_world_th_sample_from_its_rank(world):
    """FlyGCL's / Si-Blurry's / MISA's OnlineSampler: a process takes the stream's samples ``rank, rank + W, ...``
    in batches of ``batchsize // world_size``; a DistributedSampler of each global batch gives the same."""
    stream = distributed._stream()
    for rank in range(world):
        taken = [index for step, batch in enumerate(stream)
                 for _, _, indices in distributed._loader(batch, step, 0, rank, world, True) for index in indices.tolist()]
        assert taken == list(range(rank, len(stream) * distributed.GLOBAL_BATCH, world))


@pytest.mark.parametrize("world", [2, 4])
def test_every_share_holds_its_global_batch_classes_in_the_same_order(world):
    """The online trainers mask a batch to the classes it holds and order the exposed classes rank by rank."""
    def first_seen(labels):
        return list(dict.fromkeys(labels.tolist()))

    for step, batch in enumerate(distributed._stream()):
        whole = first_seen(next(iter(distributed._loader(batch, step, 1, 0, 1, False)))[1])
        for rank in range(world):
            _, labels = next(iter(distributed._loader(batch, step, 1, rank, world, False)))
            assert first_seen(labels) == whole


def usage_error(capsys, argv) -> str:
    """The one line a refused command line prints, exit status 2, before any process starts."""
    with pytest.raises(SystemExit) as stopped:
        distributed.main(argv)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and captured.out == ""
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    return captured.err


def test_same_training_without_a_batch_dependent_term_is_one_line(capsys, tmp_path):
    error = usage_error(capsys, ["--codebase", "dualprompt-pytorch", "--checkout", str(tmp_path), "--same-training"])
    assert "dualprompt-pytorch has no batch-dependent term to turn off" in error


def test_a_world_that_does_not_divide_the_global_batch_is_one_line(capsys, tmp_path):
    assert "3 does not divide the global batch of 16" in usage_error(capsys, ["--checkout", str(tmp_path),
                                                                              "--world", "3"])


def test_an_online_trainer_with_more_processes_than_the_stream_keeps_classes_for_is_one_line(capsys, tmp_path):
    error = usage_error(capsys, ["--codebase", "FlyGCL-dualprompt", "--checkout", str(tmp_path), "--world", "8"])
    assert "only for 2 or 4 processes, got 8" in error


def test_the_shares_are_made_of_the_global_batch_only():
    """No sample of one global batch reaches another's shares (a share is cut from its own global batch)."""
    stream = distributed._stream()
    for step, batch in enumerate(stream):
        shares = [x for rank in range(2) for x, _, _ in distributed._loader(batch, step, 0, rank, 2, True)]
        assert torch.equal(torch.cat(shares).sort(0).values, batch.tensors[0].sort(0).values)
