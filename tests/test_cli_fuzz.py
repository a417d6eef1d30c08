"""Property: whatever flags a user combines, from valid and invalid values alike, the sweep either
finishes (every result file complete, the table written) or exits with status 2 and one line on stderr;
never a traceback, never a failed run, never a partial file left in the output folder. Tiny data: each
finished example trains a one-block ViT on a dozen images."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_sweep import TINY, TINY_MODEL

from benchmarks.ablation import cli
from benchmarks.ablation.run_specs import run_specs
from benchmarks.core.results import result_path

#: flag -> values: valid ones, values valid alone that may not fit the rest, and invalid ones
FLAGS = {
    "--methods": ["l2p", "dualprompt", "flyprompt", "hide", "l2p,mvp", "bogus", ""],
    "--variants": ["baseline", "router,both", "oracle", "full", "bogus"],
    "--num-experts": ["1", "2", "3", "7", "0", "x"],
    "--num-sessions": ["1", "2", "5", "0"],
    "--image-size": ["32", "48", "-1"],
    "--model-kwargs": [json.dumps(TINY_MODEL), json.dumps({**TINY_MODEL, "embed_dim": 50}),
                       json.dumps({**TINY_MODEL, "bogus": 1}), json.dumps({**TINY_MODEL, "patch_size": 7}), "{bad"],
    "--method-kwargs": ['{"l2p": {"pool_size": 4, "top_k": 1}}', '{"l2p": {"bogus": 1}}', '{"l2p": 3}',
                        '{"nope": {}}', '{"dualprompt": {"reference_quirks": true}}'],
    "--batch-size": ["1", "4", "100", "0"],
    "--online-iter": ["1", "2", "0"],
    "--eval-period": ["4", "1000", "0"],
    "--test-batch-size": ["1", "64", "0"],
    "--disjoint-ratio": ["0", "0.5", "1", "1.5"],
    "--blurry-ratio": ["0", "1", "-0.1"],
    "--decays": ["0.9", "0.5,0.9", "1.0", "0.9,0.9"],
    "--ridge": ["1", "auto", "0", "nan"],
    "--expansion-dim": ["0", "16", "-1"],
    "--aggregate": ["softmax_max", "mean", "bogus"],
    "--router-query": ["clean", "first_iteration", "bogus"],
    "--synthetic-classes": ["2", "3", "1"],
    "--synthetic-train-per-class": ["1", "4", "0"],
    "--seeds": ["1", "0,3", "1,1", "-1"],
    "--device": ["cpu", "meta", "bogus"],
    "--checkpoint-every": ["evaluation", "1", "off", "often"],
    "--lr": ["0.01", "-1"],
    # the studies (--study cost trains nothing and is left to tests/test_study_cost.py)
    "--study": ["routers", "aggregations", "bogus", ""],
    "--router": ["ridge", "prototype,naive_bayes", "kmeans,mlp", "lda", ",", ""],
    "--aggregations": ["mean", "softmax_max,max_prob", "vote", ""],
    "--backbone": ["sup21k", "dino1k", "bogus", ""],
    "--heads": ["online", "0.9,online", "0.5", ""],
    "--expert-schedule": ["method", "session", "budget", "bogus"],
    "--train-mask": ["none", "random", "seen", "batch", "bogus"],
}

#: malformed values of the study flags, each alone, and what their one line names: refused before any work
MALFORMED = [
    (["--study", "bogus"], "--study: invalid choice: 'bogus'"), (["--study", ""], "--study: invalid choice: ''"),
    (["--router", "lda"], "unknown router 'lda'"), (["--router", "ridge,lda"], "unknown router 'lda'"),
    (["--router", ","], "--router: expected comma-separated names"),
    (["--aggregations", "vote"], "unknown aggregation rule 'vote'"),
    (["--aggregations", ""], "--aggregations: expected comma-separated names"),
    (["--backbone", "bogus"], "--backbone: invalid choice: 'bogus'"), (["--backbone", ""], "--backbone: invalid choice"),
    (["--backbone", "sup21k", "--model", "vit_tiny_patch16_224"], "--backbone sup21k names the model"),
    # a backbone whose numbers the paper's table of the study has not, or that the study cannot tell apart
    (["--study", "components", "--methods", "flyprompt", "--backbone", "dino1k"],
     "the components study: the paper's components table has the backbones sup21k, sup21k-1k, not dino1k"),
    (["--aggregations", "mean", "--backbone", "ibot1k"], "is the model of the backbones ibot21k, ibot1k"),
    # --sweep: each value by its setting's rule (tests/test_study_sweeps.py has the rest)
    (["--sweep", "M=16,-1"], "--sweep: M=-1: expansion_dim"), (["--sweep", "bogus=1"], "'bogus' is no protocol setting"),
    (["--sweep", "decays=0.9,0.9/0.9"], "--sweep: decays=0.9/0.9"), (["--heads", "0.5"], "no EMA copy of decay 0.5"),
    # a method the study's table has no row for would be trained and shown nowhere; one method named twice
    (["--study", "offline", "--methods", "seq-ft"], "--study offline --methods seq-ft: the study's table has no row"),
    (["--study", "ranpac", "--methods", "l2p"], "its rows are ranpac, ranpac-frozen, ranpac-collect, flyprompt"),
    (["--methods", "coda-prompt,coda_prompt"], "coda-prompt and coda_prompt both name coda-prompt"),
]


@st.composite
def command_lines(draw):
    chosen = draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=5, unique=True))
    argv = []
    for flag in chosen:
        argv += [flag, draw(st.sampled_from(FLAGS[flag]))]
    return argv


def outcome_is_clean(argv, output: Path, capsys) -> None:
    status = cli.main([*TINY, *argv, "--output", str(output)])  # an exception here fails the property
    err = capsys.readouterr().err
    left = sorted(str(p.relative_to(output)) for p in output.glob("**/*") if p.is_file()) if output.exists() else []
    assert not [p for p in left if p.endswith(".tmp") or p.startswith(("claims", "checkpoints", "failures"))], left
    if status == 2:
        lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert not [p for p in left if p.startswith("runs")], left  # rejected before any run
        return
    assert status == 0, f"exit status {status}: {err}"
    args = cli.build_parser().parse_args([*TINY, *argv])
    sweep = cli.resolve(args)
    for spec in run_specs(sweep.methods, sweep.variants, sweep.datasets, sweep.seeds):
        assert "metrics" in json.loads(result_path(output, spec).read_text())
    assert json.loads((output / "table.json").read_text())


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=command_lines())
def test_any_flag_combination_finishes_or_is_one_line(argv, capsys):
    with tempfile.TemporaryDirectory() as folder:
        outcome_is_clean(argv, Path(folder) / "out", capsys)


def test_malformed_study_flags_are_one_line_and_exit_2(tmp_path, capsys):
    for argv, named in MALFORMED:
        output = tmp_path / "out"
        assert cli.main([*TINY, *argv, "--output", str(output)]) == 2, argv
        lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning: ")]
        assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
        assert not output.exists(), argv  # refused before anything is written
