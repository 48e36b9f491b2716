"""Simulate schedules under a cost model: step time, bubble, memory, critical path.

Costs come from the file's `costs` line, then each --costs in order (inline `F=1,B=2,comm=0.1`
or a JSON profile file). Several files are compared side by side. Exit 1 when a schedule
cannot run to the end under the communication model (the wait-for cycle is printed).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence

from ..cost_sources import resolve
from ..costs import CostError, NotCosted
from ..diagnostics import Diagnostic, PpsError, UsageError
from ..wording import plural
from ..ir import Program
from ..limits import DEFAULT_MAX_LOWERED_STEPS
from ..load import check_steps, load_program
from ..lower import needs_lowering
from ..memory import BYTE_UNITS, UNIT, bytes_text, bytes_unit
from ..semantics import CommModel
from ..simulate import (Simulation, applying_to, simulate, stuck_diagnostic, stuck_summary, wait_text,
                        waiting_forever)
from .common import SHOWN_DIAGNOSTICS, add_max_steps, print_diagnostics, refuse_overwriting, write_output

MODELS = tuple(m.value for m in CommModel)
# How many ranks' waits the report of a stuck schedule lists (JSON has them all).
SHOWN_WAITS = 16


def add_common(p: argparse.ArgumentParser) -> None:
    """Options `simulate` and `show` share."""
    p.add_argument("--costs", action="append", default=[], metavar="SPEC",
                   help="F=1,B=2,I=1,W=1,comm=0.1 (also F_s3=, R=, OFFLOAD=, RELOAD=, offload_bw=, bytes=, bandwidth=, overlap=) or a .json profile; "
                        "repeatable, later wins")
    p.add_argument("--comm-model", choices=MODELS, default="rendezvous",
                   help="how sends and receives wait (default: rendezvous)")
    p.add_argument("--dialect", choices=("current", "legacy"), help="CSV dialect (default: detected)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help=".pps or .csv schedules (two or more: compared)")
    add_common(p)
    add_max_steps(p, lowered="with a profile's measured messages")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.add_argument("--critical-path", action="store_true", help="list every step of the critical path")
    p.add_argument("-o", "--output", metavar="OUT", help="write the report here instead of stdout")


def load_and_simulate(path: str, args: argparse.Namespace,
                      refuse: Callable[[Program], None] | None = None) -> Simulation:
    """Load one file and simulate it with the command line's costs and model."""
    return simulate_file(path, args.costs, args.comm_model, args.dialect, refuse, args.max_steps)


def simulate_file(path: str, costs_specs: list[str], comm_model: str, dialect: str | None = None,
                  refuse: Callable[[Program], None] | None = None, steps_limit: int | None = None,
                  shape: Callable[[Program], Program] | None = None) -> Simulation:
    """The one simulation of a file `ppdsl simulate` prints (and `ppdsl run --profile` quotes).

    With measured message times (a runtime profile), a compute-only program is lowered first,
    as `ppdsl run` runs it: sends and receives then take time on both ranks, as measured.
    `refuse` sees the program before anything is simulated (and raises to stop there);
    `shape` makes the program simulated from the file's (the run's sharding actions)."""
    program: Program = load_program(path, dialect=dialect, steps_limit=steps_limit)
    if shape is not None:
        program = shape(program)
    if refuse is not None:
        refuse(program)
    costs = resolve(program, costs_specs)
    lowered = costs.measured_comm and needs_lowering(program)
    if lowered and steps_limit is None:
        check_steps(program, path, DEFAULT_MAX_LOWERED_STEPS, "lowered first (the profile measured messages), it holds")
    if lowered:
        from ..check import lower_checked

        program = lower_checked(program, fuse=False, comm_model=comm_model)
    try:
        sim = simulate(program, costs, comm_model)
        sim.lowered = lowered
        return sim
    except CostError as exc:  # pragma: no cover - resolve() has checked stages already
        raise UsageError(exc.message) from None


