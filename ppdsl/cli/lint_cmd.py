"""Check schedules: structure, dependencies, communication, deadlock, memory.

Reads .pps and PyTorch .csv files. Prints every problem located as file:line:col with the
rank, the step and the actions involved. Exit 0 when no file has an error (warnings are
allowed), 1 when one has, 2 on a usage or I/O error.

  ppdsl lint schedules/*.pps
  ppdsl lint --comm-model grouped paddle_1f1b.pps     # is it safe on NCCL?
  ppdsl lint --max-memory 4 --format json my.pps
  ppdsl lint --max-memory 6GiB --costs profile.json my.pps   # bytes, sizes from ppdsl run --profile
  ppdsl lint --explain PPS210
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..check import check
from ..diagnostics import Diagnostic, PpsError, UsageError, to_json
from ..wording import plural
from ..explain import explain, unknown_code
from ..ir import Program
from ..load import load_program
from ..memory import Limit, Sizes
from ..semantics import MODELS
from .common import add_max_steps, byte_limit_needs_sizes, memory_limit, print_diagnostics, whole_number

DEFAULT_MAX_ERRORS = 50


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", metavar="FILE", nargs="*", help=".pps or .csv schedules")
    p.add_argument("--comm-model", choices=MODELS, default="rendezvous",
                   help="rendezvous: gloo, blocking sends (default); grouped: NCCL, batches posted "
                        "together; buffered: sends never block")
    p.add_argument("--max-memory", type=memory_limit, metavar="N",
                   help="limit on live activations per rank, in microbatches of a rank's activations: a stage "
                   "that is one of a rank's v stages counts 1/v (overrides the header's `memory`); or bytes "
                   "(6GiB, 1.5GB) with --costs PROFILE.json that has sizes")
    p.add_argument("--costs", action="append", default=[], metavar="SPEC",
                   help="a .json profile from `ppdsl run --profile`: its sizes turn --max-memory into bytes "
                        "(inline costs and the rest are checked too)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--max-errors", type=whole_number(0), metavar="N",
                   help=f"show at most N diagnostics per file, then a count of the rest "
                        f"(default {DEFAULT_MAX_ERRORS} for text, all for json; 0: all)")
    add_max_steps(p)
    p.add_argument("--explain", metavar="CODE", help="print what a diagnostic code (any PPSnnn, any case) means and how to fix it")


def run(args: argparse.Namespace) -> int:
    if args.explain is not None:
        doc = explain(args.explain)
        if doc is None:
            raise UsageError(unknown_code(args.explain))
        print(doc.strip())
        return 0
    if not args.files:
        raise UsageError("no files given")
    limit = args.max_errors if args.max_errors is not None else (DEFAULT_MAX_ERRORS if args.format == "text" else 0)
    shown: list[Diagnostic] = []
    errors = warnings = 0
    status = 0
    max_memory: Limit | None = args.max_memory
    for path in args.files:
        try:
            program = load_program(path, steps_limit=args.max_steps)
            found = check(program, args.comm_model, *_memory_limits(program, max_memory, args.costs))
        except PpsError as exc:
            found = list(exc.diagnostics)
        except UsageError as exc:
            print(f"ppdsl lint: error: {exc}", file=sys.stderr)
            status = 2
            continue
        n_err = sum(d.is_error for d in found)
        errors += n_err
        warnings += len(found) - n_err
        rest = 0
        if limit and len(found) > limit:
            rest = len(found) - limit
            found = found[:limit]
        if args.format == "text":
            print_diagnostics(found, sys.stdout)
            if rest:
                print(f"{path}: ... and {plural(rest, 'more diagnostic')} (see --max-errors)")
        else:
            shown.extend(found)
    if args.format == "json":
        print(to_json(shown))
    elif errors or warnings:
        print(f"{plural(errors, 'error')} and {plural(warnings, 'warning')} in {plural(len(args.files), 'file')}",
              file=sys.stderr)
    if status:
        return status
    return 1 if errors else 0


def _memory_limits(program: Program, limit: Limit | None, specs: list[str]) -> tuple[Any, ...]:
    """check()'s memory arguments: the limit in the unit, or in bytes with the sizes of the
    program's stages (a profile's, carried over to its shape)."""
    if not specs:
        if limit is not None and limit.in_bytes:
            raise byte_limit_needs_sizes(limit)
        return (None if limit is None else limit.amount,)
    from ..cost_sources import resolve

    sizes: Sizes | None = resolve(program, specs).sizes
    if limit is None or not limit.in_bytes:
        return (None if limit is None else limit.amount,)
    if sizes is None:
        raise byte_limit_needs_sizes(limit)
    return None, None, (limit.amount, sizes)
