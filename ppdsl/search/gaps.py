"""Fill idle gaps: pull a later action of the same rank forward into a gap it can start in.

Where an action of a rank starts later than the one before it ends, the rank idles. Any later
action of that rank whose inputs are in before the gap closes could run there instead: it is
moved to the gap's position when that keeps each stage's forwards, input gradients and weight
gradients in microbatch order, keeps the rank's peak within the limit, and makes the schedule
no longer (`replay` prices it). Unlike `local`'s random nearby moves, a move here may jump far
(a weight gradient held back since the warm-up, a forward of the other chunk), which is what
a schedule built from a repeating pattern needs at its two ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..memory import EPSILON
from .problem import Problem
from .replay import action_ends, peaks
from .slots import SLOTS

WINDOW = 40  # how far past a gap a candidate is looked for, in actions of the rank
SWEEPS = 3  # passes over every rank while some pass moves something


def fill_gaps(problem: Problem, rows: Sequence[Sequence[int]], budget: int,
              stop: Callable[[], bool] = lambda: False) -> tuple[list[list[int]], float, int]:
    """Rows with gaps filled, their makespan, and how many orders were priced (at most `budget`)."""
    tables = problem.tables
    local, inputs, lag, duration = tables.local, tables.input, tables.lag, tables.duration
    M = problem.microbatches
    limit = problem.limit + EPSILON
    cur = [list(r) for r in rows]
    timed = action_ends(problem, cur)
    if timed is None:
        return cur, float("inf"), 0
    end, free = timed
    best = max(free)
    priced = 0
    for _ in range(SWEEPS):
        moved = False
        for r in range(problem.ranks):
            i = 1
            while i < len(cur[r]):
                if priced >= budget or stop():
                    return cur, best, priced
                row = cur[r]
                start = end[row[i]] - duration[row[i]]
                if start > end[row[i - 1]] + EPSILON:
                    # stage * SLOTS + slot: actions sharing it keep their relative order
                    seen = {row[i] // SLOTS // M * SLOTS + row[i] % SLOTS}
                    for j in range(i + 1, min(len(row), i + WINDOW)):
                        code = row[j]
                        key = code // SLOTS // M * SLOTS + code % SLOTS
                        if key in seen:
                            continue
                        seen.add(key)
                        if max(end[local[code]], end[inputs[code]] + lag[code]) >= start - EPSILON:
                            continue  # it could not start before the gap closes
                        trial = row[:i] + [code] + row[i:j] + row[j + 1:]
                        if peaks(problem, [trial])[0] > limit:
                            continue
                        priced += 1
                        cur[r] = trial
                        timed = action_ends(problem, cur)
                        if timed is not None and max(timed[1]) <= best + EPSILON:
                            end, free = timed
                            best = min(best, max(free))
                            moved = True
                            break
                        cur[r] = row
                i += 1
        if not moved:
            break
    return cur, best, priced