def diagnostics_for(sim: Simulation) -> list[Diagnostic]:
    """The checker's errors for the simulated program, or the simulator's own when it gets stuck
    and the checker has nothing to say. Warnings are `ppdsl lint`'s business."""
    from ..check import check

    found = [d for d in check(sim.program, sim.comm_model) if d.is_error]
    if not found and not sim.completed:
        found = [stuck_diagnostic(sim)]
    return found


def run(args: argparse.Namespace) -> int:
    for source in [*args.files, *args.costs]:  # a cost spec that is no file is no file on disk either
        refuse_overwriting(source, args.output)
    sims: list[tuple[str, Simulation]] = []
    uncosted: list[tuple[str, str]] = []
    problems: list[Diagnostic] = []
    status = 0
    for path in args.files:
        try:
            sim = load_and_simulate(path, args)
        except NotCosted as exc:
            print_diagnostics(exc.diagnostics)
            uncosted.append((path, exc.reason))
            status = 1
            continue
        except PpsError as exc:
            print_diagnostics(exc.diagnostics)
            status = 1
            continue
        found = diagnostics_for(sim)
        if found:
            problems.extend(found)
            status = 1
        sims.append((path, sim))
    print_diagnostics(problems, limit=SHOWN_DIAGNOSTICS)
    if not sims and (not uncosted or len(args.files) == 1 or args.format == "json"):
        return status
    if args.format == "json":
        data: object = [s.as_json(p) for p, s in sims] + [{"file": p, "costed": False, "reason": r} for p, r in uncosted]
        if len(args.files) == 1:
            data = sims[0][1].as_json(sims[0][0])
        write_output(args.output, json.dumps(data, indent=2) + "\n")
    elif len(args.files) == 1:
        note = "the schedule has errors (above): the figures describe it as written" if problems else ""
        write_output(args.output, report(*sims[0], full_path=args.critical_path, status_note=note))
    else:
        write_output(args.output, compare(sims, uncosted))
    return status


# --- text reports ---------------------------------------------------------------------------

