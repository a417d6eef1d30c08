"""Walks of every reader and command with each class of user fault, each class refused by one rule:

- a run file with each of its fields removed, and each given a wrong type: read field by field
  (``benchmarks.core.run_file``) by every reader of run files (the merge, the routing study, the cost
  table, the proxy summary);
- every output flag of every command given a file where it writes a folder (or a folder where it writes a
  file), and a path under a file: ``benchmarks.flags.OutputPath``, when the command line is parsed;
- every command that loads a checkout, with each model file of the checkout removed: one
  ``CheckoutError`` naming the command's own flag and the missing file.

Each ends in exit status 2 and one line naming the file, field or flag, before any work, and leaves the
user's files as they were. Each walk is shown to fail on the mistake it exists for (a reader with a bare
``json.loads``, an output flag parsed without the rule, a loader naming another command's flag).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest
from command_walk import COMMANDS, outcome, parser_of
from run_records import run_record
from tiny_sweep import TINY

from benchmarks.ablation import cli
from benchmarks.core import plan_file, run_file
from benchmarks.core import results as results_module
from benchmarks.core.errors import UsageError
from benchmarks.flags import InputPath, OutputPath, Parser
from benchmarks.proxy import summary
from benchmarks.studies import cost, routing_oracle

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SPEC = {"method": "l2p", "variant": "baseline", "dataset": "synthetic", "seed": 1}
#: a value of another type than each kind of field
WRONG = {dict: "a string", list: "a string", str: 5, int: 1.5, run_file.NUMBER: "5"}


def files_of(folder: Path) -> Dict[str, bytes]:
    """Every file under ``folder`` with its bytes: what a refused command must leave as it was."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_problems(status: Any, err: str, *named: str) -> List[str]:
    """What is wrong with a refusal: not exit status 2, not one ``error: `` line, or a name missing from it."""
    problems = [] if status == 2 else [f"exit status {status}"]
    if not (err.startswith("error: ") and err.count("\n") == 1):
        problems.append(f"not one error line: {err[-300:]!r}")
    return problems + [f"{name!r} not named" for name in named if name not in err]


# ------------------------------------------------------------------------------------------- run files
def field_faults(whole: Dict[str, Any], table: Dict[str, Any]) -> List[Tuple[str, str, Dict[str, Any]]]:
    """``(field, fault, document)``: each field of ``table`` removed (where every file has it) and each given a
    value of another type, in a copy of ``whole`` that is otherwise intact (``a[0].b``: a list item's field).
    The name returned is the one a refusal gives: ``a.*.b`` (an object's values) with the key the walk took."""
    faults = []
    for name, field in run_file.field_names(table):
        *parents, key = name.split(".")
        for fault in ("removed", "wrong type") if field.required else ("wrong type",):
            document = copy.deepcopy(whole)
            holder, path = _holder(document, parents)
            if fault == "removed":
                del holder[key]
            else:
                holder[key] = WRONG[field.kind]
            faults.append((".".join([*path, key]), fault, document))
    return faults


def _holder(document: Dict[str, Any], parents: List[str]) -> Tuple[Any, List[str]]:
    """The object holding a field named ``a.b[0].c``'s (or ``a.*.c``'s) last part, the list items' ``[0]``
    and an object's first value followed; with the parents' names as a refusal gives them."""
    path = []
    for parent in parents:
        key, _, index = parent.partition("[")
        if key == "*":
            key = next(iter(document))
        document = document[key][int(index[:-1])] if index else document[key]
        path.append(f"{key}[{index}" if index else key)
    return document, path


#: diagnostics of every kind the readers read, from committed run files (studies of routers, aggregations,
#: subsets of heads, CKA), one record's worth
WHOLE_DIAGNOSTICS = {
    **json.loads((FIXTURES.parents[1] / "docs/results/proxy-10-studies/runs/synthetic/hide/both/seed3.json")
                 .read_text())["diagnostics"],
    **{key: value for key, value in json.loads(
        (FIXTURES.parents[1] / "docs/results/studies/decays/runs/cifar100-like/flyprompt/full/seed3.json")
        .read_text())["diagnostics"].items() if key == "heads"},
    "cka": {"experts": [0, 1], "residual": [[1.0, 0.5], [0.5, 1.0]], "raw": [[1.0, 0.9], [0.9, 1.0]], "samples": 8},
}


