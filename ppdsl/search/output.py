"""A found schedule as a checked program, as `.pps` text with the numbers it was found with, as JSON.

`finish` is the gate every result passes: the compute-only program is simulated under the
same costs (its makespan must be the search's), checked, lowered to sends and receives and
checked again under `rendezvous`. A found schedule that fails is a bug in the search, raised
as one; it is never written out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from attrs import evolve

from ..check import check
from ..costs import CostModel, reshape
from ..limits import DEFAULT_MAX_STEPS
from ..lower import lower
from ..simulate import simulate
from ..syntax.printer import print_program
from .byte_limit import COUNTED, ByteLimit, InBytes
from .driver import EXACT_MISSING, EXACT_TOO_LARGE, Found
from .exact import MAX_PAIRS
from ..memory import EPSILON, UNIT, bytes_text, over


def _number(x: float) -> str:
    return f"{x:.6g}"


def finish(found: Found, costs: CostModel, in_bytes: ByteLimit | None = None) -> Found:
    """The result with its program carrying the header's memory limit and the costs, verified.
    `in_bytes`: the search's limit was in bytes; the header then has no `memory=` (it counts
    the unit) and the peak bytes are checked against it instead."""
    costs = reshape(costs, found.cuts, found.program.stages)
    program = found.program.evolve(memory_limit=found.limit if in_bytes is None else None,
                                   costs=costs.effective)
    sim = simulate(program, costs)
    if not sim.completed or abs(sim.makespan - found.makespan) > 1e-6 * max(1.0, found.makespan):
        raise AssertionError(f"search priced {found.makespan} but the simulator says {sim.makespan}")
    errors = [d for d in check(program) if d.is_error]
    if not errors:
        errors = [d for d in check(lower(program), "rendezvous") if d.is_error]
    if errors:
        raise AssertionError(f"a found schedule fails the checker: {errors[0].code} {errors[0].message}")
    peak = max(sim.peak_memory)
    if in_bytes is None and over(peak, found.limit):
        raise AssertionError(f"a found schedule holds {peak} over the limit {found.limit}")
    held = None if in_bytes is None else in_bytes.peak(program)
    if in_bytes is not None and (held is None or max(held.peak) > in_bytes.limit * (1 + EPSILON)):
        raise AssertionError(f"a found schedule holds {held} bytes over the limit {in_bytes.limit}")
    return evolve(found, program=program, bubble=sim.bubble_ratio, peak=peak)


def progress_line(best: float, elapsed: float, count: int, total: int, time_limit: float | None) -> str:
    """One line of progress: the best so far, candidates priced out of the budget, the time
    used (out of `--time-limit` when given)."""
    shown = f"{best:.6g}" if math.isfinite(best) else "none yet"
    seconds = f"{elapsed:.1f} of {time_limit:g} s" if time_limit is not None else f"{elapsed:.1f} s"
    return (f"ppdsl search: best makespan {shown}; {count:,} of {total:,} candidates priced "
            f"({count / max(1, total):.0%}); {seconds}")


def compared(makespan: float, theirs: float) -> str:
    """How much shorter than `theirs`, in words: never "0.0% shorter"."""
    gain = 1 - makespan / theirs if theirs > 0 else 0.0
    return "as short as it" if gain < 5e-4 else f"{gain:.1%} shorter"


def proof_words(found: Found) -> str:
    """Whether the result is proven optimal, with the lower bound it was measured against."""
    if found.optimal:
        return f"proven optimal (meets the lower bound {_number(found.lower_bound)})"
    return f"not proven optimal (lower bound {_number(found.lower_bound)})"


def exact_note(found: Found) -> str:
    """When the exact MILP (`pip install 'ppdsl[search]'`) would prove more than was proven, say
    so; empty when the result is proven optimal, the MILP ran, or it was turned off."""
    if found.optimal:
        return ""
    if found.exact == EXACT_MISSING:
        return ("the exact MILP would try to prove this case optimal (it is small enough): "
                "pip install 'ppdsl[search]' (scipy)")
    if found.exact == EXACT_TOO_LARGE:
        return (f"the exact MILP (ppdsl[search]) takes cases of at most {MAX_PAIRS:,} ordering binaries, "
                f"this one has {found.pairs:,}: the result is the heuristic's, measured against the lower bound")
    return ""


def peak_text(peak: Sequence[float]) -> str:
    """`2.1 MiB on rank 1`: the highest rank's peak bytes."""
    top = max(range(len(peak)), key=peak.__getitem__)
    return f"{bytes_text(peak[top])} on rank {top}"


