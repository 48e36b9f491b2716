"""Replay fixed per-rank orders: each action as early as its rank and its inputs allow.

The same rule as the simulator on a compute-only program (`semantics.execute`), on the
search's action codes (see `listsched`), so a local search can price thousands of orders.
"""

from __future__ import annotations

from collections.abc import Sequence

from .listsched import FWD, GRAD, NEVER, WGT
from .problem import Problem


def replay(problem: Problem, rows: Sequence[Sequence[int]]) -> float | None:
    """The makespan of `rows`, or None when they cannot finish (an input never comes)."""
    ends = finish_times(problem, rows)
    return None if ends is None else max(ends)


def finish_times(problem: Problem, rows: Sequence[Sequence[int]]) -> list[float] | None:
    """When each rank finishes its row, or None when the rows cannot finish."""
    P, M, S = problem.ranks, problem.microbatches, problem.stages
    placement = problem.placement
    comm = problem.comm
    cost = problem.cost
    gk = 1 if problem.split else 3
    end = [NEVER] * (S * M * 3)
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
                sm, slot = divmod(code, 3)
                s = sm // M
                if slot == FWD:
                    ready = 0.0
                    if s > 0:
                        ready = end[code - 3 * M]
                        if ready == NEVER:
                            break
                        if placement[s - 1] != r:
                            ready += comm
                    d = cost[s][0]
                elif slot == GRAD:
                    ready = end[code - 1]
                    if ready == NEVER:
                        break
                    if s < S - 1:
                        up = end[code + 3 * M]
                        if up == NEVER:
                            break
                        if placement[s + 1] != r:
                            up += comm
                        if up > ready:
                            ready = up
                    d = cost[s][gk]
                else:
                    ready = end[code - 1]
                    if ready == NEVER:
                        break
                    d = cost[s][2]
                if ready > t:
                    t = ready
                t += d
                end[code] = t
                i += 1
            if i != pos[r]:
                pos[r] = i
                free[r] = t
                progress = True
    if any(p != n for p, n in zip(pos, lengths)):
        return None
    return free


def peaks(problem: Problem, rows: Sequence[Sequence[int]]) -> list[float]:
    """Peak live activations per rank, in the search's unit (see `problem`)."""
    weight = problem.weight
    M = problem.microbatches
    free_slot = WGT if problem.split else GRAD
    out = []
    for row in rows:
        live = peak = 0.0
        for code in row:
            sm, slot = divmod(code, 3)
            if slot == FWD:
                live += weight[sm // M]
                if live > peak:
                    peak = live
            elif slot == free_slot:
                live -= weight[sm // M]
        out.append(peak)
    return out
