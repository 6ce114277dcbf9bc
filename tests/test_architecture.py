"""The layering of docs/architecture.md, checked statically by parsing every import statement (also
those inside functions, which run lazily but are dependencies all the same)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torchlean_bridge", "semantics", "importers", "exporters")
OUTER = ("semantics", "importers", "exporters")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _project_module(name: str) -> str | None:
    """The project module an imported dotted name lands in (its longest existing prefix)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


@functools.lru_cache(maxsize=None)
def imports_of(module: str) -> set[str]:
    """Every project module ``module`` imports, anywhere in its body."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    type_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                 for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue  # `if TYPE_CHECKING:` imports never run
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                prefix = package[:len(package) - node.level + 1]
                base = ".".join(prefix + ([node.module] if node.module else []))
            # `from pkg import sub` imports the submodule when there is one
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found.update(m for m in map(_project_module, names) if m and m != module)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_core(module: str) -> bool:
    return module.split(".")[0] == "torchlean_bridge" and not module.startswith("torchlean_bridge.app")


def test_the_scan_sees_lazy_and_relative_imports():
    # guards the test below against a parser that finds nothing
    assert "importers.checkpoints" in imports_of("torchlean_bridge.app.abi")  # inside a function
    assert "torchlean_bridge.bundle" in imports_of("torchlean_bridge.app.abi")  # `from ..bundle import`
    assert "torchlean_bridge.app.cli" in imports_of("torchlean_bridge.__main__")


def test_the_core_imports_neither_semantics_importers_exporters_nor_the_app_layer():
    offenders = {}
    for module in filter(_is_core, MODULES):
        bad = sorted(m for m in imports_of(module)
                     if m.split(".")[0] in OUTER or (m.startswith("torchlean_bridge.app")
                                                     and module != "torchlean_bridge.__main__"))
        if bad:
            offenders[module] = bad
    assert offenders == {}, f"core modules importing outer layers: {offenders}"


def test_the_outer_packages_do_not_import_the_app_layer():
    offenders = {m: sorted(d for d in imports_of(m) if d.startswith("torchlean_bridge.app"))
                 for m in MODULES if m.split(".")[0] in OUTER}
    assert {m: d for m, d in offenders.items() if d} == {}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_among_the_projects_modules():
    # lazy imports count: a cycle through a function-level import is a tangle all the same
    assert _cycles({m: imports_of(m) for m in MODULES}) == []
