"""Import layers: the core imports neither the adapters nor the benchmarks, the adapters do not import the
benchmarks, nothing imports the tests, no modules import each other in a cycle (not even for type
annotations), and an adapter family is a class on the base (``_family``) with at most one shared layout.

Read from the source with ``ast`` (nothing is imported). Imports inside functions count like
module-level ones: they run on the first call and close the same cycles. Imports under
``if TYPE_CHECKING:`` never run: the layer checks skip them, the cycle check counts them.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> the name it is imported under (adapters/ is installed as fly_modules.adapters).
PACKAGES = {"fly_modules": "fly_modules", "adapters": "fly_modules.adapters", "benchmarks": "benchmarks"}


def module_files() -> Dict[str, Path]:
    """Every module of the three source folders, by its import name."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def runtime_imports(tree: ast.Module, type_checking: bool = False) -> Iterator[ast.stmt]:
    """Import statements that can run: every one except those under ``if TYPE_CHECKING:`` (included
    when ``type_checking``)."""
    skipped: Set[int] = set()
    for node in ast.walk(tree):
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped:
            yield node


def imported_names(module: str, path: Path, type_checking: bool = False) -> Iterator[Tuple[str, int]]:
    """Absolute names (``a.b.c``) this module imports, with the line; ``from p import x`` yields ``p.x``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in runtime_imports(ast.parse(path.read_text(), str(path)), type_checking):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            yield f"{base}.{alias.name}", node.lineno


def resolve(name: str, modules: Dict[str, Path]) -> Optional[str]:
    """The project module ``name`` refers to (itself, or the package whose attribute it is), if any."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@functools.lru_cache(maxsize=None)
def import_graph(type_checking: bool = True) -> Dict[str, Dict[str, int]]:
    """module -> {imported project module: line of the first such import}."""
    modules = module_files()
    graph: Dict[str, Dict[str, int]] = {module: {} for module in modules}
    for module, path in modules.items():
        for name, line in imported_names(module, path, type_checking):
            target = resolve(name, modules)
            if target is not None and target != module:
                graph[module].setdefault(target, line)
    return graph


def all_imports() -> List[Tuple[str, str, int]]:
    """(module, imported name, line) for every runtime import of the three folders, project or not."""
    return [(module, name, line) for module, path in module_files().items() for name, line in imported_names(module, path)]