def named_line(found: Found, in_bytes: InBytes | None) -> str:
    """The best named generator within the limit, against the found schedule."""
    if in_bytes is None:
        n, peak = found.named, None if found.named is None else _number(found.named.peak)
    else:
        n = None if in_bytes.named is None else in_bytes.named.result
        peak = None if in_bytes.named is None else bytes_text(in_bytes.named.peak)
    if n is None:
        return "no named generator fits this limit"
    return (f"best named generator within the limit: {n.name}, makespan {_number(n.makespan)} "
            f"(peak {peak}); this one is {compared(found.makespan, n.makespan)}")


def header_comment(found: Found, costs: CostModel, in_bytes: InBytes | None = None) -> str:
    shape = "loop, 1 stage per rank" if found.stages_per_rank == 1 else "V, 2 stages per rank"
    given = " ".join(f"{k}={_number(v)}" for k, v in costs.effective) or "defaults (F=1, I=W=1, free messages)"
    if in_bytes is None:
        memory = [f"makespan {_number(found.makespan)}, bubble {found.bubble:.1%}, peak memory {_number(found.peak)} "
                  f"(limit {_number(found.limit)}; {UNIT}, as the header's memory=)"]
    else:
        memory = [f"makespan {_number(found.makespan)}, bubble {found.bubble:.1%}, peak memory "
                  f"{peak_text(in_bytes.peak.peak)} (limit {bytes_text(in_bytes.limit.limit)} a rank: weights, "
                  "gradients, optimizer state and activations, by the profile's sizes)",
                  f"memory as the search counted it: {COUNTED} (never under the bytes); "
                  f"peak {_number(found.peak)} {UNIT}"]
    lines = [
        f"found by `ppdsl search` ({found.candidates} candidates priced)" + (f": {found.start}" if found.moved else ""),
        *memory,
        f"costs: {given}" + (f" (unit: {costs.unit})" if costs.unit != "unit" else "") + f"; shape: {shape}",
        named_line(found, in_bytes),
    ]
    lines.append(f"method: {found.method}; {proof_words(found)}" + ("; stopped at the time limit" if found.stopped_early else ""))
    return "\n".join(lines)


def to_text(found: Found, costs: CostModel, in_bytes: InBytes | None = None) -> str:
    # Ranges where every command reads them by default (limits.DEFAULT_MAX_STEPS); past that,
    # one token a step.
    compact = found.program.action_count <= DEFAULT_MAX_STEPS
    return print_program(found.program, header_comment(found, costs, in_bytes), compact=compact)


def to_json(found: Found, output: str | None, in_bytes: InBytes | None = None) -> dict[str, object]:
    n = found.named
    if in_bytes is not None:
        named = in_bytes.named
        return {**_json(found, output), "limit": in_bytes.limit.limit, "limit_unit": "bytes",
                "peak_bytes": list(in_bytes.peak.peak), "state_bytes": list(in_bytes.peak.state),
                "activation_bytes": list(in_bytes.peak.activations), "memory_counted": COUNTED,
                "named": None if named is None else {"name": named.result.name, "makespan": named.result.makespan,
                                                     "peak_bytes": named.peak}}
    return {**_json(found, output), "named": None if n is None else {"name": n.name, "makespan": n.makespan,
                                                                     "peak_memory": n.peak}}


def _json(found: Found, output: str | None) -> dict[str, object]:
    return {
        "found": True,
        "makespan": found.makespan,
        "bubble_ratio": found.bubble,
        "peak_memory": found.peak,
        "limit": found.limit,
        "memory_unit": UNIT,
        "stages_per_rank": found.stages_per_rank,
        "method": found.method,
        "optimal": found.optimal,
        "lower_bound": found.lower_bound,
        "seconds": found.seconds,
        "candidates": found.candidates,
        "stopped_early": found.stopped_early,
        "start": found.start,
        "memory_actions": found.moved or None,
        "planned_candidates": found.planned,
        "exact": found.exact,
        "output": output,
    }
