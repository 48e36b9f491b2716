"""Diagnostics: what every stage of ppdsl reports, and how it is printed.

A diagnostic carries a stable code (see `codes.py`), a severity, a location and, for schedule
problems, the rank and step involved. Text output follows the compiler convention
`file:line:col: error[PPS012]: message`, then the source line and a caret.
"""

from __future__ import annotations

import enum
import json
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
    return f"{d.path}:{d.line}:{d.column}: {d.severity}[{d.code}]: {d.message}"


def render_text(d: Diagnostic, source_line: str | None = None) -> str:
    """The header, then the offending line with a caret under the column, then help/notes."""
    out = [render_header(d)]
    if source_line and not source_line.isspace():  # (not strip(): O(line) for every diagnostic)
        # expandtabs(1) keeps every column where it is; cut a long row before it, not after:
        # a file of one 900 KB row and 100,000 diagnostics would otherwise take minutes.
        shown = source_line.rstrip("\n")
        width = 1
        if d.end_column is not None and d.end_column > d.column:
            width = d.end_column - d.column
        if len(shown) > 160:
            # Keep the caret on screen for very long rows (generated rows can be huge).
            start = max(0, d.column - 1 - 60)
            shown = ("..." if start else "") + shown[start : start + 150].expandtabs(1) + "..."
            caret_at = d.column - 1 - start + (3 if start else 0)
        else:
            shown = shown.expandtabs(1)
            caret_at = d.column - 1
        gutter = f"{d.line} | "
        out.append(gutter + shown)
        out.append(" " * (len(gutter) + caret_at) + "^" * max(1, min(width, 80)))
    for note in d.notes:
        out.append(f"  = note: {note}")
    if d.help:
        out.append(f"  = help: {d.help}")
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
