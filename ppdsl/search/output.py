"""A found schedule as a checked program, as `.pps` text with the numbers it was found with, as JSON.

`finish` is the gate every result passes: the compute-only program is simulated under the
same costs (its makespan must be the search's), checked, lowered to sends and receives and
checked again under `rendezvous`. A found schedule that fails is a bug in the search, raised
as one; it is never written out.
"""

from __future__ import annotations

import math

from attrs import evolve

from ..check import check
from ..costs import CostModel, reshape
from ..limits import DEFAULT_MAX_STEPS
from ..lower import lower
from ..simulate import simulate
from ..syntax.printer import print_program
from .driver import EXACT_MISSING, EXACT_TOO_LARGE, Found
from .exact import MAX_PAIRS
from ..memory import UNIT, over


def _number(x: float) -> str:
    return f"{x:.6g}"


def finish(found: Found, costs: CostModel) -> Found:
    """The result with its program carrying the header's memory limit and the costs, verified."""
    costs = reshape(costs, found.cuts, found.program.stages)
    program = found.program.evolve(memory_limit=found.limit,
                                   costs=tuple(costs.items))
    sim = simulate(program, costs)
    if not sim.completed or abs(sim.makespan - found.makespan) > 1e-6 * max(1.0, found.makespan):
        raise AssertionError(f"search priced {found.makespan} but the simulator says {sim.makespan}")
    errors = [d for d in check(program) if d.is_error]
    if not errors:
        errors = [d for d in check(lower(program), "rendezvous") if d.is_error]
    if errors:
        raise AssertionError(f"a found schedule fails the checker: {errors[0].code} {errors[0].message}")
    peak = max(sim.peak_memory)
    if over(peak, found.limit):
        raise AssertionError(f"a found schedule holds {peak} over the limit {found.limit}")
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


def header_comment(found: Found, costs: CostModel) -> str:
    shape = "loop, 1 stage per rank" if found.stages_per_rank == 1 else "V, 2 stages per rank"
    given = " ".join(f"{k}={_number(v)}" for k, v in costs.items) or "defaults (F=1, I=W=1, free messages)"
    lines = [
        f"found by `ppdsl search` ({found.candidates} candidates priced)",
        f"makespan {_number(found.makespan)}, bubble {found.bubble:.1%}, peak memory {_number(found.peak)} "
        f"(limit {_number(found.limit)}; {UNIT}, as the header's memory=)",
        f"costs: {given}" + (f" (unit: {costs.unit})" if costs.unit != "unit" else "") + f"; shape: {shape}",
    ]
    if found.named is not None:
        n = found.named
        lines.append(f"best named generator within the limit: {n.name}, makespan {_number(n.makespan)} "
                     f"(peak {_number(n.peak)}); this one is {compared(found.makespan, n.makespan)}")
    else:
        lines.append("no named generator fits this limit")
    lines.append(f"method: {found.method}; {proof_words(found)}" + ("; stopped at the time limit" if found.stopped_early else ""))
    return "\n".join(lines)


def to_text(found: Found, costs: CostModel) -> str:
    # Ranges where every command reads them by default (limits.DEFAULT_MAX_STEPS); past that,
    # one token a step.
    compact = found.program.action_count <= DEFAULT_MAX_STEPS
    return print_program(found.program, header_comment(found, costs), compact=compact)


def to_json(found: Found, output: str | None) -> dict[str, object]:
    n = found.named
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
        "planned_candidates": found.planned,
        "exact": found.exact,
        "named": None if n is None else {"name": n.name, "makespan": n.makespan, "peak_memory": n.peak},
        "output": output,
    }