def run_file_faults() -> List[Tuple[str, str, Dict[str, Any]]]:
    """Every field of the run file removed or retyped in a whole record."""
    return field_faults(run_record(SPEC, {}, diagnostics=WHOLE_DIAGNOSTICS), run_file.RUN_FILE)


def test_every_field_of_a_run_file_removed_or_retyped_is_named(tmp_path):
    path = tmp_path / "seed1.json"
    path.write_text(json.dumps(run_record(SPEC, {}, diagnostics=WHOLE_DIAGNOSTICS)))
    assert results_module.read_result(path)["spec"] == SPEC  # the whole record is read
    wrong = []
    faults = run_file_faults()
    for name, fault, record in faults:
        path.write_text(json.dumps(record))
        try:
            results_module.read_result(path)
            wrong.append(f"{name} {fault}: read without a word")
        except results_module.UnreadableResultError as error:
            if str(path) not in str(error) or f"'{name}'" not in str(error) or "\n" in str(error):
                wrong.append(f"{name} {fault}: {error}")
    assert len(faults) > 90 and not wrong, "\n".join(wrong)
    assert {"log.records[0].correct", "diagnostics.members.online.A_auc"} <= {name for name, _, _ in faults}


# ------------------------------------------------------------------------------------------ plan files
WHOLE_PLAN = {"format": plan_file.PLAN_FORMAT, "protocol": {"test_batch_size": 8},
              "trainings": [{"key": "synthetic/l2p/baseline/seed1", "estimate": {"ours": 2.0}}],
              "probes": [{"method": "l2p", "dataset": "synthetic", "device": "cpu", "frozen_per_image": 0.0,
                          "prompted_per_image": 0.1, "eval_parts": {"eval/query": 0.01}}],
              "total_seconds": {"ours": 2.0}}


def test_every_field_of_a_plan_file_removed_or_retyped_is_named(tmp_path):
    path = tmp_path / plan_file.PLAN_FILE
    path.write_text(json.dumps(WHOLE_PLAN))
    assert plan_file.read_plan(path) == WHOLE_PLAN
    wrong, faults = [], field_faults(WHOLE_PLAN, plan_file.PLAN_FIELDS)
    for name, fault, document in faults:
        path.write_text(json.dumps(document))
        try:
            plan_file.read_plan(path)
            wrong.append(f"{name} {fault}: read without a word")
        except UsageError as error:
            if str(path) not in str(error) or f"'{name}'" not in str(error) or "\n" in str(error):
                wrong.append(f"{name} {fault}: {error}")
    assert len(faults) > 25 and not wrong, "\n".join(wrong)


def test_every_reader_of_plan_files_is_one_line_on_a_damaged_one(tmp_path, capsys, no_work):
    readers = {"--shard": (cli.main, [*TINY, "--shard", "1/2", "--output", "{out}"]),
               "cost table": (cost.main, ["--results", "{out}", "--methods", "l2p", "--output", "{out}/tables"])}
    wrong = []
    for reader, (main, argv) in readers.items():
        for damage in ("{bad", json.dumps({**WHOLE_PLAN, "probes": [{"method": "l2p"}]})):
            out = tmp_path / f"{reader.strip('-').split()[0]}-{len(damage)}"
            out.mkdir()
            (out / plan_file.PLAN_FILE).write_text(damage)
            capsys.readouterr()
            status = _status(main, [a.replace("{out}", str(out)) for a in argv])
            problems = one_line_problems(status, capsys.readouterr().err, str(out / plan_file.PLAN_FILE))
            wrong += [f"{reader}, {damage[:10]}: {problem}" for problem in problems]
    assert not wrong, "\n".join(wrong)


def _results_folder(root: Path, record: Dict[str, Any]) -> Path:
    path = root / "runs" / "synthetic" / "l2p" / "baseline" / "seed1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return path