def num(x: float) -> str:
    """Short and exact enough: 22, 6752.8, 0.125, and 1023170 (a measured step in us), not 1.02317e+06."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    if 1e6 <= abs(x) < 1e15:
        return f"{x:.0f}"
    return f"{x:.6g}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def copy_note(program: Program, lane: bool) -> str:
    """What the copy column counts: the moves of activations and the sharding collectives the
    program has, on a lane beside the computes or (copy_lane=0) between them."""
    present = {a.kind.name for _, _, a in program.actions()}
    what = []
    if present & {"OFFLOAD", "RELOAD"}:
        what.append("moves activations (OFFLOAD, RELOAD)")
    collectives = [k for k in ("UNSHARD", "REDUCE_GRAD") if k in present]
    if collectives:
        what.append(f"runs the sharding collectives ({', '.join(collectives)})")
    done = " and ".join(what)
    if lane:
        return f"copy: the time each rank's copy lane {done}, beside its computes"
    return f"copy: the time each rank {done} itself, between its computes (copy_lane=0)"


def _table(rows: list[list[str]], right: int = 1) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.ljust(w) if i < right else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def _costs_line(sim: Simulation) -> str:
    d = sim.costs.describe(sim.program.stages, *applying_to(sim.program))
    unit = "" if sim.costs.unit == "unit" else f" ({sim.costs.unit})"
    return "costs: " + " ".join(f"{k}={num(v)}" for k, v in d.items()) + unit


def _path_summary(sim: Simulation, full: bool) -> list[str]:
    path = sim.critical_path
    if not path:
        return ["critical path: (empty)"]
    gaps, prev = 0.0, 0.0
    for p in path:  # a blocked send or receive overlaps its peer's side: count time once
        gaps += max(0.0, p.start - prev)
        prev = max(prev, p.end)
    head = (f"critical path: {plural(len(path), 'step')}; {num(prev - gaps)} of {num(sim.makespan)} inside them, "
            f"{num(gaps)} in hand-offs between ranks")
    texts = [f"{p.text}@r{p.rank}" for p in path]
    if full or len(texts) <= 12:
        return [head, "  " + " -> ".join(texts)]
    return [head, "  " + " -> ".join(texts[:6]) + f" -> ... ({len(texts) - 12} more) -> " + " -> ".join(texts[-6:]),
            "  (--critical-path lists every step)"]


# Every peak printed, in the checker's unit (`ppdsl.memory`), said once per report.
MEMORY_NOTE = f"peak memory: {UNIT} (a stage that is one of a rank's v stages counts 1/v)"


def report(path: str, sim: Simulation, full_path: bool = False, status_note: str = "") -> str:
    p = sim.program
    lines = [f"{path}: {plural(p.ranks, 'rank')}, {plural(p.stages, 'stage')}, {plural(p.microbatches, 'microbatch')}, "
             f"{plural(p.action_count, 'action', str(p.action_count))}, comm model {sim.comm_model}", _costs_line(sim)]
    if sim.lowered:
        lines.append("lowered to explicit send/recv as `ppdsl run` runs it (the profile measured them)")
    if sim.costs.carried_from is not None:
        lines.append(carried_note(sim))
    if not sim.completed:
        # No makespan or bubble: figures of the part that ran would read as the schedule's.
        waits = sim.waits
        lines.append(f"STUCK: the schedule cannot finish under {sim.comm_model}; {waiting_forever(len(waits))}:")
        lines.extend(f"  {wait_text(w)}" for w in waits[:SHOWN_WAITS])
        if len(waits) > SHOWN_WAITS:
            lines.append(f"  ... and {len(waits) - SHOWN_WAITS:,} more (`--format json` lists every wait)")
        return "\n".join(lines) + "\n"
    if status_note:
        lines.append(status_note)
    lines.append(f"makespan: {num(sim.makespan)}")
    lines.append(f"bubble:   {pct(sim.bubble_ratio)} of all ranks' time is not compute")
    if sim.handoff_time:
        lines.append(f"hand-offs: {plural(sim.handoffs, 'message')} between ranks with no send/recv in the file, "
                     f"{num(sim.handoff_time)} in flight in all (in no rank's comm)")
    in_bytes = sim.peak_bytes
    unit = bytes_unit(in_bytes.peak) if in_bytes is not None else ""
    copies = any(sim.copy)
    rows = [["rank", "busy", "comm", "idle"] + ["copy"] * copies + ["peak memory"]
            + ([f"peak {unit}"] if in_bytes is not None else [])]
    for r in range(p.ranks):
        rows.append([str(r), num(sim.busy[r]), num(sim.comm[r]), num(sim.idle[r])] + [num(sim.copy[r])] * copies
                    + [num(sim.peak_memory[r])] + ([in_unit(in_bytes.peak[r], unit)] if in_bytes is not None else []))
    lines.extend(_table(rows))
    if copies:
        lines.append(copy_note(p, sim.costs.copy_lane))
    lines.append(MEMORY_NOTE)
    if in_bytes is not None:
        lines.append(bytes_note(unit))
    lines.extend(reload_lines(sim))
    lines.extend(_path_summary(sim, full_path))
    return "\n".join(lines) + "\n"


# How many late reloads the text report names before a count of the rest (JSON has them all).
SHOWN_RELOAD_WAITS = 4


def reload_lines(sim: Simulation) -> list[str]:
    """What the late reloads cost: each backward that waited for its activations to come back."""
    waits = sim.reload_waits
    if not waits:
        return []
    total = sum(w.waited for w in waits)
    named = "; ".join(f"{w.action}@r{w.rank} waited {num(w.waited)} for {w.reload}" for w in waits[:SHOWN_RELOAD_WAITS])
    more = f"; and {len(waits) - SHOWN_RELOAD_WAITS} more" if len(waits) > SHOWN_RELOAD_WAITS else ""
    return [f"reloads late: {plural(len(waits), 'backward')} waited {num(total)} in all for a reload: {named}{more}",
            "  (a reload placed earlier in its row, or a faster copy, hides it)"]


def in_unit(n: float, unit: str) -> str:
    return f"{n / BYTE_UNITS[unit]:.3g}" if unit != "B" else f"{n:.0f}"


def bytes_note(unit: str) -> str:
    return (f"peak {unit}: weights, gradients and optimizer state and the peak of live activations, in {unit}, "
            "from the profile's sizes")


def carried_note(sim: Simulation) -> str:
    costs = sim.costs
    what = "costs and sizes" if costs.sizes is not None else "costs"
    return (f"{what} carried over from the profile's {plural(costs.carried_from or 0, 'stage')} to "
            f"{plural(sim.program.stages, 'stage')}, by share of layers")


def compare(sims: list[tuple[str, Simulation]], uncosted: Sequence[tuple[str, str]] = ()) -> str:
    """Several schedules side by side, one column each; `uncosted`: (file, why) of those the
    costs do not apply to, with a column of `-`."""
    header = ["", *[path for path, _ in sims], *[path for path, _ in uncosted]]
    rows: list[list[str]] = [header]

    def line(name: str, values: list[str]) -> None:
        rows.append([name, *values, *["-"] * len(uncosted)])

    line("ranks x stages x mbs", [f"{s.program.ranks}x{s.program.stages}x{s.program.microbatches}" for _, s in sims])
    line("completed", ["yes" if s.completed else "NO (stuck)" for _, s in sims])

    def figure(show: Callable[[Simulation], str]) -> list[str]:
        return [show(s) if s.completed else "-" for _, s in sims]  # a stuck run's part is no result

    line("makespan", figure(lambda s: num(s.makespan)))
    best = min(s.makespan for _, s in sims if s.completed) if any(s.completed for _, s in sims) else None
    if best:
        line("vs fastest", figure(lambda s: f"{s.makespan / best:.3f}x"))
    line("bubble", figure(lambda s: pct(s.bubble_ratio)))
    line("peak memory (max)", figure(lambda s: num(max(s.peak_memory, default=0.0))))
    line("peak memory (sum)", figure(lambda s: num(sum(s.peak_memory))))
    if any(s.peak_bytes is not None for _, s in sims):
        line("peak bytes (max)", figure(lambda s: bytes_text(max(s.peak_bytes.peak)) if s.peak_bytes else "-"))
    line("comm time (sum)", figure(lambda s: num(sum(s.comm) + s.handoff_time)))
    line("critical path steps", figure(lambda s: str(len(s.critical_path))))
    ranks = max((s.program.ranks for _, s in sims), default=0)
    for r in range(ranks):
        line(f"rank {r} busy / peak", [f"{num(s.busy[r])} / {num(s.peak_memory[r])}" if r < s.ranks and s.completed
                                       else "-" for _, s in sims])
    costs = {_costs_line(s) for _, s in sims}
    foot = list(costs) if len(costs) == 1 else [f"{path}: {_costs_line(s)}" for path, s in sims]
    foot.append(MEMORY_NOTE)
    if any(s.peak_bytes is not None for _, s in sims):
        foot.append("peak bytes: a rank's weights, gradients and optimizer state and the peak of its live activations, "
                    "from the profile's sizes")
    foot.extend(f"{path}: {carried_note(s)}" for path, s in sims if s.costs.carried_from is not None)
    foot.extend(f"{path}: not costed: {why}" for path, why in uncosted)
    if any(s.handoff_time for _, s in sims):
        foot.append("comm time: sends and receives, and a compute-only file's hand-offs between ranks in flight")
    foot.extend(f"{path}: {stuck_summary(s)}" for path, s in sims if not s.completed)
    return "\n".join(_table(rows) + foot) + "\n"
