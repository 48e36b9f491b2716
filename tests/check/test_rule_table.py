"""docs/checks.md's table of where each rule lives names real code: every backticked name in
its second column is a qualified ppdsl name (module.name, or a file) that exists, so the
table cannot point at a rule that moved."""

from __future__ import annotations

import re

from conftest import ROOT
from test_reference_docs import resolves

PAGE = ROOT / "docs" / "checks.md"


def _rows() -> list[tuple[str, list[str]]]:
    """(rule, names in its place column) of each row of the table."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Where each rule lives", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) != 2 or cells[0] in ("rule", "---"):
            continue
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def _missing(names: list[str]) -> list[str]:
    bad = []
    for name in names:
        if "/" in name:
            if not (ROOT / name).exists():
                bad.append(name)
        elif "." not in name or not resolves(name):
            bad.append(name)  # a bare name is not checkable: say which module holds it
    return bad


def test_the_table_is_there() -> None:
    rows = _rows()
    assert len(rows) >= 10
    assert all(names for _, names in rows), "each rule names its place"


def test_every_place_in_the_table_exists() -> None:
    bad = {rule: missing for rule, names in _rows() if (missing := _missing(names))}
    assert not bad, f"docs/checks.md's rule table names what does not exist: {bad}"


def test_the_check_catches_a_moved_rule() -> None:
    assert _missing(["encoding.Links", "links.Links", "memory.signs"]) == []
    assert _missing(["encoding.LOCAL_NEEDZ", "LOCAL_NEEDS", "tests/search/nowhere.py"]) == [
        "encoding.LOCAL_NEEDZ", "LOCAL_NEEDS", "tests/search/nowhere.py"]
