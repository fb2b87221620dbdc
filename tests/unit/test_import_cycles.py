"""No import cycles in perm_core or ui: every import counts, at module level or inside a function (a deferred
import hides a circle from Python, not from a reader)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules(root: Path, packages=("perm_core", "ui")) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in root.joinpath(package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules `name` imports: `from a.b import c` counts a.b.c when that is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package, `level` dots up
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known.keys()
            found |= submodules or {base}
    resolved = set()
    for module in found:
        while module and module not in known:
            module = module.rpartition(".")[0]
        if module and module != name:
            resolved.add(module)
    return resolved


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_in_perm_core_or_ui():
    known = modules(ROOT)
    assert "perm_core.verify.check" in known and "ui.runtime.runs" in known
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert "perm_core.families.base" in graph["perm_core.families.bert"]
    assert cycles(graph) == []


def test_a_cycle_is_found_even_through_a_deferred_import(tmp_path):
    package = tmp_path / "perm_core"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from perm_core.b import thing\n")
    (package / "b.py").write_text("def thing():\n    from perm_core import c\n")
    (package / "c.py").write_text("import perm_core.a\n")
    (package / "d.py").write_text("from . import a\n")
    known = modules(tmp_path, ("perm_core",))
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert graph["perm_core.d"] == {"perm_core.a"}
    assert cycles(graph) == [["perm_core.a", "perm_core.b", "perm_core.c"]]
