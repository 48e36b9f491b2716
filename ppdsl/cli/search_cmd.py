"""Find the shortest schedule for your costs under a memory limit, check it and write it out.

  ppdsl search --ranks 8 --microbatches 32 --max-memory 7 -o found.pps
  ppdsl search --ranks 4 --microbatches 16 --costs F_s0=1.2,F_s3=1.5,comm=0.05 --max-memory 4 -o f.pps
  ppdsl search --ranks 4 --microbatches 8 --costs profile.json --max-memory 3 --format json

--max-memory counts one microbatch's activations of a rank's whole share of the model (a V
stage counts 1/2), the unit of `ppdsl lint --max-memory`, `ppdsl simulate` and the header's
`memory=` (the file written carries the limit there). Costs
as for `ppdsl simulate` (inline or a profile from `ppdsl run --profile`); per-stage keys
name one stage a rank (or two, from a V run) and are carried over to the other shape.
Exit 0 found, 1 infeasible (the smallest feasible limit is printed), 2 usage. Progress goes
to stderr once a second; --time-limit returns the best schedule found by then.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from ..costs import DEFAULT, load_costs
from ..diagnostics import UsageError
from ..limits import MAX_MICROBATCHES, MAX_RANKS, MAX_SEARCH_ACTIONS
from ..memory import UNIT
from ..search.driver import Found, search
from ..search.output import exact_note, finish, progress_line, proof_words, to_json, to_text
from ..search.problem import cuts_of
from .common import refuse_overwriting, write_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, required=True, metavar="P", help="pipeline ranks")
    p.add_argument("--microbatches", type=int, required=True, metavar="M", help="microbatches per step")
    p.add_argument("--max-memory", type=float, required=True, metavar="L",
                   help="peak activations per rank, in microbatches of a rank's activations (its whole share of the model)")
    p.add_argument("--costs", metavar="SPEC", help="F=1,B=2,comm=0.1 (F_s0=..., per stage) or a .json profile "
                   "(default: F=1, I=W=1, free messages)")
    p.add_argument("--stages-per-rank", choices=("1", "2", "auto"), default="auto",
                   help="1: loop, 2: V, auto: both (default)")
    p.add_argument("--time-limit", type=float, metavar="S", help="stop after S seconds with the best found so far")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("-o", "--output", metavar="OUT.pps", help="write the schedule here (default: stdout)")


def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.ranks <= MAX_RANKS:
        raise UsageError(f"--ranks must be 1..{MAX_RANKS}, not {args.ranks}")
    if not 1 <= args.microbatches <= MAX_MICROBATCHES:
        raise UsageError(f"--microbatches must be 1..{MAX_MICROBATCHES}, not {args.microbatches}")
    actions = 2 * args.ranks * args.microbatches * 3
    if actions > MAX_SEARCH_ACTIONS:
        raise UsageError(f"{args.ranks} ranks x {args.microbatches} microbatches is {actions:,} actions to order, "
                         f"more than the search handles ({MAX_SEARCH_ACTIONS:,}); write it with a generator")
    if not math.isfinite(args.max_memory) or args.max_memory <= 0:
        raise UsageError(f"--max-memory must be a positive number, not {args.max_memory:g}")
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise UsageError(f"--time-limit must be a positive number of seconds, not {args.time_limit:g}")


def run(args: argparse.Namespace) -> int:
    _check(args)
    costs = DEFAULT
    if args.costs:
        refuse_overwriting(args.costs, args.output)
        costs = load_costs(args.costs, 2 * args.ranks)
        if cuts_of(costs, args.ranks) is None:  # pragma: no cover - load_costs bounds stages by 2P
            raise UsageError("--costs: a per-stage key names a stage past two a rank")

    def progress(best: float, elapsed: float, count: int, total: int) -> None:
        print(progress_line(best, elapsed, count, total, args.time_limit), file=sys.stderr)

    result = search(args.ranks, args.microbatches, costs, args.max_memory, args.stages_per_rank,
                    args.time_limit, progress)
    if not isinstance(result, Found):
        if args.format == "json":
            print(json.dumps({"found": False, "limit": result.limit, "smallest_feasible": result.smallest}))
        print(f"ppdsl search: no schedule fits --max-memory {result.limit:g}: the smallest feasible limit is "
              f"{result.smallest:g} ({UNIT})", file=sys.stderr)
        return 1
    found = finish(result, costs)
    note = exact_note(found)
    if note:
        print(f"ppdsl search: {note}", file=sys.stderr)
    text = to_text(found, costs)
    if args.format == "json":
        data = to_json(found, args.output)
        if args.output:
            write_output(args.output, text)
        else:
            data["schedule"] = text
        print(json.dumps(data, indent=2))
        return 0
    write_output(args.output, text)
    if args.output and args.output != "-":
        named = found.named
        against = f"; best named generator {named.name}: {named.makespan:.6g}" if named is not None else ""
        print(f"makespan {found.makespan:.6g}, bubble {found.bubble:.1%}, peak memory {found.peak:.6g} "
              f"(limit {found.limit:g}; {UNIT}){against}; {proof_words(found)}; wrote {args.output}")
    return 0
