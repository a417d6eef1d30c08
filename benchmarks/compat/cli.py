"""``python -m benchmarks.compat [--envs all|oldest|CHECKOUT ...] [--checks install,library,quickstart,upstream]
[--checkouts DIR] [--cache DIR] [--rebuild] [--json FILE] [--markdown FILE]``

Builds each pinned environment of docs/compatibility.md from the package registry (one at a time, cached
under --cache and reused while its pins are unchanged), installs the project in it with a plain
``pip install`` of a clean copy of the tree, and runs the checks asked: the library's tests, the README's
Quick start, and the codebase's upstream checks on its checkout under --checkouts (run by
``python -m benchmarks.upstream --python ENV``). Prints the table; exit status 0 when every check asked
passed, 1 when one failed, 2 (one line on stderr) for a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from benchmarks.compat import checks, venvs
from benchmarks.compat.environments import Environment, load_environments, select
from benchmarks.compat.outcome import Outcome
from benchmarks.compat.report import CHECKS, Row, failed, markdown, scrub, to_json
from benchmarks.core.errors import UsageError
from benchmarks.core.results import write_text_atomic
from benchmarks.flags import Parser, add_input_flag, add_output_flag

DEFAULT_CACHE = Path.home() / ".cache" / "fly-modules" / "envs"
CHECK_NAMES = tuple(name for name, _ in CHECKS)


def _check_list(text: str) -> Tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in CHECK_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected names among {','.join(CHECK_NAMES)}, got {text!r}")
    return tuple(name for name in CHECK_NAMES if name in names or name == "install")  # the others need it


class _Parser(Parser):
    """Its usage errors reach main() as UsageError, checked with the others (one line, exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m benchmarks.compat", description=__doc__.split("\n\n")[1],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["all"], metavar="NAME",
                        help="all (default), oldest, checkout folder names of docs/compatibility.md's table, or a "
                             "mix of them (oldest FlyGCL: both rows)")
    parser.add_argument("--checks", type=_check_list, default=CHECK_NAMES,
                        help=f"comma-separated, among {','.join(CHECK_NAMES)} (default: all; install always runs)")
    add_input_flag(parser, "--checkouts", "folder", default=None,
                        help="folder holding the upstream checkouts (needed by the upstream check)")
    add_output_flag(parser, "--cache", "folder", default=str(DEFAULT_CACHE),
                    help="where the environments are built and kept")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the environments even when cached")
    add_output_flag(parser, "--json", "file", default=None, help="write every row, version and outcome here")
    add_output_flag(parser, "--markdown", "file", default=None, help="write the table here (for docs/results/)")
    return parser


def resolve(args: argparse.Namespace) -> List[Environment]:
    """The rows to run; every argument and every interpreter checked before anything is built."""
    rows = select(load_environments(), args.envs)
    if "upstream" in args.checks:
        check_checkouts(args.checkouts, rows)
    for python in sorted({row.python for row in rows}):
        venvs.find_interpreter(python)
    args.files = venvs.tree_files()
    return rows


def check_checkouts(checkouts: Optional[Path], rows: Sequence[Environment]) -> None:
    """Before anything is built: the upstream check's folder holds a checkout of every row asked for."""
    if checkouts is None or not checkouts.is_dir():
        raise UsageError("--checkouts: expected the folder holding the upstream checkouts (the upstream check "
                         f"needs it), found {checkouts or 'none'}; or leave upstream out of --checks")
    missing = [row for row in rows if not (checkouts / row.checkout).is_dir()
               or not any((checkouts / row.checkout).iterdir())]
    if missing:
        names = ", ".join(row.checkout for row in missing)
        raise UsageError(f"--checkouts {checkouts}: no checkout {names} in it (expected {checkouts / missing[0].checkout}, "
                         f"a clone of https://github.com/{missing[0].codebase}); clone it there, narrow --envs, or "
                         "leave upstream out of --checks")


def command_line(args: argparse.Namespace) -> str:
    """The command as the report shows it: the choices, never this machine's paths."""
    words = ["python -m benchmarks.compat", "--envs", *args.envs, "--checks", ",".join(args.checks)]
    words += ["--checkouts DIR"] if args.checkouts is not None else []
    return " ".join(words)


