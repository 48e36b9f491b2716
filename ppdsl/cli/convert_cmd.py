"""Convert between .pps and PyTorch's schedule CSV, formats chosen by extension.

CSV input in either dialect is detected (current: I = backward-input, B = full backward;
legacy: B followed by W = backward-input, BW = full backward); --dialect forces one.
"""

from __future__ import annotations

import argparse

from ..diagnostics import UsageError
from ..formats.torch_csv import write_csv
from ..load import format_of, load_program
from ..syntax.printer import print_program
from .common import print_diagnostics, refuse_overwriting, write_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN", help=".pps or .csv")
    p.add_argument("output", metavar="OUT", help=".pps or .csv ('-' for stdout, with --to)")
    p.add_argument("--dialect", choices=("current", "legacy"), help="dialect of a CSV input (default: detected)")
    p.add_argument("--write-dialect", choices=("current", "legacy"), default="current",
                   help="dialect of a CSV output (default: current)")
    p.add_argument("--to", choices=("pps", "csv"), help="output format when OUT has no telling extension")


def run(args: argparse.Namespace) -> int:
    target = args.to or (format_of(args.output) if args.output != "-" else None)
    if target is None:
        raise UsageError("writing to stdout needs --to pps or --to csv")
    refuse_overwriting(args.input, args.output)
    program = load_program(args.input, dialect=args.dialect)
    if target == "csv":
        text, warnings = write_csv(program, args.write_dialect)
        print_diagnostics(warnings)
    else:
        text = print_program(program, f"converted from {args.input}")
    write_output(args.output, text)
    return 0
