"""Values that pass every flag's own check but do not fit together, or that only the output folder, the
device, the model or the method can reject: one line on stderr, exit status 2, before any data is
generated (benchmarks/ablation/preflight.py). Bugs keep their traceback."""

from __future__ import annotations

import errno
import json
import random
import tempfile

import numpy as np
import pytest
import torch
from cli_errors import one_line_error
from tiny_sweep import TINY, TINY_MODEL

from benchmarks import flags
from benchmarks.ablation import cli, preflight


def model(**changes) -> str:
    return json.dumps({**TINY_MODEL, **changes})


MISFITS = [
    # kind of misfit, flags, what the line must name
    ("model keyword", ["--model-kwargs", model(bogus=1)], ["--model-kwargs", "unexpected keyword argument 'bogus'"]),
    ("model shape", ["--model-kwargs", model(embed_dim=50)], ["--model-kwargs", "divisible by num_heads"]),
    ("model family", ["--model", "resnet18"], ["--model resnet18", "expected a timm ViT"]),
    ("image size", ["--image-size", "64"], ["--image-size 64", "expected the model's input size"]),
    ("method keyword", ["--method-kwargs", '{"l2p": {"bogus": 1}}'], ["--method-kwargs", "'bogus'"]),
    ("method value", ["--method-kwargs", '{"l2p": {"pool_size": 3}}'], ["--methods l2p", "use pool_size >="]),
    ("experts and pool", ["--num-experts", "7"], ["--num-experts 7", "use pool_size >= 14"]),
    ("method and model", ["--model-kwargs", model(class_token=False, global_pool="avg")],
     ["--methods l2p", "class token"]),
    ("device kind", ["--device", "meta"], ["--device meta", "expected cpu, cuda"]),
]


@pytest.mark.parametrize("kind, flags, needles", MISFITS, ids=[m[0] for m in MISFITS])
def test_misfits_are_one_line_before_any_data(kind, flags, needles, capsys, no_work, tmp_path):
    error = one_line_error(capsys, cli.main, [*TINY, *flags, "--output", str(tmp_path / "out")])
    for needle in needles:
        assert needle in error, error
    assert "change" in error  # the flag to change
    assert not (tmp_path / "out").exists()


def test_unreadable_misa_prompts(capsys, no_work, tmp_path):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for name in ("g_prompt.pt", "e_prompt.pt"):
        (prompts / name).write_text("not a tensor file")
    error = one_line_error(capsys, cli.main, [*TINY, "--methods", "misa", "--misa-prompts", str(prompts),
                                    "--output", str(tmp_path / "out")])
    assert "--methods misa" in error and f"--misa-prompts {prompts}" in error


def test_output_that_is_a_file(capsys, no_work, tmp_path):
    (tmp_path / "file").write_text("")
    error = one_line_error(capsys, cli.main, [*TINY, "--output", str(tmp_path / "file" / "out")])
    assert f"{tmp_path / 'file'} is a file; expected a folder" in error and "--output" in error


def test_output_that_cannot_be_written(capsys, no_work, tmp_path, monkeypatch):
    # Tests may run as root, whom permissions do not stop: the refusal is injected where the probe writes.
    original = tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and str(dir).startswith(str(tmp_path)):
            raise PermissionError(errno.EACCES, "Permission denied", str(dir))
        return original(*args, dir=dir, **kwargs)

    monkeypatch.setattr(flags.tempfile, "mkstemp", refuse)
    error = one_line_error(capsys, cli.main, [*TINY, "--output", str(tmp_path / "out")])
    assert f"cannot write in {tmp_path}" in error and "Permission denied" in error and "--output" in error


def test_a_bug_in_a_method_keeps_its_traceback(monkeypatch, tmp_path):
    from benchmarks.methods.l2p import L2P

    def broken(*args, **kwargs):
        raise KeyError("an internal error, not a user's")

    monkeypatch.setattr(L2P, "from_protocol", classmethod(broken))
    with pytest.raises(KeyError, match="an internal error"):
        cli.main([*TINY, "--output", str(tmp_path / "out")])


def test_the_check_leaves_the_random_generators_alone():
    sweep = cli.resolve(cli.build_parser().parse_args([*TINY, "--methods", "l2p,dualprompt,flyprompt"]))
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    expected = torch.rand(3), np.random.rand(3), random.random()
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    preflight.check_models(sweep.protocol, sweep.methods, sweep.datasets, preflight.class_counts(sweep.data), 1)
    assert torch.equal(torch.rand(3), expected[0]) and np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]