def _progress(row: Environment, check: str, outcome: Outcome) -> None:
    print(f"{row.checkout} [{row.label}] {check}: {outcome.cell} ({outcome.seconds:.0f} s)", file=sys.stderr,
          flush=True)


def run_group(group: Sequence[Environment], args: argparse.Namespace, readme: str) -> List[Row]:
    """Rows sharing one environment: built (or reused), the project installed, the library's checks run once,
    the upstream checks once per codebase."""
    first = group[0]
    rows = [Row(row) for row in group]
    shared: Dict[str, Outcome] = {}
    try:
        built = venvs.ensure_environment(first, args.cache, rebuild=args.rebuild)
    except RuntimeError as error:
        shared["install"] = Outcome("fail", f"environment not built: {error}")
        built = None
    if built is not None:
        installed, disk_mb = dict(python=venvs.python_version(built.python), **built.packages), built.disk_mb()
        for row in rows:
            row.installed, row.folder, row.disk_mb = installed, built.folder.name, disk_mb
        with tempfile.TemporaryDirectory(prefix="fly_compat_tree_") as folder:
            copy = venvs.clean_copy(Path(folder), args.files)
            shared["install"] = venvs.install_project(built, copy)
            _progress(first, "install", shared["install"])
            if shared["install"].status == "pass":
                if "quickstart" in args.checks:
                    shared["quickstart"] = checks.run_quickstart(built, readme)
                if "library" in args.checks:
                    shared["library"] = checks.run_library_tests(built, copy)
    else:
        _progress(first, "install", shared["install"])
    skipped = Outcome("not run", "the install failed")
    for row in rows:
        row.outcomes = {name: shared.get(name, skipped) for name in args.checks if name != "upstream"}
        if "upstream" in args.checks:
            row.outcomes["upstream"] = (checks.run_upstream(built, row.environment.checkout, args.checkouts)
                                        if shared["install"].status == "pass" else skipped)
        for name, outcome in row.outcomes.items():
            if name != "install":  # said once, as soon as known
                _progress(row.environment, name, outcome)
    return rows


def groups(rows: Sequence[Environment]) -> List[List[Environment]]:
    """Rows with equal Python and requirements share one environment, in the table's order."""
    shared: Dict[Tuple[str, Tuple[str, ...]], List[Environment]] = {}
    for row in rows:
        shared.setdefault((row.python, tuple(sorted(row.requirements))), []).append(row)
    return list(shared.values())


def remove_stale(cache: Path) -> None:
    """Environments of rows whose pins changed since they were built, when every row's interpreter is here
    (otherwise a row's key is unknown, and nothing is removed)."""
    try:
        keys = [venvs.environment_key(row) for row in load_environments()]
    except UsageError:
        return
    for name in venvs.remove_stale(cache, keys):
        print(f"removed {name} from {cache}: no row of the table asks for it any more", file=sys.stderr)


def execute(rows: Sequence[Environment], args: argparse.Namespace) -> int:
    readme = (venvs.ROOT / "README.md").read_text()
    remove_stale(args.cache)
    results: List[Row] = []
    for group in groups(rows):  # one environment at a time: each build takes the machine's cores
        results += run_group(group, args, readme)
    results.sort(key=lambda row: rows.index(row.environment))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    command, host = command_line(args), venvs.host_description()
    places = {str(args.cache): "CACHE", str(args.checkouts or ""): "DIR", str(venvs.ROOT): "REPO",
              tempfile.gettempdir(): "TMP", str(Path.home()): "~"}
    table = scrub(markdown(results, command, date, host), places)
    print(table)
    if args.json is not None:
        write_text_atomic(args.json, scrub(to_json(results, command, date, host), places))
    if args.markdown is not None:
        write_text_atomic(args.markdown, table)
    bad = failed(results)
    if bad:
        print(f"failed: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns the exit status (2 with one line on stderr for a usage error)."""
    try:
        args = build_parser().parse_args(argv)
        rows = resolve(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return execute(rows, args)

