"""What the subcommands share: printing diagnostics, reading programs, writing files."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from ..diagnostics import Diagnostic, UsageError, render_text

_TEXT_CACHE: dict[str, list[str]] = {}


def _source_line(d: Diagnostic) -> str | None:
    if d.path not in _TEXT_CACHE:
        try:
            # utf-8-sig: a byte-order mark is not part of line 1's columns (the parser drops it).
            # Lines as the parser counts them: at "\n" only (splitlines also breaks at "\r", "\x0c"...).
            with open(d.path, encoding="utf-8-sig", errors="replace", newline="") as f:  # (no "\r" -> "\n")
                text = f.read()
            _TEXT_CACHE[d.path] = [line.removesuffix("\r") for line in text.split("\n")]
        except OSError:
            _TEXT_CACHE[d.path] = []
    lines = _TEXT_CACHE[d.path]
    return lines[d.line - 1] if 0 < d.line <= len(lines) else None


def check_number(flag: str, value: float | None, low: float, high: float, low_inclusive: bool = True) -> None:
    """A numeric flag inside [low, high] (or (low, high]), finite: else a usage error naming both."""
    if value is None:
        return
    above = value >= low if low_inclusive else value > low
    if not (math.isfinite(value) and above and value <= high):
        bound = "at least" if low_inclusive else "more than"
        raise UsageError(f"{flag} must be {bound} {low:g} and at most {high:g}, not {value:g}")


# What `simulate` and `show` print of a broken schedule before a count of the rest: the
# picture or the report is what they are for (`lint` lists everything on request).
SHOWN_DIAGNOSTICS = 50


def print_diagnostics(diagnostics: Iterable[Diagnostic], stream: TextIO | None = None, limit: int = 0) -> None:
    """Every diagnostic with its source line; with `limit`, the first `limit` and a count."""
    out = stream or sys.stderr
    found = list(diagnostics)
    for d in found[:limit] if limit else found:
        print(render_text(d, _source_line(d)), file=out)
    rest = len(found) - limit
    if limit and rest > 0:
        print(f"... and {rest} more diagnostic{'s' * (rest != 1)} (`ppdsl lint --max-errors 0` lists them all)",
              file=out)


def write_output(path: str | None, text: str) -> None:
    """Write to a file atomically (a crash never leaves half a schedule), or to stdout."""
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    target = Path(path)
    if target.parent and not target.parent.exists():
        raise UsageError(f"{path}: directory {target.parent} does not exist")
    tmp = target.with_name(f".{target.name}.ppdsl-tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
