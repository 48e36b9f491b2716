"""Find the shortest schedule for your costs under a memory limit, check it and write it out.

  ppdsl search --ranks 8 --microbatches 32 --max-memory 7 -o found.pps
  ppdsl search --ranks 4 --microbatches 16 --costs F_s0=1.2,F_s3=1.5,comm=0.05 --max-memory 4 -o f.pps
  ppdsl search --ranks 4 --microbatches 8 --costs profile.json --max-memory 3 --format json
  ppdsl search --ranks 2 --microbatches 8 --costs profile.json --max-memory 3GiB -o best.pps

--max-memory counts one microbatch's activations of a rank's whole share of the model (a V
stage counts 1/2), the unit of `ppdsl lint --max-memory`, `ppdsl simulate` and the header's
`memory=` (the file written carries the limit there), or bytes (3GiB, 1.5GB) with a profile
whose sizes say each stage's bytes (see `search.byte_limit`). Costs
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

from ..cost_sources import load_costs
from ..costs import DEFAULT
from ..diagnostics import UsageError
from ..limits import MAX_MICROBATCHES, MAX_RANKS, MAX_SEARCH_ACTIONS
from ..memory import UNIT, Limit, bytes_text
from ..search.byte_limit import COUNTED, SCALED_LIMIT, ByteLimit, InBytes, best_named
from ..search.driver import Found, search, shapes_of
from ..search.output import exact_note, finish, peak_text, progress_line, proof_words, to_json, to_text
from ..search.problem import cuts_of
from ..search.use import MEMORY_ACTIONS
from .common import byte_limit_needs_sizes, memory_limit, refuse_csv_output, refuse_overwriting, write_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, required=True, metavar="P", help="pipeline ranks")
    p.add_argument("--microbatches", type=int, required=True, metavar="M", help="microbatches per step")
    p.add_argument("--max-memory", type=memory_limit, required=True, metavar="L",
                   help="peak activations per rank, in microbatches of a rank's activations (its whole share of the "
                        "model); or bytes a rank (3GiB, 1.5GB) with --costs PROFILE.json that has sizes")
    p.add_argument("--costs", metavar="SPEC", action="append",
                   help="F=1,B=2,comm=0.1 (F_s0=..., per stage) or a .json profile (default: F=1, I=W=1, free "
                        "messages); again to add more, later keys winning (profiles of one number of stages)")
    p.add_argument("--stages-per-rank", choices=("1", "2", "auto"), default="auto",
                   help="1: loop, 2: V, auto: both, or with a profile the shape it measured (default)")
    p.add_argument("--memory-actions", choices=("none", "recompute", "offload", "both"), default="none",
                   help="may also return a named generator's schedule with R (recompute) or OFFLOAD and RELOAD "
                        "placed to fit the limit, when that is shorter (default: none)")
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
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise UsageError(f"--time-limit must be a positive number of seconds, not {args.time_limit:g}")


def run(args: argparse.Namespace) -> int:
    _check(args)
    refuse_csv_output(args.output, "search")
    costs = DEFAULT
    measured: set[int] = set()  # the numbers of stages the profiles measured
    for spec in args.costs or ():
        refuse_overwriting(spec, args.output)
        more = load_costs(spec, 2 * args.ranks)
        costs = more if costs is DEFAULT else costs.merged(more)
        count = more.carried_from or more.stages
        if count is not None and any("_s" in key for key, _ in more.items):
            measured.add(count)
    if len(measured) > 1:
        raise UsageError("--costs: the profiles measured " + " and ".join(map(str, sorted(measured)))
                         + " stages; profiles searched together must measure one number of stages")
    if cuts_of(costs, args.ranks) is None:  # pragma: no cover - load_costs bounds stages by 2P
        raise UsageError("--costs: a per-stage key names a stage past two a rank")
    limit: Limit = args.max_memory
    in_bytes: ByteLimit | None = None
    shapes = shapes_of(measured_shape(args.stages_per_rank, args.ranks, measured))
    actions = MEMORY_ACTIONS[args.memory_actions]
    if limit.in_bytes:
        if actions:
            raise UsageError("--memory-actions places actions under a limit in microbatches of a rank's "
                             f"activations ({UNIT}), not in bytes: give --max-memory as a number")
        if costs.sizes is None:
            raise byte_limit_needs_sizes(limit)
        in_bytes = ByteLimit(limit.amount, costs.sizes)
        fitting = tuple(v for v in shapes if in_bytes.fits(args.ranks, v))
        if not fitting:
            smallest = min(in_bytes.smallest(args.ranks, v) for v in shapes)
            return _infeasible(args, str(limit), smallest, bytes_text(smallest), "a rank, by the profile's sizes")
        shapes = fitting

    def progress(best: float, elapsed: float, count: int, total: int) -> None:
        print(progress_line(best, elapsed, count, total, args.time_limit), file=sys.stderr)

    result = search(args.ranks, args.microbatches, costs, limit.amount if in_bytes is None else SCALED_LIMIT, shapes,
                    args.time_limit, progress, in_bytes=in_bytes, memory_actions=actions)
    if not isinstance(result, Found):
        return _infeasible(args, f"{result.limit:g}", result.smallest, f"{result.smallest:g}", f"({UNIT})")
    found = finish(result, costs, in_bytes)
    note = exact_note(found)
    if note:
        print(f"ppdsl search: {note}", file=sys.stderr)
    report = None
    if in_bytes is not None:
        peak = in_bytes.peak(found.program)
        assert peak is not None  # the sizes were carried over to this shape to search it
        report = InBytes(in_bytes, peak, best_named(args.ranks, args.microbatches, costs, found.cuts, in_bytes, shapes))
    text = to_text(found, costs, report)
    if args.format == "json":
        data = to_json(found, args.output, report)
        if args.output:
            write_output(args.output, text)
        else:
            data["schedule"] = text
        print(json.dumps(data, indent=2))
        return 0
    write_output(args.output, text)
    if args.output and args.output != "-":
        named = found.named if report is None else (None if report.named is None else report.named.result)
        against = f"; best named generator {named.name}: {named.makespan:.6g}" if named is not None else ""
        memory = (f"{found.peak:.6g} (limit {found.limit:g}; {UNIT})" if report is None else
                  f"{peak_text(report.peak.peak)} (limit {limit} a rank, by the profile's sizes; the search held "
                  f"{COUNTED}: safe, never under the bytes)")
        print(f"makespan {found.makespan:.6g}, bubble {found.bubble:.1%}, peak memory {memory}{against}; "
              f"{proof_words(found)}; wrote {args.output}")
    return 0


def measured_shape(asked: str, ranks: int, measured: set[int]) -> str:
    """The stages per rank to search. "auto" with a profile is the shape it measured: costs
    carried to another shape are estimates (a stage's fixed costs and where the heavy first
    and last layers land do not follow a share of layers), and a search that trusted them
    would prefer that shape on numbers no run has shown. Said on standard error."""
    if asked != "auto" or not measured:
        return asked
    (count,) = measured
    for v in (1, 2):
        if count == v * ranks:
            other = "V (2 stages a rank)" if v == 1 else "loop (1 stage a rank)"
            print(f"ppdsl search: the profile measured {count} stages, so {other} schedules are not searched "
                  f"(their costs would be carried over, estimates); profile one of them and search that "
                  f"profile, or ask for --stages-per-rank {3 - v} to search on the estimates", file=sys.stderr)
            return str(v)
    return asked


def _infeasible(args: argparse.Namespace, limit: str, smallest: float, smallest_text: str, unit: str) -> int:
    if args.format == "json":
        print(json.dumps({"found": False, "limit": args.max_memory.amount, "smallest_feasible": smallest}))
    print(f"ppdsl search: no schedule fits --max-memory {limit}: the smallest feasible limit is {smallest_text} {unit}",
          file=sys.stderr)
    return 1
