"""docs/language.md: its examples parse, and it explains every diagnostic code with a fix."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT
from ppdsl.codes import CODES
from ppdsl.syntax.formatter import format_text
from ppdsl.expansion import parse

PAGE = ROOT / "docs" / "language.md"


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def examples() -> list[str]:
    return re.findall(r"^```pps\n(.*?)^```", page(), flags=re.S | re.M)


# Each construct of the language, as a pattern over an example's text: the page shows every one
# in an example (and test_example_parses_and_is_formatted parses each example).
CONSTRUCTS = {
    "a range": r"\d[A-Z]+\{\d+\.\.\d+\}",
    "a descending range": r"\{(\d+)\.\.(?!\1)\d+\}",
    "a zip": r"\[[^\]]+\]",
    "an idle step": r"(?m)^rank \d+: (_ )+",
    "an overlapped pair": r"\([^;()]+;[^;()]+\)",
    "a batch": r"<[^>]+>",
    "a row on several lines": r"(?m)^rank \d+:\n\s+\S",
    "a comment": r"#",
    "placement=v": r"placement=v",
    "an explicit placement": r"placement=\[",
    "stages=": r"stages=\d",
    "a costs line": r"(?m)^costs ",
    "a generator": r"(?m)^use \w+\(",
    "a recompute": r"\b\d+R\d+\b",
    "an offload and its reload": r"\b(\d+)OFFLOAD(\d+)\b.*\b\1RELOAD\2\b",
}


@pytest.mark.parametrize("construct", sorted(CONSTRUCTS))
def test_page_shows_each_construct_in_an_example(construct: str) -> None:
    assert any(re.search(CONSTRUCTS[construct], text) for text in examples()), f"no example shows {construct}"


@pytest.mark.parametrize("index", range(len(re.findall(r"^```pps\n", PAGE.read_text(encoding="utf-8"), flags=re.M))))
def test_example_parses_and_is_formatted(index: int) -> None:
    text = examples()[index]
    program = parse(text, f"language.md example {index}")
    assert parse(format_text(text)) == program


def test_every_language_code_has_its_own_section_with_a_fix() -> None:
    sections = re.split(r"^#### ", page(), flags=re.M)[1:]
    by_code = {s[:6]: s for s in sections if s.startswith("PPS")}
    for code in (c for c in CODES if c.startswith("PPS0")):
        assert code in by_code, f"docs/language.md has no `#### {code}: ...` section"
        assert "**Fix:**" in by_code[code], f"the {code} section gives no **Fix:**"


def test_every_code_in_codes_py_is_documented_in_language_md() -> None:
    # Whoever adds a code to ppdsl/codes.py documents it here: a section (or a line pointing
    # at the page that explains it) in docs/language.md.
    text = page()
    missing = [code for code in CODES if not re.search(rf"\b{code}\b", text)]
    assert not missing, f"docs/language.md does not mention: {', '.join(missing)}"


@pytest.mark.parametrize("index", range(len(re.findall(r"^```pps\n", PAGE.read_text(encoding="utf-8"), flags=re.M))))
def test_example_lints_clean_when_copied(index: int) -> None:
    """Each example is a whole file a reader can copy: no error and no warning."""
    from ppdsl.check import check

    text = examples()[index]
    program = parse(text, f"language.md example {index}")
    assert [(d.code, d.message) for d in check(program)] == []
    # A row whose comment spells out actions (`# 0F0 1F0 ...`) expands to exactly those.
    for line in text.splitlines():
        row, _, comment = line.partition("#")
        spelled = comment.split()
        if row.startswith("rank ") and spelled and all(re.fullmatch(r"\d+[A-Z]\d+", w) for w in spelled):
            rank = int(row.split()[1].rstrip(":"))
            assert [str(step) for step in program.rows[rank]] == spelled
