"""Diagnostics: what every stage of ppdsl reports, and how it is printed.

A diagnostic carries a stable code (see `codes.py`), a severity, a location and, for schedule
problems, the rank and step involved. Text output follows the compiler convention
`file:line:col: error[PPS012]: message`, then the source line and a caret.
"""

from __future__ import annotations

import enum
import json
import unicodedata
from collections.abc import Iterable, Sequence

from attrs import field, frozen

from .codes import CODES


class Severity(enum.Enum):
    ERROR = "error"
    WARNING = "warning"

    def __str__(self) -> str:
        return self.value


@frozen(order=False)
class Diagnostic:
    code: str
    message: str
    path: str = "<input>"
    line: int = 1
    column: int = 1
    end_column: int | None = None
    severity: Severity = Severity.ERROR
    rank: int | None = None
    step: int | None = None
    help: str | None = None
    notes: tuple[str, ...] = field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unregistered diagnostic code {self.code}")

    def __str__(self) -> str:
        # What a user printing a diagnostic wants is what `ppdsl lint` prints (without the
        # source excerpt, which needs the file); repr() stays the attrs one, every field.
        return render_text(self)

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple[str, int, int, str, str]:
        return (self.path, self.line, self.column, self.code, self.message)

    def as_json(self) -> dict[str, object]:
        return {
            "file": self.path,
            "line": self.line,
            "column": self.column,
            "end_column": self.end_column,
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "rank": self.rank,
            "step": self.step,
            "help": self.help,
            "notes": list(self.notes),
        }


class PpsError(Exception):
    """Raised by the front end when input cannot become a Program; carries its diagnostics."""

    def __init__(self, diagnostics: Sequence[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(render_header(d) for d in self.diagnostics))


class UsageError(Exception):
    """A problem with how ppdsl was called or with a path: exit code 2, not 1."""


def render_header(d: Diagnostic) -> str:
    return f"{d.path}:{d.line}:{d.column}: {d.severity}[{d.code}]: {visible(d.message)}"


def _shown(ch: str) -> tuple[str, int]:
    """How one source character is printed in an excerpt, and how many terminal cells it takes.

    Control and format characters (NUL, escape sequences, bidirectional overrides) are written
    as visible escapes rather than sent to the terminal; a tab is one blank, as a column counts
    it; East Asian wide characters take two cells and combining marks none."""
    if ch == "\t":
        return " ", 1
    category = unicodedata.category(ch)
    if category in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
        code = ord(ch)
        text = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        return text, len(text)
    if unicodedata.combining(ch):
        return ch, 0
    return ch, 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def visible(text: str) -> str:
    """`text` with control and format characters escaped (a message may quote the input)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == "\n" else _shown(ch)[0] for ch in text)


EXCERPT_CELLS = 150  # longer lines (generated rows can be huge) are cut around the caret
EXCERPT_BEFORE = 60  # cells kept before the caret on a cut line


def excerpt(source_line: str, column: int, end_column: int | None) -> tuple[str, int, int]:
    """The line as printed, the caret's offset in terminal cells, and its width (at least 1)."""
    n = len(source_line)
    first = min(max(column - 1, 0), n)
    last = max(first + 1, min(end_column - 1, n) if end_column is not None else first + 1)
    # Only characters that can be shown are looked at (a character takes at least one cell, but
    # for combining marks): a row of a million actions costs no more than a short one.
    lo, hi = (0, n) if n <= EXCERPT_CELLS + 10 else (max(0, first - EXCERPT_BEFORE), min(n, first + EXCERPT_CELLS))
    cells = [_shown(ch) for ch in source_line[lo:hi]]
    caret = first - lo
    start, end = 0, len(cells)
    if lo > 0 or hi < n or sum(w for _, w in cells) > EXCERPT_CELLS + 10:
        back = 0
        start = caret
        while start > 0 and back + cells[start - 1][1] <= EXCERPT_BEFORE:
            start -= 1
            back += cells[start][1]
        used = 0
        end = start
        while end < len(cells) and used + cells[end][1] <= EXCERPT_CELLS:
            used += cells[end][1]
            end += 1
    lead = "..." if lo + start > 0 else ""
    text = lead + "".join(c for c, _ in cells[start:end]) + ("..." if lo + end < n else "")
    caret_at = len(lead) + sum(w for _, w in cells[start:caret])
    width = sum(w for _, w in cells[caret:min(last - lo, end)])
    return text, caret_at, max(1, min(width, 80))


def render_text(d: Diagnostic, source_line: str | None = None) -> str:
    """The header, then the offending line with a caret under the column, then help/notes."""
    out = [render_header(d)]
    if source_line and not source_line.isspace():  # (not strip(): O(line) for every diagnostic)
        shown, caret_at, width = excerpt(source_line.rstrip("\n"), d.column, d.end_column)
        gutter = f"{d.line} | "
        out.append(gutter + shown)
        out.append(" " * (len(gutter) + caret_at) + "^" * width)
    for note in d.notes:
        out.append(f"  = note: {visible(note)}")
    if d.help:
        out.append(f"  = help: {visible(d.help)}")
    return "\n".join(out)


def sorted_unique(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Sorted by position, exact duplicates dropped (two passes may find the same fault)."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for d in sorted(diagnostics, key=Diagnostic.sort_key):
        key = (d.sort_key(), d.rank, d.step)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def to_json(diagnostics: Iterable[Diagnostic]) -> str:
    return json.dumps([d.as_json() for d in diagnostics], indent=2)
