"""Data flows one way: no ppdsl module reaches itself through the modules it imports (imports inside
functions counted), what sits below the checker does not import it, the runtime's verifier does
not import the worker (which runs it), and no module keeps a cache keyed by `id()` of a program."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "ppdsl"
# Below the checker: the encoding and the engine, memory, lowering, the simulator.
BELOW_CHECK = ["layout.py", "links.py", "encoding.py", "semantics.py", "memory.py", "lower.py", "simulate.py", "costs.py",
               "profiles.py", "cost_sources.py", "ir.py", "sim/critical.py", "gcpause.py"]


def imported(path: Path) -> set[str]:
    """Absolute names of the ppdsl modules (and names from them) a module imports, anywhere in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def edges(path: Path) -> set[str]:
    """The ppdsl modules `path` imports, at its top or inside a function, but not under `if
    TYPE_CHECKING:` (never run). `from . import x` names the module x; `from .m import name`
    names m (a package's `__init__` counts as a module: what it imports runs with it)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while pending:
        node = pending.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                assert isinstance(child, ast.If)
                pending.extend(child.orelse)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([base] if base else []))
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names)
            pending.append(child)
    return {m for m in found if m in MODULES and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    out.append(sorted(component))
    return out


def test_the_import_graph_has_no_cycle() -> None:
    # A function-level import hides a cycle from Python, not from the layers: counted here too.
    graph = {name: edges(path) for name, path in MODULES.items()}
    assert "ppdsl.search.driver" in graph["ppdsl.search.output"], "the graph misses an edge it should see"
    found = cycles(graph)
    shown = [" -> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(shown)


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, pending = set(), [start]
    while pending:
        for child in graph[pending.pop()] - seen:
            seen.add(child)
            pending.append(child)
    return seen


def test_the_syntax_reaches_no_generator_search_or_checker() -> None:
    # A `use` line is read as data; loading expands it (ppdsl/expansion.py), above the syntax.
    graph = {name: edges(path) for name, path in MODULES.items()}
    above = ("ppdsl.generators", "ppdsl.search", "ppdsl.check", "ppdsl.costs", "ppdsl.profiles", "ppdsl.cost_sources",
             "ppdsl.load")
    for name in sorted(n for n in MODULES if n.startswith("ppdsl.syntax")):
        up = sorted(m for m in reached(graph, name) if m.startswith(above))
        assert not up, f"{name} reaches {up}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", BELOW_CHECK)
def test_nothing_below_the_checker_imports_its_internals(module: str) -> None:
    names = imported(PACKAGE / module)
    internals = sorted(n for n in names if n.startswith("ppdsl.check."))
    assert not internals, f"{module} imports {internals}"
    assert not any(n == "ppdsl.check" or n.startswith("ppdsl.check.") for n in names), module


def test_verifier_and_worker_do_not_import_each_other() -> None:
    # The worker runs the verifier; what both need to build a stage lives in runtime/jobs/models.py.
    assert not any(n.startswith("ppdsl.runtime.jobs.worker") for n in imported(PACKAGE / "runtime" / "jobs" / "verify.py"))


def test_no_cache_is_keyed_by_id_of_a_program() -> None:
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id":
                arg = ast.unparse(node.args[0]) if node.args else ""
                assert "program" not in arg, f"{path.relative_to(ROOT)}:{node.lineno}: id({arg})"


# Each framework is imported by its adapter alone: the interpreter, the transport, stage values,
# --verify and the worker are written once against `runtime/framework.py`.
ADAPTERS = {"paddle": "runtime/paddle_backend", "torch": "runtime/torch_backend"}


@pytest.mark.parametrize("framework", sorted(ADAPTERS))
def test_only_its_adapter_imports_a_framework(framework: str) -> None:
    importers = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                       if any(n == framework or n.startswith(framework + ".") for n in imported(path)))
    assert importers, f"nothing imports {framework}: the adapter has moved"
    outside = [p for p in importers if not p.startswith(ADAPTERS[framework] + "/")]
    assert not outside, f"{outside} import {framework}; only {ADAPTERS[framework]}/ may"
