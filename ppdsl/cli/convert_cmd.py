"""Convert between .pps and PyTorch's schedule CSV, formats chosen by extension.

CSV input in either dialect is detected (current: I = backward-input, B = full backward;
legacy: B followed by W = backward-input, BW = full backward); --dialect forces one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..diagnostics import Diagnostic, PpsError, Severity, UsageError
from ..wording import plural
from ..formats.torch_csv import write_csv
from ..ir import Program
from ..load import format_of, load_program
from ..syntax.printer import print_program
from .common import add_max_steps, fold_alike, print_diagnostics, refuse_overwriting, write_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN", help=".pps or .csv")
    p.add_argument("output", metavar="OUT", help=".pps or .csv ('-' for stdout, with --to)")
    p.add_argument("--dialect", choices=("current", "legacy"),
                   help="dialect of a CSV input (default: detected); with IN '-', says standard input is a CSV")
    add_max_steps(p)
    p.add_argument("--write-dialect", choices=("current", "legacy"), default="current",
                   help="dialect of a CSV output (default: current)")
    p.add_argument("--to", choices=("pps", "csv"), help="output format when OUT has no telling extension")


def run(args: argparse.Namespace) -> int:
    target = args.to or (format_of(args.output) if args.output != "-" else None)
    if target is None:
        raise UsageError("writing to stdout needs --to pps or --to csv")
    told = Path(args.output).suffix.lower().lstrip(".") if args.output != "-" else ""
    if args.to and told in ("pps", "csv") and told != args.to:
        raise UsageError(f"--to {args.to} but {args.output} names a .{told} file: drop --to, or name the "
                         f"output .{args.to}")
    refuse_overwriting(args.input, args.output)
    # Standard input has no extension: a CSV dialect given for it says it is a CSV.
    source = "csv" if args.input == "-" and args.dialect else None
    if args.dialect and format_of(args.input, source) != "csv":
        raise UsageError(f"--dialect is the dialect of a CSV input, and {args.input} is a .pps file")
    if args.write_dialect != "current" and target != "csv":
        raise UsageError("--write-dialect is the dialect of a CSV output; this one writes a .pps file")
    program = load_program(args.input, source, dialect=args.dialect, steps_limit=args.max_steps)
    if target == "csv":
        text, warnings = write_csv(program, args.write_dialect)
    else:
        text, warnings = print_program(program, f"converted from {args.input}"), []
    warnings += read_back(program, text, target, args.input, bool(warnings))
    print_diagnostics(fold_alike(warnings))
    write_output(args.output, text)
    return 0


# Header facts a PyTorch CSV has no place for: said once, as warnings, when they are lost.
_CSV_CANNOT_HOLD = (("mode", "the mode (`mode=inference`)"), ("memory_limit", "the memory limit (`memory=`)"),
                    ("costs", "the `costs` line"))


def read_back(program: Program, text: str, target: str, source: str, warned: bool) -> list[Diagnostic]:
    """Read what convert is about to write: a loss the format forces is a PPS031 warning; an
    output that would not read back, or would read back to other steps, is refused (PPS031
    error, nothing written) so that `convert` of its output always works."""
    from ..formats.torch_csv import read_csv
    from ..expansion import parse

    def refuse(why: str) -> PpsError:
        return PpsError([Diagnostic("PPS031", f"not written: the {target.upper()} would {why}", source,
                                    help="fix the problems `ppdsl lint` reports in the input, then convert it")])

    try:
        # Read as `convert` reads it next time, the dialect detected: a CSV that only reads
        # back with --dialect is one a user cannot convert back.
        back = read_csv(text, source) if target == "csv" else parse(text, source)
    except PpsError as exc:
        first = exc.diagnostics[0].message if exc.diagnostics else "?"
        raise refuse(f"not read back ({first})") from None
    if (back.ranks, back.stages, back.placement) != (program.ranks, program.stages, program.placement):
        raise refuse(f"read back as {plural(back.ranks, 'rank')} and {plural(back.stages, 'stage')} placed {list(back.placement)[:8]}, "
                     f"not {program.ranks} and {program.stages} placed {list(program.placement)[:8]}")
    if back.rows != program.rows and not warned:  # (a warned loss: batches split, legacy W)
        raise refuse("read back to other steps")
    where = program.source
    lost = []
    for field, what in _CSV_CANNOT_HOLD:
        if getattr(back, field) != getattr(program, field):
            # At the line that says it: the `costs` line, or the header for the others.
            at = None if where is None else where.costs_line if field == "costs" and where.costs_line else where.header
            lost.append(Diagnostic("PPS031", f"PyTorch's CSV has no place for {what}: it is not written", source,
                                   at.line if at else 1, at.column if at else 1, severity=Severity.WARNING))
    if back.microbatches != program.microbatches:
        lost.append(Diagnostic("PPS031", f"the header says microbatches={program.microbatches} but the rows use "
                               f"{back.microbatches}: a CSV has no header, so it reads back with {back.microbatches}",
                               source, severity=Severity.WARNING))
    return lost

