"""What the subcommands share: printing diagnostics, reading programs, writing files."""

from __future__ import annotations

import argparse
import math
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO

from attrs import evolve

from ..diagnostics import Diagnostic, UsageError, render_text
from ..wording import plural
from ..limits import DEFAULT_MAX_LOWERED_STEPS, DEFAULT_MAX_STEPS, MAX_ACTIONS, MAX_MEMORY
from ..files import read_bytes
from ..memory import UNIT, Limit, parse_limit

def _source_lines(path: str) -> list[str]:
    """The lines of an input as the parser counts them (only `\n` ends a line), undecodable
    bytes replaced: the excerpt of a PPS000 shows where the bad byte is."""
    try:
        data = read_bytes(path)
    except UsageError:
        return []
    # utf-8-sig: a byte-order mark is not part of line 1's columns (the parser drops it).
    text = data.decode("utf-8-sig", errors="replace")
    return [line.removesuffix("\r") for line in text.split("\n")]


# What `simulate` and `show` print of a broken schedule before a count of the rest: the
# picture or the report is what they are for (`lint` lists everything on request).
SHOWN_DIAGNOSTICS = 50


def print_diagnostics(diagnostics: Iterable[Diagnostic], stream: TextIO | None = None, limit: int = 0) -> None:
    """Every diagnostic with its source line; with `limit`, the first `limit` and a count."""
    out = stream or sys.stderr
    found = list(diagnostics)
    lines: dict[str, list[str]] = {}  # per call: a file rewritten since (fmt) is read afresh
    for d in found[:limit] if limit else found:
        if d.path not in lines:
            lines[d.path] = _source_lines(d.path)
        text = lines[d.path]
        print(render_text(d, text[d.line - 1] if 0 < d.line <= len(text) else None), file=out)
    rest = len(found) - limit
    if limit and rest > 0:
        print(f"... and {plural(rest, 'more diagnostic')} (`ppdsl lint --max-errors 0` lists them all)", file=out)


# How many other places a folded diagnostic names (`fold_alike`) before "...".
FOLDED_PLACES = 8
_QUOTED = re.compile(r"`[^`]*`")


def fold_alike(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic per cause: those of one code and file whose messages differ only in what
    they quote (`<0SEND_F3 0RECV_B0>`, `<0SEND_F4 0RECV_B1>`, ...) become the first of them with
    a note of how many more and where. For text output; JSON lists every one."""
    groups: dict[tuple[str, str, str, str], list[Diagnostic]] = {}
    for d in diagnostics:
        groups.setdefault((d.code, d.path, d.severity.value, _QUOTED.sub("``", d.message)), []).append(d)
    out = []
    for first, *rest in groups.values():
        if rest:
            places = ", ".join(f"{d.line}:{d.column}" for d in rest[:FOLDED_PLACES])
            more = ", ..." if len(rest) > FOLDED_PLACES else ""
            notes = first.notes + (f"and {len(rest):,} more like it, at {places}{more}",)
            first = evolve(first, notes=notes)  # type: ignore[arg-type]  # attrs types converter=tuple badly
        out.append(first)
    return out


def refuse_overwriting(source: str, output: str | None) -> None:
    """Writing a result over an input would lose the input (a conversion or expansion also drops
    its comments, ranges and zips): refuse, whatever path (a symlink, a hard link, `./x`) names it."""
    if output is None or output == "-" or source == "-":
        return
    try:
        same = os.path.samefile(source, output)
    except OSError:  # the output does not exist yet (or the input does not: load reports that)
        return
    if same:
        raise UsageError(f"{output} is the input {source}: refusing to overwrite it; write the result "
                         "to another file")


def refuse_csv_output(output: str | None, command: str) -> None:
    """`command` writes .pps text: a `.csv` name for it would hold text no CSV reader takes."""
    if output is not None and output != "-" and Path(output).suffix.lower() == ".csv":
        raise UsageError(f"{output}: `ppdsl {command}` writes a .pps file; for PyTorch's CSV write a .pps "
                         f"and run `ppdsl convert FILE.pps {output}`")


def require_directory_of(path: str, label: str) -> None:
    """UsageError unless the directory `path` is to be written in exists (`label` names it)."""
    parent = Path(path).parent
    if not parent.is_dir():
        raise UsageError(f"{label}: directory {parent} does not exist")


def write_output(path: str | None, text: str) -> None:
    """Write to a file atomically (a crash never leaves half a schedule), or to stdout.

    A file written over keeps its permissions, and a symlink stays one: what it points to is
    written (the new text is renamed over the link's target, not over the link)."""
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    require_directory_of(path, path)
    target = Path(os.path.realpath(path))
    try:
        mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:  # a new file: the umask decides, as for any file the user makes
        mode = None
    tmp = target.with_name(f".{target.name}.ppdsl-tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"{path}: {exc.strerror or exc}") from None


# --- option values: argparse types, so a bad value is a usage error (exit 2) naming the option --

def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number >= minimum (and <= maximum, a limit of limits.py)."""

    def convert(text: str) -> int:
        try:
            value = int(text) if len(text) <= 100 else int("x")  # (int() of 5000 digits is an error too)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, not `{text[:40]}`") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, not {value}")
        return value

    return convert


def number(low: float, high: float, low_inclusive: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number above `low` (or from it) and at most `high`."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not `{text[:40]}`") from None
        above = value >= low if low_inclusive else value > low
        if not (math.isfinite(value) and above):
            bound = "from" if low_inclusive else "above"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound} {low:g}, not `{text[:40]}`")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:g}, not `{text[:40]}`")
        return value

    return convert


def add_max_steps(p: argparse.ArgumentParser, default: int = DEFAULT_MAX_STEPS, lowered: str = "") -> None:
    """`--max-steps N`: every command that reads a schedule takes it (limits.DEFAULT_MAX_STEPS);
    unset it is None, and the command's default applies (`lowered`: when that one differs)."""
    also = f"; {DEFAULT_MAX_LOWERED_STEPS:,} {lowered}" if lowered else ""
    p.add_argument("--max-steps", type=whole_number(1, MAX_ACTIONS), metavar="N",
                   help=f"read a program of up to N steps, generated or written out (default {default:,}{also}: "
                        f"a few seconds of this command; at most {MAX_ACTIONS:,})")


positive_number = number(0, MAX_MEMORY)  # --max-memory: only compared, so only finite matters


def memory_limit(text: str) -> Limit:
    """An argparse type: `--max-memory 4` (in `memory.UNIT`) or `6GiB`, `1.5GB` (bytes)."""
    try:
        return parse_limit(text, MAX_MEMORY)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def byte_limit_needs_sizes(limit: Limit) -> UsageError:
    """A limit in bytes given without sizes to compare it with."""
    return UsageError(f"--max-memory {limit} is in bytes, and no profile with sizes is given: add --costs PROFILE.json "
                      "from `ppdsl run --profile` (it measures each stage's bytes), or give the limit in "
                      f"{UNIT} (a plain number)")
