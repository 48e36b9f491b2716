"""Data flows one way: what sits below the checker does not import it, the runtime's verifier does
not import the worker (which runs it), and no module keeps a cache keyed by `id()` of a program."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "ppdsl"
# Below the checker: the encoding and the engine, memory, lowering, the simulator.
BELOW_CHECK = ["encoding.py", "semantics.py", "memory.py", "lower.py", "simulate.py", "costs.py", "ir.py",
               "sim/critical.py", "gcpause.py"]


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


@pytest.mark.parametrize("module", BELOW_CHECK)
def test_nothing_below_the_checker_imports_its_internals(module: str) -> None:
    names = imported(PACKAGE / module)
    internals = sorted(n for n in names if n.startswith("ppdsl.check."))
    assert not internals, f"{module} imports {internals}"
    assert not any(n == "ppdsl.check" or n.startswith("ppdsl.check.") for n in names), module


def test_verifier_and_worker_do_not_import_each_other() -> None:
    # The worker runs the verifier; what both need to build a stage lives in runtime/models.py.
    assert not any(n.startswith("ppdsl.runtime.worker") for n in imported(PACKAGE / "runtime" / "verify.py"))


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
