"""Print the fully explicit program: generators, ranges and zips expanded.

Reads .pps and PyTorch .csv. The output is itself a valid .pps file.
"""

from __future__ import annotations

import argparse

from ..load import load_program
from ..syntax.printer import print_program
from .common import write_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a .pps or .csv schedule")
    p.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    p.add_argument("--dialect", choices=("current", "legacy"), help="CSV dialect (default: detected)")


def run(args: argparse.Namespace) -> int:
    program = load_program(args.file, dialect=args.dialect)
    note = None
    if program.generated is not None:
        call = ", ".join(f"{k}={v}" for k, v in program.generated.arguments)
        note = f"expanded from `use {program.generated.name}({call})` in {args.file}"
    write_output(args.output, print_program(program, note))
    return 0