def strongly_connected(graph: Dict[str, Dict[str, int]]) -> List[List[str]]:
    """Tarjan's strongly connected components with more than one module (the import cycles)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def describe(cycle: List[str], graph: Dict[str, Dict[str, int]]) -> str:
    members = set(cycle)
    edges = [f"{a} -> {b} (line {line})" for a in cycle for b, line in graph[a].items() if b in members]
    return "; ".join(edges)


def in_layer(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


@pytest.mark.parametrize(
    "importer, forbidden",
    [
        ("fly_modules", ("fly_modules.adapters", "adapters", "benchmarks", "tests")),
        ("fly_modules.adapters", ("benchmarks", "tests", "adapters")),
        ("benchmarks", ("tests", "adapters")),
    ],
)
def test_no_upward_imports(importer, forbidden):
    """``adapters`` is forbidden as a top-level name everywhere: it is installed as fly_modules.adapters."""
    found = [
        f"{module}:{line} imports {name}"
        for module, name, line in all_imports()
        if in_layer(module, importer)
        and not (importer == "fly_modules" and in_layer(module, "fly_modules.adapters"))
        and any(in_layer(name, layer) for layer in forbidden)
    ]
    assert not found, "; ".join(found)


def test_the_import_graph_is_read():
    """The checks below would pass vacuously on an empty graph."""
    graph = import_graph()
    assert "fly_modules._ridge" in graph["fly_modules.router"]
    assert "fly_modules" in graph["fly_modules.adapters._handle"]
    assert "fly_modules.distributed" in graph["fly_modules.router"]
    assert strongly_connected({"a": {"b": 1}, "b": {"a": 2}, "c": {}}) == [["a", "b"]]


def test_no_import_cycles():
    graph = import_graph()
    cycles = strongly_connected(graph)
    assert not cycles, " | ".join(describe(cycle, graph) for cycle in cycles)


# The adapters' framework (the registry, the common options, the handle and its record) and the seam
# contract are public classes; every family is a class on the base (``_family``, with the ``Layout`` its
# hooks are written on), which builds on the seam checks and the modules the base imports itself. Any
# other private module is a layout shared by some families.
FRAMEWORK = {"fly_modules.adapters._registry", "fly_modules.adapters._options", "fly_modules.adapters._handle",
             "fly_modules.adapters._record", "fly_modules.adapters.contract"}
BASE = "fly_modules.adapters._family"
LAYOUT = "fly_modules.adapters._layout"
FAMILIES = ["l2p", "dualprompt", "mvp", "hide", "sprompt", "coda", "generic", "reference"]


def shared_layouts(module: str, graph: Dict[str, Dict[str, int]]) -> List[str]:
    """The adapters modules ``module`` imports beyond the framework, the base and what the base imports."""
    allowed = FRAMEWORK | {BASE, LAYOUT, "fly_modules.adapters._seams"} | set(graph[BASE]) | set(graph.get(LAYOUT, ()))
    return sorted(name for name in graph[module]
                  if in_layer(name, "fly_modules.adapters") and name != "fly_modules.adapters" and name not in allowed)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_is_its_own_file_on_the_base_and_at_most_one_shared_layout(family):
    """Reading one family means its own file, the base (and what it builds on), and at most one layout
    shared with other families (the upstream prompt pools, the prefix-assembly fix)."""
    module = f"fly_modules.adapters.{family}"
    graph = import_graph()
    assert BASE in graph[module], f"{module} is not a class on {BASE}"
    layouts = shared_layouts(module, graph)
    assert len(layouts) <= 1, f"{module} builds on {layouts} besides the base"


def test_the_family_rule_can_fail():
    graph = {BASE: {"fly_modules.adapters._head": 1}, "fly_modules.adapters.x": {
        BASE: 1, "fly_modules.adapters._head": 2, "fly_modules.adapters._prompt_pools": 3,
        "fly_modules.adapters._groups": 4}}
    assert shared_layouts("fly_modules.adapters.x", graph) == [
        "fly_modules.adapters._groups", "fly_modules.adapters._prompt_pools"]


# The core's private modules other layers may import: the argument checks with the table of shared
# parameters (fly_modules/_validation.py says it is supported), the torch-version fallbacks the adapters
# register their hooks through (fly_modules/_compat.py), and, for the speed benchmarks that time
# them, the kernels and solvers. The most specific layer listed decides.
SUPPORTED_PRIVATE_CORE = {
    "fly_modules.adapters": {"fly_modules._validation", "fly_modules._compat"},
    "benchmarks": {"fly_modules._validation"},
    "benchmarks.speed": {"fly_modules._validation", "fly_modules._ridge", "fly_modules._blocked"},
}


def test_other_layers_import_only_the_supported_private_core_modules():
    found = []
    for module, targets in import_graph(type_checking=False).items():
        layers = [layer for layer in SUPPORTED_PRIVATE_CORE if in_layer(module, layer)]
        if not layers:
            continue
        allowed = SUPPORTED_PRIVATE_CORE[max(layers, key=len)]
        private = [t for t in targets if t.startswith("fly_modules._") and not in_layer(t, "fly_modules.adapters")]
        found += [f"{module}:{targets[t]} imports {t}" for t in private if t not in allowed]
    assert not found, "; ".join(found)
    assert "fly_modules._validation" in import_graph()["benchmarks.ablation.arguments"]  # the graph was read


# The benchmarks' packages from the bottom up: a module imports only from packages of a lower layer (or its
# own). The shared core sits under every command; the studies are the runner's plug-ins (their routers,
# tables and figures), so the runner imports them and never the other way round; the commands on top do not
# import one another (what two of them share lives lower down).
BENCHMARK_LAYERS = {
    "requirements": 0,  # the Python and torch the benchmarks need, read first by benchmarks/__init__.py
    "flags": 0,  # the command-line flags from the library's rules, under every command (backbone's included)
    "data": 1, "parallel": 1, "backbone": 1,
    "core": 2,
    "methods": 3,
    "studies": 4,
    "ablation": 5,
    "proxy": 6,
    "fidelity": 7, "speed": 7, "gpu": 7, "upstream": 7, "compat": 7,
    "cross_ablation": 8,
}


def benchmark_package(module: str) -> Optional[str]:
    """``benchmarks.core.stream`` -> ``core``; None for ``benchmarks`` itself and outside it."""
    parts = module.split(".")
    return parts[1] if parts[0] == "benchmarks" and len(parts) > 1 else None


def sideways_or_upward(graph: Dict[str, Dict[str, int]]) -> List[str]:
    """Imports between two benchmarks packages whose target is not in a lower layer."""
    found = []
    for module, targets in graph.items():
        source = benchmark_package(module)
        for target, line in targets.items():
            package = benchmark_package(target)
            if source is None or package is None or package == source:
                continue
            if BENCHMARK_LAYERS[package] >= BENCHMARK_LAYERS[source]:
                found.append(f"{module}:{line} imports {target} ({package} is not below {source})")
    return found


def test_every_benchmarks_package_has_a_layer_and_is_a_package():
    folders = {path.name for path in (ROOT / "benchmarks").iterdir()
               if path.is_dir() and not path.name.startswith(("_", "."))}
    modules = {path.stem for path in (ROOT / "benchmarks").glob("*.py") if path.stem != "__init__"}
    assert folders | modules == set(BENCHMARK_LAYERS)
    for folder in folders:
        assert (ROOT / "benchmarks" / folder / "__init__.py").is_file(), f"benchmarks/{folder}/ is not a package"


def test_benchmarks_import_only_from_lower_layers():
    """Imports inside functions count: an import moved into a function to dodge a cycle still fails here."""
    found = sideways_or_upward(import_graph(type_checking=False))
    assert not found, "; ".join(found)
    assert "benchmarks.core.stream" in import_graph()["benchmarks.ablation.runner"]  # the graph was read


def test_the_benchmark_layer_rule_can_fail():
    graph = {"benchmarks.core.results": {"benchmarks.methods": 10, "benchmarks.core.files": 11},
             "benchmarks.fidelity.cli": {"benchmarks.speed.timing": 3, "benchmarks.ablation.runner": 4}}
    assert sideways_or_upward(graph) == [
        "benchmarks.core.results:10 imports benchmarks.methods (methods is not below core)",
        "benchmarks.fidelity.cli:3 imports benchmarks.speed.timing (speed is not below fidelity)"]