def _status(main: Callable[..., int], argv: List[str]) -> Any:
    """``main(argv)``'s exit status, or the exception that escaped it (a traceback for the user)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code
    except Exception as error:  # noqa: BLE001 - reported by the walk as what the user would see
        return f"a traceback ({type(error).__name__}: {error})"


#: reader -> the command line that reads the run files of a results folder (``{out}``: the folder)
READERS: Dict[str, Tuple[Callable[..., int], List[str]]] = {
    "cross_ablation --merge": (cli.main, [*TINY, "--merge", "--output", "{out}"]),
    "routing study": (routing_oracle.main, ["--results", "{out}", "--output", "{out}/tables"]),
    "cost table": (cost.main, ["--results", "{out}", "--methods", "l2p", "--output", "{out}/tables"]),
    "proxy summary": (summary.main, ["--results", "{out}", "--dataset", "synthetic"]),
}


def reader_walk(tmp_path: Path, capsys) -> List[str]:
    """Every reader on a run file with its metrics of a wrong type and on one without its log."""
    wrong = []
    whole = run_record(SPEC, {})
    log = copy.deepcopy(whole["log"])
    log["records"][0]["correct"] = "many"  # an entry of the log: the merge's curves read it
    for fault, field, change in [("metrics", "'metrics'", {"metrics": "x"}), ("log removed", "'log'", {"log": None}),
                                 ("records entry", "'log.records[0].correct'", {"log": log})]:
        record = {key: value for key, value in {**whole, **change}.items() if value is not None}
        for reader, (main, argv) in READERS.items():
            out = tmp_path / f"{reader.split()[0]}-{fault.split()[0]}"
            path = _results_folder(out, record)
            before = files_of(out)
            capsys.readouterr()
            status = _status(main, [a.replace("{out}", str(out)) for a in argv])
            problems = one_line_problems(status, capsys.readouterr().err, str(path), field)
            problems += [] if files_of(out) == before else ["the results folder changed"]
            wrong += [f"{reader}, {fault}: {problem}" for problem in problems]
    return wrong


def test_every_reader_of_run_files_names_the_file_and_the_field(tmp_path, capsys, no_work):
    wrong = reader_walk(tmp_path, capsys)
    assert not wrong, "\n".join(wrong)


def test_the_reader_walk_fails_on_a_bare_json_load(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(summary, "read_result", lambda path: json.loads(Path(path).read_text()))
    wrong = reader_walk(tmp_path, capsys)
    assert wrong and all(line.startswith("proxy summary") for line in wrong), wrong


# --------------------------------------------------------------------------------------------- outputs
#: the names of flags where a command writes: each must be checked by the output rule
OUTPUT_DESTS = {"output", "json", "markdown", "target", "workdir", "cache"}
#: positionals before an output positional, per command
POSITIONALS = {"benchmarks.backbone": ["sup21k", "{a-file}"]}  # {a-file}: an existing file (the source read)


def output_actions(parser: argparse.ArgumentParser) -> List[argparse.Action]:
    return [action for action in parser._actions if isinstance(action.type, OutputPath)]


def unruled_outputs(parser: argparse.ArgumentParser) -> List[str]:
    """Flags that name where the command writes but are parsed without :class:`OutputPath`."""
    return [action.dest for action in parser._actions if action.dest in OUTPUT_DESTS
            and not isinstance(action.type, OutputPath)]


def output_walk(name: str, main: Callable[..., int], tmp_path: Path, monkeypatch, capsys) -> List[str]:
    """Each output flag of ``main`` given what it cannot write (a file for a folder, a folder for a file,
    a path under a file): exit status 2 and one line naming the flag, at parse time."""
    parser = parser_of(main, monkeypatch)
    wrong = [f"{dest}: parsed without the output rule" for dest in unruled_outputs(parser)]
    a_file, a_folder = tmp_path / "a-file", tmp_path / "a-folder"
    a_file.write_text("the user's")
    a_folder.mkdir(exist_ok=True)
    for action in output_actions(parser):
        flag = action.option_strings[-1] if action.option_strings else action.dest
        place = a_file if action.type.kind == "folder" else a_folder
        for value in (place, a_file / "under"):
            ahead = [text.replace("{a-file}", str(a_file)) for text in POSITIONALS.get(name, [])]
            argv = [f"{flag}={value}"] if action.option_strings else [*ahead, str(value)]
            before = files_of(tmp_path)
            status, err = outcome(main, argv, monkeypatch, capsys)
            problems = one_line_problems(status, err, flag)
            problems += [] if files_of(tmp_path) == before else ["files changed"]
            wrong += [f"{flag} {value}: {problem}" for problem in problems]
    return wrong


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_output_of_every_command_is_checked_before_any_work(name, tmp_path, monkeypatch, capsys):
    wrong = output_walk(name, COMMANDS[name], tmp_path, monkeypatch, capsys)
    assert not wrong, f"{name}:\n" + "\n".join(wrong)


def test_the_walk_finds_the_outputs_and_fails_on_an_unruled_one(tmp_path, monkeypatch, capsys):
    ruled = sum(bool(output_actions(parser_of(main, monkeypatch))) for main in COMMANDS.values())
    assert ruled >= 15  # the walk reached the commands' output flags

    def planted(argv):
        parser = Parser(prog="planted")
        parser.add_argument("--output", type=Path, default=None)
        parser.parse_args(argv)
        return 0

    assert output_walk("planted", planted, tmp_path, monkeypatch, capsys) == ["output: parsed without the output rule"]


def contents_walk(main: Callable[..., int], tmp_path: Path, monkeypatch, capsys) -> Tuple[List[str], int]:
    """Each path an output folder's flag declares it writes (``contents``) made the other kind in an otherwise
    empty output folder: exit status 2 and one line naming the flag and the path, at parse time."""
    wrong, walked = [], 0
    for action in output_actions(parser_of(main, monkeypatch)):
        flag = action.option_strings[-1] if action.option_strings else ""
        for relative, kind in action.type.contents.items():  # (no positional output declares contents)
            out = tmp_path / f"{flag.strip('-')}-{relative.replace('/', '-')}"
            (out / relative).parent.mkdir(parents=True)
            (out / relative).mkdir() if kind == "file" else (out / relative).write_text("the user's")
            before = files_of(tmp_path)
            status, err = outcome(main, [f"{flag}={out}"], monkeypatch, capsys)
            problems = one_line_problems(status, err, flag, str(out / relative))
            problems += [] if files_of(tmp_path) == before else ["files changed"]
            wrong += [f"{flag} with {relative} the other kind: {problem}" for problem in problems]
            walked += 1
    return wrong, walked


def test_every_path_a_command_writes_in_its_output_folder_is_checked_when_parsed(tmp_path, monkeypatch, capsys):
    wrong, walked = [], 0
    for name, main in sorted(COMMANDS.items()):
        found, count = contents_walk(main, tmp_path / name, monkeypatch, capsys)
        wrong += [f"{name}: {line}" for line in found]
        walked += count
    assert walked >= 20 and not wrong, "\n".join(wrong)  # the sweep's, the studies' and the GPU cost's paths


@pytest.mark.parametrize("backend", ["csv", "tensorboard"])
def test_a_log_folder_that_is_a_file_is_refused_before_training(backend, tmp_path, capsys, no_work):
    pytest.importorskip(backend) if backend != "csv" else None
    out = tmp_path / "out"
    out.mkdir()
    (out / "logs").write_text("the user's")
    status = _status(cli.main, [*TINY, "--output", str(out), "--log", backend])
    assert not one_line_problems(status, capsys.readouterr().err, "--output", str(out / "logs"))
    assert files_of(tmp_path) == {"out/logs": b"the user's"}
    (out / "logs").unlink()
    (out / "logs").mkdir()
    (out / "logs" / backend).write_text("the user's")
    status = _status(cli.main, [*TINY, "--output", str(out), "--log", backend])
    assert not one_line_problems(status, capsys.readouterr().err, "--output", str(out / "logs" / backend))


def test_a_later_points_folder_that_is_a_file_stops_the_study_before_its_first_training(tmp_path, capsys, no_work):
    out = tmp_path / "out"
    (out / "sweep").mkdir(parents=True)
    (out / "sweep" / "expansion_dim=32").write_text("the user's")
    status = _status(cli.main, [*TINY, "--sweep", "M=16,32", "--output", str(out)])
    assert not one_line_problems(status, capsys.readouterr().err, str(out / "sweep" / "expansion_dim=32"))
    assert files_of(tmp_path) == {"out/sweep/expansion_dim=32": b"the user's"}


def test_the_routing_study_writing_into_its_results_checks_them_as_its_output(tmp_path, capsys):
    out = _results_folder(tmp_path, run_record(SPEC, {})).parents[4]
    (out / "study_routing.md").mkdir()
    before = files_of(out)
    status = _status(routing_oracle.main, ["--results", str(out)])
    assert not one_line_problems(status, capsys.readouterr().err, "--results", str(out / "study_routing.md"))
    assert files_of(out) == before


@pytest.mark.parametrize("study", ["cost", "components-cost", "routing"])
def test_a_study_whose_output_is_a_file_or_under_one_is_one_line(study, tmp_path, capsys, no_work):
    (tmp_path / "a-file").write_text("the user's")
    for output in (tmp_path / "a-file", tmp_path / "a-file" / "under"):
        status = _status(cli.main, [*TINY, "--study", study, "--output", str(output)])
        assert not one_line_problems(status, capsys.readouterr().err, "--output", str(output))
    assert (tmp_path / "a-file").read_text() == "the user's"


# ---------------------------------------------------------------------------------------------- inputs
#: the names of flags naming a folder or file a command reads: each must be checked by the input rule
INPUT_DESTS = {"checkouts", "checkout", "flygcl", "misa", "reference_repo", "results", "write", "check", "python",
               "source"}
#: positionals around an input positional, per command
INPUT_POSITIONALS = {"benchmarks.backbone": (["sup21k"], ["target.safetensors"])}


def input_actions(parser: argparse.ArgumentParser) -> List[argparse.Action]:
    return [action for action in parser._actions if isinstance(action.type, InputPath)]


def input_walk(name: str, main: Callable[..., int], tmp_path: Path, monkeypatch, capsys) -> Tuple[List[str], int]:
    """Each input flag of ``main`` given nothing, the other kind, and a path under a file: exit status 2 and
    one line naming the flag, at parse time, nothing written."""
    parser = parser_of(main, monkeypatch)
    wrong = [f"{action.dest}: parsed without the input rule" for action in parser._actions
             if action.dest in INPUT_DESTS and not isinstance(action.type, InputPath)]
    a_file, a_folder = tmp_path / "a-file", tmp_path / "a-folder"
    a_file.write_text("the user's")
    a_folder.mkdir(exist_ok=True)
    actions = input_actions(parser)
    for action in actions:
        flag = action.option_strings[-1] if action.option_strings else action.dest
        for value in (tmp_path / "nothing", a_file if action.type.kind == "folder" else a_folder, a_file / "under"):
            before = files_of(tmp_path)
            ahead, after = INPUT_POSITIONALS.get(name, ([], []))
            argv = [f"{flag}={value}"] if action.option_strings else [*ahead, str(value), *map(str, after)]
            status, err = outcome(main, argv, monkeypatch, capsys)
            problems = one_line_problems(status, err, flag, str(value))
            problems += [] if files_of(tmp_path) == before else ["files changed"]
            wrong += [f"{flag} {value}: {problem}" for problem in problems]
    return wrong, len(actions)


def test_every_input_of_every_command_is_checked_when_parsed(tmp_path, monkeypatch, capsys):
    wrong, walked = [], 0
    for name, main in sorted(COMMANDS.items()):
        (tmp_path / name).mkdir()
        found, count = input_walk(name, main, tmp_path / name, monkeypatch, capsys)
        wrong += [f"{name}: {line}" for line in found]
        walked += count
    assert walked >= 16 and not wrong, "\n".join(wrong)


def test_the_input_walk_fails_on_an_unruled_input(tmp_path, monkeypatch, capsys):
    def planted(argv):
        parser = Parser(prog="planted")
        parser.add_argument("--results", type=Path, default=None)
        parser.parse_args(argv)
        return 0

    assert input_walk("planted", planted, tmp_path, monkeypatch, capsys)[0] == ["results: parsed without the input rule"]


# -------------------------------------------------------------------------------------------- checkouts
#: (command, its checkout flag, the fixture checkout, other arguments, the files removed one at a time)
CHECKOUT_COMMANDS = [
    ("benchmarks.fidelity.cli", "--flygcl", "fake_flygcl", ["--methods", "l2p"], "models/*.py"),
    ("benchmarks.fidelity.loop", "--flygcl", "fake_flygcl", ["--methods", "l2p"], "models/*.py"),
    ("benchmarks.fidelity.aggregations", "--flygcl", "fake_flygcl", ["--methods", "dualprompt"], "models/*.py"),
    ("benchmarks.speed.vs_reference", "--reference-repo", "fake_flygcl", ["--quick"], "models/*.py"),
    ("benchmarks.fidelity.cli", "--misa", "fake_misa", [], "models/[!_]*.py"),  # a namespace package would do
    ("benchmarks.fidelity.misa_fam", "--misa", "fake_misa", [], "optim/fam.py"),
]


def checkout_walk(name: str, flag: str, fixture: str, argv: List[str], pattern: str, tmp_path: Path,
                  capsys) -> List[str]:
    """``name`` on a copy of ``fixture`` with each file of ``pattern`` removed in turn."""
    wrong = []
    for removed in sorted((FIXTURES / fixture).glob(pattern)):
        relative = removed.relative_to(FIXTURES / fixture).as_posix()
        checkout = tmp_path / relative.replace("/", "-")
        shutil.copytree(FIXTURES / fixture, checkout)
        (checkout / relative).unlink()
        before = files_of(checkout)
        capsys.readouterr()
        status = _status(COMMANDS[name], [flag, str(checkout), *argv])
        problems = one_line_problems(status, capsys.readouterr().err, f"{flag} {checkout}", relative)
        problems += [] if files_of(checkout) == before else ["the checkout changed"]
        wrong += [f"{relative} removed: {problem}" for problem in problems]
    return wrong


@pytest.mark.parametrize("name, flag, fixture, argv, pattern", CHECKOUT_COMMANDS,
                         ids=[f"{c[0].split('.', 1)[1]} {c[1]}" for c in CHECKOUT_COMMANDS])
def test_every_checkout_with_a_model_file_removed_is_one_line_naming_the_flag(
        name, flag, fixture, argv, pattern, tmp_path, capsys):
    wrong = checkout_walk(name, flag, fixture, argv, pattern, tmp_path, capsys)
    assert not wrong, f"{name}:\n" + "\n".join(wrong)


def test_the_checkout_walk_fails_on_a_loader_naming_another_flag(tmp_path, capsys, monkeypatch):
    from benchmarks.core import reference_checkout
    from benchmarks.fidelity import aggregations

    original = reference_checkout.load_checkout
    monkeypatch.setattr(aggregations.ref, "load_checkout",
                        lambda path, methods, flag="": original(path, methods))  # the loader's default flag
    wrong = checkout_walk("benchmarks.fidelity.aggregations", "--flygcl", "fake_flygcl", ["--methods", "dualprompt"],
                          "models/*.py", tmp_path, capsys)
    assert wrong and all("'--flygcl" in line for line in wrong), wrong


# ------------------------------------------------------------------------------------------ method names
def test_every_methods_flag_takes_the_librarys_spellings_for_one_name():
    from benchmarks.ablation.arguments import build_parser
    from benchmarks.core.method_names import METHOD_NAMES, canonical_method
    from benchmarks.methods import list_methods

    parsed = build_parser().parse_args(["--methods", "coda_prompt,SD_LoRA,sprompt,codaprompt-x"]).methods
    assert parsed == ["coda-prompt", "sd-lora", "s-prompt", "codaprompt-x"]  # the last: refused by the registry
    assert all(canonical_method(name) == name for name in list_methods())  # each name is its own canonical
    assert set(METHOD_NAMES) <= set(list_methods())
    for name in list_methods():  # the library's way of writing a name (underscores) is accepted for every method
        assert canonical_method(name.replace("-", "_").upper()) == name
