"""Reading schedule files of any supported format into a Program."""

from __future__ import annotations

from pathlib import Path

from .diagnostics import Diagnostic, PpsError, UsageError
from .english import plural
from .ir import Program
from .limits import DEFAULT_MAX_STEPS, MAX_ACTIONS, MAX_FILE_BYTES, MAX_SPARSE_SLOTS, STEPS_PER_RANK, ranks_past, steps_help

FORMATS = (".pps", ".csv")


# Standard input can be read once; what was read is kept, with the stream it came from, so
# that a second reader (the excerpt under a diagnostic, a second `-`) sees the same text.
_STDIN: list[tuple[object, bytes]] = []


def read_bytes(path: str) -> bytes:
    """A file's bytes (or standard input's for `-`), at most MAX_FILE_BYTES. I/O problems raise
    UsageError (exit 2)."""
    too_big = UsageError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB")
    if path == "-":
        import sys

        if not _STDIN or _STDIN[0][0] is not sys.stdin:
            _STDIN[:] = [(sys.stdin, sys.stdin.buffer.read(MAX_FILE_BYTES + 1))]
        data = _STDIN[0][1]
        if len(data) > MAX_FILE_BYTES:
            raise too_big
        return data
    p = Path(path)
    try:
        if p.is_dir():
            raise UsageError(f"{path}: is a directory")
        # Read at most one byte past the limit: /dev/zero or a pipe has no size to check first.
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise too_big
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except PermissionError:
        raise UsageError(f"{path}: permission denied") from None
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    return data


def _looks_utf16(data: bytes) -> bool:
    """A UTF-16 byte-order mark, or ASCII text with every other byte NUL (UTF-16 without one)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    head = data[:200]
    return len(head) >= 4 and (head[1::2].count(0) >= len(head) // 2 - 1 or head[0::2].count(0) >= len(head) // 2 - 1)


def read_text(path: str) -> str:
    """A file's text. I/O problems raise UsageError (exit 2); binary data raises PPS000 (exit 1)."""
    data = read_bytes(path)
    nul = data.find(b"\0")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        nul = exc.start if nul < 0 else min(nul, exc.start)
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        column = nul - (data.rfind(b"\n", 0, nul) + 1) + 1
        if _looks_utf16(data):
            raise PpsError([Diagnostic("PPS000", "UTF-16 text, not UTF-8", path, line, column,
                                       help="save the file as UTF-8 (PowerShell's `>` writes UTF-16; "
                                            "`iconv -f UTF-16 -t UTF-8` converts it)")])
        raise PpsError([Diagnostic("PPS000", "binary data, not a UTF-8 text file", path, line, column,
                                   help=".pps and .csv schedules are plain UTF-8 text")])
    return text.removeprefix("\ufeff")


def format_of(path: str, forced: str | None = None) -> str:
    if forced:
        return forced
    suffix = Path(path).suffix.lower()
    return "csv" if suffix == ".csv" else "pps"


def load_program(path: str, fmt: str | None = None, dialect: str | None = None,
                 steps_limit: int | None = None) -> Program:
    """Parse a `.pps` or PyTorch `.csv` file. Raises PpsError or UsageError.

    `steps_limit`: the steps the program may have (default `limits.DEFAULT_MAX_STEPS`; a
    command's `--max-steps`)."""
    text = read_text(path)
    if format_of(path, fmt) == "csv":
        from .formats.torch_csv import read_csv

        program = read_csv(text, path, dialect)  # its cells are bounded by MAX_ACTIONS as it reads
        check_steps(program, path, DEFAULT_MAX_STEPS if steps_limit is None else steps_limit, "the file holds")
        check_slots(program, path)
        return program
    return parse(text, path, steps_limit)


def parse(text: str, path: str = "<input>", steps_limit: int | None = None) -> Program:
    """`.pps` text -> Program, within every bound of `limits` (the public `ppdsl.parse`).
    Raises PpsError with located diagnostics."""
    from .syntax.parser import parse as parse_pps

    program = parse_pps(text, path, steps_limit)
    check_slots(program, path)
    return program


def check_steps(program: Program, path: str, limit: int, holds: str) -> None:
    """PPS015 for a program read whole (a CSV) or about to grow (lowered) past `limit` steps."""
    limit = min(limit, MAX_ACTIONS)
    count = program.action_count
    line, column = (program.source.header.line, program.source.header.column) if program.source else (1, 1)
    if count > limit:
        raise PpsError([Diagnostic("PPS015", f"{holds} {count:,} actions, more than the limit of {limit:,}",
                                   path, line, column, help=steps_help(count))])
    too_many_ranks = ranks_past(program.ranks, limit)
    if too_many_ranks is not None:
        raise PpsError([Diagnostic("PPS015", too_many_ranks, path, line, column,
                                   help=steps_help(STEPS_PER_RANK * program.ranks))])


def check_slots(program: Program, path: str) -> None:
    """The checker and the engine keep a slot per (stage, microbatch): refuse a program that
    declares far more of them than it has actions (a complete one has at least one action per
    slot), so that 4 actions under `stages=2048 microbatches=2048` are not a gigabyte."""
    slots = program.stages * program.microbatches
    if slots <= max(MAX_SPARSE_SLOTS, 4 * program.action_count):
        return
    line, column = (program.source.header.line, program.source.header.column) if program.source else (1, 1)
    raise PpsError([Diagnostic(
        "PPS015", f"{program.stages:,} stages x {program.microbatches:,} microbatches are {slots:,} "
                  f"(stage, microbatch) pairs for {plural(program.action_count, 'action')}", path, line, column,
        help="a complete program has an action for every stage and microbatch; declare the sizes it uses")])
