"""Rewrite .pps files in canonical form.

Comments, ranges, zip groups, generators and line breaks inside rows are kept; spacing and
option order are normalised. With --check nothing is written and the exit status is 1 when a
file would change (for CI and pre-commit).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from ..diagnostics import PpsError, UsageError
from ..files import read_text
from ..load import format_of
from .common import add_max_steps, print_diagnostics, write_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help=".pps files to format ('-' reads stdin, writes stdout)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file would change")
    p.add_argument("--diff", action="store_true", help="print a unified diff instead of writing")
    add_max_steps(p)


def run(args: argparse.Namespace) -> int:
    from ..expansion import parse  # Lark: imported by the command that needs it
    from ..syntax.formatter import format_text

    status = 0
    for path in args.files:
        if format_of(path) == "csv":
            print(f"ppdsl fmt: error: {path}: fmt formats .pps files; a CSV becomes one with "
                  f"`ppdsl convert {path} {Path(path).with_suffix('.pps')}`", file=sys.stderr)
            status = 2
            continue
        try:
            text = read_text(path)
            formatted = format_text(text, path, args.max_steps, parse)
        except PpsError as exc:
            print_diagnostics(exc.diagnostics)
            status = max(status, 1)
            continue
        except UsageError as exc:  # one unreadable path should not stop the others
            print(f"ppdsl fmt: error: {exc}", file=sys.stderr)
            status = 2
            continue
        if path == "-":
            sys.stdout.write(formatted)
            continue
        if formatted == text:
            continue
        if args.check or args.diff:
            if args.diff:
                sys.stdout.writelines(unified_diff(text, formatted, path))
            else:
                print(f"would reformat {path}", file=sys.stderr)
            status = max(status, 1)
        else:
            write_output(path, formatted)
            print(f"reformatted {path}", file=sys.stderr)
    return status


NO_NEWLINE = "\\ No newline at end of file\n"


def unified_diff(before: str, after: str, path: str) -> list[str]:
    """A unified diff `patch` applies: a last line without its newline is marked as diff marks
    it (difflib leaves that to the caller, and the lines would run together)."""
    out = []
    for line in difflib.unified_diff(before.splitlines(True), after.splitlines(True), path, path + " (formatted)"):
        out.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE)
    return out
