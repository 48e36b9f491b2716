"""The user docs stay a reference: no issue numbers or work branches in them, and every
backticked name of a ppdsl module, attribute or file in the docs and the package's docstrings
is one that exists.

A name is checked when its first part is `ppdsl`, a module or subpackage of ppdsl (`encoding`,
`scan`, `runtime`, ...) or a class defined in ppdsl (`Encoded.pos`); anything else in backticks
(`paddle.nn.Linear`, `out.json`, `0F{0..3}`) is not ppdsl's to check. Names are resolved from
the source (top-level definitions, class bodies, `self.x` assignments, imports), so nothing is
imported and the test runs without paddle."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "ppdsl"
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Variables in the docs' prose that share a module's name: `schedule` is a PipelineSchedule
# (`schedule.timings`), not the module ppdsl/runtime/interpreter/schedule.py.
VARIABLES = {"schedule"}
FILE_SUFFIXES = (".py", ".lark")
TOP_DIRS = ("ppdsl", "tests", "benchmarks", "examples", "scripts", "grammars", "schedules", "docs")

HISTORY = [
    (re.compile(r"\bissues?\s+#?\d+", re.I), "an issue number"),
    (re.compile(r"\b[Ii]ssue #"), "an issue reference"),
    (re.compile(r"\bi\d+-[a-z]"), "a work branch"),
]


def _spans(text: str) -> Iterator[str]:
    """What a reader sees in backticks: fenced blocks (examples, run by their own tests) left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for m in re.finditer(r"(`+)(.+?)\1", text, flags=re.S):
        if "\n\n" not in m.group(2):
            yield m.group(2)


