"""No import cycle among the package's modules (fabric/, ranks/, launch/; issue 27): each module's
imports, at its top and inside its functions alike, read from its source. A cycle means two rooms that
each need the other: the layering this test keeps is fabric <- ranks <- launch, and no loop inside one."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"fabric": "nvlink_emu.fabric", "ranks": "nvlink_emu.ranks", "launch": "nvlink_emu.launch"}


def modules() -> dict[str, Path]:
    """Module name -> source file, examples (workload scripts, not modules of the package) left out."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if "examples" in parts:
                continue
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def imports(name: str, path: Path, known: dict) -> set[str]:
    """The package's modules that module `name` imports anywhere in its source."""
    base = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                target = ".".join(parts[:len(parts) - node.level + 1]) + (f".{node.module}" if node.module else "")
            else:
                target = node.module or ""
            for alias in node.names:  # `from package import module` names a module, else the package
                out.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_no_module_of_the_package_is_in_an_import_cycle():
    known = modules()
    assert "nvlink_emu.ranks.gpu" in known and "nvlink_emu.launch.commands.bench" in known
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
