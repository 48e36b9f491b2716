"""Replay fixed per-rank orders: each action as early as its rank and its inputs allow.

The simulator's rule on a compute-only program (`semantics.execute`), read from the
encoding's tables in the search's layout (`slots.CodeTables`), so a local search can price
thousands of orders; a property test holds the two equal on random orders.
"""

from __future__ import annotations

from collections.abc import Sequence

from .problem import Problem

NEVER = float("inf")  # the finish time of an action not run yet


def replay(problem: Problem, rows: Sequence[Sequence[int]]) -> float | None:
    """The makespan of `rows`, or None when they cannot finish (an input never comes)."""
    ends = finish_times(problem, rows)
    return None if ends is None else max(ends)


def finish_times(problem: Problem, rows: Sequence[Sequence[int]]) -> list[float] | None:
    """When each rank finishes its row, or None when the rows cannot finish."""
    timed = action_ends(problem, rows)
    return None if timed is None else timed[1]


def action_ends(problem: Problem, rows: Sequence[Sequence[int]]) -> tuple[list[float], list[float]] | None:
    """When each action ends (indexed by code; the last entry, 0, is "waits for nothing") and
    when each rank finishes its row, or None when the rows cannot finish."""
    tables = problem.tables
    local, inputs, lag, duration = tables.local, tables.input, tables.lag, tables.duration
    end = [NEVER] * tables.done + [0.0]  # the last entry: "waits for nothing", done at 0
    P = problem.ranks
    pos = [0] * P
    free = [0.0] * P
    lengths = [len(row) for row in rows]
    progress = True
    while progress:
        progress = False
        for r in range(P):
            row = rows[r]
            i = pos[r]
            n = lengths[r]
            t = free[r]
            while i < n:
                code = row[i]
                ready = end[local[code]]
                if ready == NEVER:
                    break
                up = end[inputs[code]]
                if up == NEVER:
                    break
                up += lag[code]
                if up > ready:
                    ready = up
                if ready > t:
                    t = ready
                t += duration[code]
                end[code] = t
                i += 1
            if i != pos[r]:
                pos[r] = i
                free[r] = t
                progress = True
    if any(p != n for p, n in zip(pos, lengths)):
        return None
    return end, free


def peaks(problem: Problem, rows: Sequence[Sequence[int]]) -> list[float]:
    """Peak live activations per rank, in the search's unit (see `problem`)."""
    delta = problem.tables.delta
    out = []
    for row in rows:
        live = peak = 0.0
        for code in row:
            live += delta[code]
            if live > peak:
                peak = live
        out.append(peak)
    return out