def _docstrings(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield doc


@cache
def _modules() -> dict[str, Path]:
    """Dotted name below ppdsl -> its file: `syntax.scan`, `runtime`, `encoding`, ..."""
    out: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out[".".join(parts)] = path
    return out


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _names(body: list[ast.stmt], with_self: bool = False) -> dict[str, ast.AST]:
    """Names a module or class body defines; with `with_self`, also `self.x = ...` in its methods."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        out[name.id] = node
                if isinstance(target, ast.Name) and target.id in ("__slots__", "__all__"):
                    for const in ast.walk(node.value):  # slotted attributes; lazily exported names
                        if isinstance(const, ast.Constant) and isinstance(const.value, str):
                            out.setdefault(const.value, node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            out.update(_names(node.body + node.orelse + getattr(node, "handlers", []), with_self))
        elif isinstance(node, ast.ExceptHandler):
            out.update(_names(node.body))
    if with_self:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(sub, ast.AnnAssign) else []
                    for t in targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            out.setdefault(t.attr, sub)
    return out


@cache
def _classes() -> dict[str, list[ast.ClassDef]]:
    out: dict[str, list[ast.ClassDef]] = {}
    for path in _modules().values():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(node)
    return out


def _class_has(cls: ast.ClassDef, attr: str, seen: frozenset[str] = frozenset()) -> ast.AST | None:
    found = _names(cls.body, with_self=True).get(attr)
    if found is not None:
        return found
    for base in cls.bases:  # a base defined in ppdsl (Enum members, inherited methods)
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        for parent in _classes().get(name, []):
            if name not in seen and (hit := _class_has(parent, attr, seen | {name})) is not None:
                return hit
    return None


def _attr(node: ast.AST, rest: list[str]) -> bool:
    """Does `rest` name something inside `node` (a module or a class)?"""
    if not rest:
        return True
    head = rest[0]
    if head.startswith("__") and head.endswith("__"):
        return True  # object's own (`Action.__str__`)
    if isinstance(node, ast.Module):
        found = _names(node.body).get(head)
    elif isinstance(node, ast.ClassDef):
        found = _class_has(node, head)
    else:
        return False  # an attribute of a value (a function's result, a constant): not followed
    if found is None:
        return False
    if isinstance(found, (ast.ClassDef, ast.Module)):
        return _attr(found, rest[1:])
    if isinstance(found, ast.ImportFrom) and found.module is not None and rest[1:]:
        return True  # re-exported from elsewhere; its own name was found
    return len(rest) == 1 or not isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef))


def resolves(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "ppdsl":
        parts = parts[1:]
        if not parts or _attr(_tree(PACKAGE / "__init__.py"), parts):
            return True
    modules = _modules()
    # The longest module prefix, matched at the package root or at any depth (`scan` is syntax.scan).
    for n in range(len(parts), 0, -1):
        tail = ".".join(parts[:n])
        hits = [path for dotted, path in modules.items() if dotted == tail or dotted.endswith("." + tail)]
        if hits:
            return any(_attr(_tree(path), parts[n:]) for path in hits)
    return any(_attr(cls, parts[1:]) for cls in _classes().get(parts[0], []))


def _checked(name: str) -> bool:
    """Is this backticked name ppdsl's?"""
    first = name.split(".")[0]
    if first in VARIABLES:
        return False
    module_names = {part for dotted in _modules() for part in dotted.split(".")}
    return first == "ppdsl" or first in module_names or first in _classes()


def _path_exists(path: str) -> bool:
    roots = [ROOT, ROOT / "docs", PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    return any((root / path).exists() for root in roots)


def _is_ppdsl_path(path: str) -> bool:
    first = path.split("/")[0]
    module_names = {part for dotted in _modules() for part in dotted.split(".")}
    return (first in TOP_DIRS and "/" in path) or (path.endswith(FILE_SUFFIXES) and first.removesuffix(".py") in module_names)


DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w.-]*|[\w-]+\.(?:py|lark))(?![\w/*{-])")


def stale_names(text: str) -> list[str]:
    bad = []
    for span in _spans(text):
        for m in PATH.finditer(span):
            path = m.group(1)
            if _is_ppdsl_path(path) and not _path_exists(path):
                bad.append(path)
        for m in DOTTED.finditer(span):
            name = m.group(1)
            if name.endswith(FILE_SUFFIXES) or re.search(r"\.(md|pps|csv|json|svg|html|txt|yaml|toml)$", name):
                continue  # a file name: the path check's
            if span[m.end():m.end() + 1] in ("/", "*"):
                continue
            if _checked(name) and not resolves(name):
                bad.append(name)
    return bad


def _sources() -> list[Path]:
    return USER_DOCS + sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_backticked_ppdsl_name_exists(path: Path) -> None:
    texts = [path.read_text(encoding="utf-8")] if path.suffix == ".md" else list(_docstrings(path))
    bad = sorted({name for text in texts for name in stale_names(text)})
    assert not bad, f"{path.relative_to(ROOT)} names what does not exist: {', '.join(bad)}"


def test_the_name_check_catches_stale_names() -> None:
    assert stale_names("(`encoding.ReadRows`), `semantics.steps_are_an_order`, `ppdsl.memory`") == ["encoding.ReadRows"]
    assert stale_names("sent past `_completes_plain`, `semantics._completes_plain`") == ["semantics._completes_plain"]
    assert stale_names("`runtime/transport/wire.py` and `runtime/gemm.py`, `Encoded.pos`, `Encoded.nowhere`") == [
        "runtime/gemm.py", "Encoded.nowhere"]
    assert stale_names("`paddle.nn.Linear`, `out.json`, `x.pps`, `0F{0..3}`, `schedule.timings`, `a.kind`") == []
    assert stale_names("```python\nimport ppdsl.nowhere\n```\n") == []


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_name_no_issue_or_branch(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [f"{text.count(chr(10), 0, m.start()) + 1}: {what} ({m.group(0)!r})"
             for pattern, what in HISTORY for m in pattern.finditer(text)]
    assert not found, f"{path.relative_to(ROOT)} tells history (it goes to benchmarks/RESULTS.md): {found}"


def test_the_history_check_catches_each_form() -> None:
    for text in ("issue 13's work", "see Issue #4", "branch `i13-read`", "issues 10 and 13"):
        assert any(p.search(text) for p, _ in HISTORY), text
    assert not any(p.search("an issue with the file, 13 steps, i1f1b.csv") for p, _ in HISTORY)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, blanks to `-`."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("path", [*USER_DOCS, ROOT / "benchmarks" / "RESULTS.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_its_page_and_heading(path: Path) -> None:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        page = (path.parent / file).resolve() if file else path
        if not page.exists() or (anchor and page.suffix == ".md" and anchor not in _anchors(page)):
            bad.append(target)
    assert not bad, f"{path.relative_to(ROOT)} links to what is not there: {bad}"


def test_the_developer_test_commands_name_real_markers_and_paths() -> None:
    import shlex

    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    block = re.search(r"^## Tests\n\n```sh\n(.*?)^```", page, re.S | re.M)
    assert block, "docs/development.md has no command block under ## Tests"
    markers = re.search(r"^markers = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert markers, "pyproject.toml declares no pytest markers"
    declared = set(re.findall(r'"(\w+):', markers.group(1)))
    commands = [shlex.split(line.split("#")[0]) for line in block.group(1).splitlines() if "pytest" in line]
    assert ["-m", "not slow"] in [c[i:i + 2] for c in commands for i in range(len(c))]
    for argv in commands:
        args = argv[argv.index("pytest") + 1:]
        for flag, value in zip(args, args[1:]):
            if flag == "-m":
                assert set(re.findall(r"\w+", value)) - {"not", "and", "or"} <= declared, value
        assert all((ROOT / a).exists() for a in args if a.startswith("tests")), argv
