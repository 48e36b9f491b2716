"""What the subcommands share: printing diagnostics, reading programs, writing files."""

from __future__ import annotations

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
            _TEXT_CACHE[d.path] = Path(d.path).read_text(encoding="utf-8-sig", errors="replace").splitlines()
        except OSError:
            _TEXT_CACHE[d.path] = []
    lines = _TEXT_CACHE[d.path]
    return lines[d.line - 1] if 0 < d.line <= len(lines) else None


def print_diagnostics(diagnostics: Iterable[Diagnostic], stream: TextIO | None = None) -> None:
    out = stream or sys.stderr
    for d in diagnostics:
        print(render_text(d, _source_line(d)), file=out)


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
