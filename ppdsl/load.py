"""Reading schedule files of any supported format into a Program."""

from __future__ import annotations

from pathlib import Path

from .diagnostics import Diagnostic, PpsError
from .wording import plural
from .files import read_text
from .ir import Program
from .limits import DEFAULT_MAX_STEPS, MAX_SPARSE_SLOTS, STEPS_PER_RANK, file_limit, ranks_past, steps_help

FORMATS = (".pps", ".csv")


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
        check_steps(program, path, DEFAULT_MAX_STEPS if steps_limit is None else steps_limit, "the file holds",
                    len(text))
        check_slots(program, path)
        return program
    return parse(text, path, steps_limit)


def parse(text: str, path: str = "<input>", steps_limit: int | None = None) -> Program:
    """`.pps` text -> Program, within every bound of `limits` (the public `ppdsl.parse`).
    Raises PpsError with located diagnostics."""
    from .expansion import parse as parse_pps

    if not isinstance(text, str):
        hint = ": decode it first (text.decode('utf-8'))" if isinstance(text, (bytes, bytearray)) else ""
        raise TypeError(f"parse() takes a schedule's text as str, not {type(text).__name__}{hint}; "
                        "ppdsl.load_program(path) reads a file")

    program = parse_pps(text, path, steps_limit)
    check_slots(program, path)
    return program


def check_steps(program: Program, path: str, limit: int, holds: str, size: int = 0) -> None:
    """PPS015 for a program read whole (a CSV of `size` characters) or about to grow (lowered)
    past `limit` steps beyond what `size` characters can write out (`limits.file_limit`)."""
    limit, words = file_limit(limit, size)
    count = program.action_count
    line, column = (program.source.header.line, program.source.header.column) if program.source else (1, 1)
    if count > limit:
        raise PpsError([Diagnostic("PPS015", f"{holds} {count:,} actions, more than {words}",
                                   path, line, column, help=steps_help(count))])
    too_many_ranks = ranks_past(program.ranks, limit, words)
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
