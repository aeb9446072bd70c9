"""The import graph of fabric/, ranks/ and launch/, read from the source (ast): no import cycle and no private
name taken from another room, where this file checks it (NO_CYCLES: every package; CHECKED: issue 27 extends it to
the three packages)."""

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the folders as installed (pyproject.toml's package-dir): fabric/ is nvlink_emu.fabric, ...
PACKAGES = {"fabric": "nvlink_emu.fabric", "ranks": "nvlink_emu.ranks", "launch": "nvlink_emu.launch"}
# the packages (and everything under them) where a cycle or a private import from outside fails the test
CHECKED = ("nvlink_emu.ranks.mpi4py_layer", "nvlink_emu.fabric.switch", "nvlink_emu.ranks.transport",
           "nvlink_emu.ranks.switch")
# where a cycle fails it: all three packages
NO_CYCLES = ("nvlink_emu.fabric", "nvlink_emu.ranks", "nvlink_emu.launch")


def modules() -> dict[str, Path]:
    """Every module of the three packages: dotted name -> file (folders with an __init__.py only, so
    launch/examples' scripts are not modules)."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if not all((ROOT / folder / Path(*parts[:i]) / "__init__.py").is_file() for i in range(len(parts))):
                continue
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, str]]:
    """(module, imported name or "") of each import in `path`, at any depth (a lazy import in a function is
    still a dependency), resolved to the modules in `known`; a package's own submodules are not implied
    (importing a.b runs a's __init__ first, which is Python's order, not a dependency of the importer)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name.split(".")
                while target and ".".join(target) not in known:
                    target.pop()
                if target:
                    found.append((".".join(target), ""))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in known:  # `from package import module`
                    found.append((f"{source}.{alias.name}", ""))
                elif source in known:
                    found.append((source, alias.name))
    return found


@functools.cache
def graph() -> dict[str, dict[str, set[str]]]:
    """module -> {imported module: names taken from it ("" for the module itself)}."""
    files = modules()
    edges: dict[str, dict[str, set[str]]] = {name: {} for name in files}
    for name, path in files.items():
        for target, imported in imports(name, path, set(files)):
            if target != name:
                edges[name].setdefault(target, set()).add(imported)
    return edges


def cycles(edges: dict[str, dict]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import cycle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in edges:
                continue
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
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert cycles({"a": {"b": {""}}, "b": {"c": {""}}, "c": {"a": {""}}, "d": {"a": {""}}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": {""}}, "b": {}, "c": {"b": {""}}}) == []


def test_the_graph_holds_the_layers_imports():
    """The parser sees relative, absolute and `from package import module` imports (else the checks below
    would pass on an empty graph)."""
    edges = graph()
    layer = "nvlink_emu.ranks.mpi4py_layer"
    assert f"{layer}.win" in edges[f"{layer}.MPI"]                        # from .win import WIN_NULL, Win
    assert f"{layer}.MPI" in edges[layer]                                 # from . import MPI
    assert "nvlink_emu.ranks.collectives" in edges[f"{layer}.context"]    # from nvlink_emu.ranks import collectives
    assert "Handle" in edges[f"{layer}.win"]["nvlink_emu.fabric.addressing"]
    assert len([name for name in edges if within(name, (layer,))]) >= 10


@pytest.mark.parametrize("package", NO_CYCLES)
def test_no_import_cycle(package):
    edges = graph()
    inside = {name: {t: n for t, n in targets.items() if within(t, (package,))}
              for name, targets in edges.items() if within(name, (package,))}
    assert cycles(inside) == [], f"import cycles in {package}"


def test_no_import_cycle_across_the_packages():
    """fabric <- ranks <- launch: no cycle through modules of different packages either (the per-package test
    above sees only the edges inside one)."""
    assert cycles(graph()) == []


@pytest.mark.parametrize("package", CHECKED)
def test_no_module_outside_takes_a_private_name(package):
    """No module outside `package` imports a _private name of one of its modules."""
    taken = sorted(f"{name} imports {target}.{imported}" for name, targets in graph().items()
                   if not within(name, (package,)) for target, names in targets.items() if within(target, (package,))
                   for imported in names if imported.startswith("_"))
    assert taken == []


def test_no_module_outside_ranks_takes_a_private_name():
    """fabric and launch import no _private name of another module (issue 27; ranks' parts may lend each
    other theirs, as the mpi4py layer's modules do)."""
    taken = sorted(f"{name} imports {target}.{imported}" for name, targets in graph().items()
                   if within(name, ("nvlink_emu.fabric", "nvlink_emu.launch"))
                   for target, names in targets.items() for imported in names if imported.startswith("_"))
    assert taken == []


MOST_LINES = 700  # a module longer than this holds more than one room (issue 27)


def test_no_module_is_over_700_lines():
    long = sorted(f"{path.relative_to(ROOT)}: {n} lines" for path in modules().values()
                  if (n := len(path.read_text().splitlines())) > MOST_LINES)
    assert long == []
