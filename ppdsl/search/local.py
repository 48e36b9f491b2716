"""Local search over fixed orders: move one action a few places on its rank, keep what is no slower.

A move keeps each stage's forwards, input gradients and weight gradients in microbatch order
(so an order stays one the list scheduler could make) and the rank's peak within the limit;
it is priced by `replay`. Moves that tie are kept too, so the search can walk across plateaus.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from ..memory import EPSILON
from .problem import Problem
from .replay import finish_times, peaks
from .slots import sm_and_slot

Rows = list[list[int]]


def _key(code: int) -> tuple[int, int]:
    """Actions that must keep their relative order share this key: (stage, slot)."""
    return sm_and_slot(code)


def improve(problem: Problem, rows: Sequence[Sequence[int]], makespan: float, moves: int, rng: random.Random,
            stop: Callable[[], bool] = lambda: False) -> tuple[Rows, float]:
    """Up to `moves` random moves from `rows`; the best order found and its makespan."""
    M = problem.microbatches
    limit = problem.limit + EPSILON
    cur: Rows = [list(r) for r in rows]
    best = makespan
    start = finish_times(problem, cur)
    total = sum(start) if start is not None else float("inf")
    stage_slot = [[(sm // M, slot) for sm, slot in map(sm_and_slot, row)] for row in cur]
    for n in range(moves):
        if n % 64 == 0 and stop():
            break
        r = rng.randrange(problem.ranks)
        row = cur[r]
        if len(row) < 2:
            continue
        i = rng.randrange(len(row))
        j = i + rng.choice((-3, -2, -1, -1, 1, 1, 2, 3))
        if not 0 <= j < len(row):
            continue
        key = stage_slot[r][i]
        lo, hi = (j, i) if j < i else (i + 1, j + 1)
        if any(stage_slot[r][k] == key for k in range(lo, hi)):
            continue
        code = row.pop(i)
        row.insert(j, code)
        tag = stage_slot[r].pop(i)
        stage_slot[r].insert(j, tag)
        ok = peaks(problem, [row])[0] <= limit
        if ok:
            ends = finish_times(problem, cur)
            if ends is None:
                ok = False
            else:
                # Makespan first; then the sum of every rank's finish, so moves that give
                # other ranks slack count as progress on a plateau of equal makespans.
                score = (max(ends), sum(ends))
                ok = score <= (best + EPSILON, total + EPSILON)
                if ok:
                    best, total = min(best, score[0]), score[1]
        if not ok:
            row.pop(j)
            row.insert(i, code)
            stage_slot[r].pop(j)
            stage_slot[r].insert(i, tag)
    return cur, best
