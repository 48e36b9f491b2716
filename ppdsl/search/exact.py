"""An exact MILP for small searches, with scipy's HiGHS (`scipy.optimize.milp`), when installed.

Optional (`pip install 'ppdsl[search]'`); without scipy `available()` is False and the search
is the heuristic alone. The model is disjunctive: a start time per action, one binary per pair
of actions on a rank saying which runs first (each pair must not overlap: big-M constraints),
data dependencies with the message time between ranks, and memory in the checker's order
model: when a forward starts, the forwards ordered before it (and itself) minus the `W`s
ordered before it must fit the limit. The objective is the makespan.

`solve` returns the rows in start-time order and whether HiGHS proved them optimal, plus its
lower bound, so a heuristic result that meets the bound is proven optimal too. Only small
problems are handed over (`MAX_PAIRS` ordering binaries): the model grows with the square of
a rank's actions.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

from attrs import frozen

from .problem import Problem
from .slots import search_code, sm_and_slot

MAX_PAIRS = 1_200  # ordering binaries in all; (2,4) V has 552, (4,4) V 1,104, (4,8) V 4,512


@frozen
class Exact:
    rows: list[list[int]] | None  # None: no feasible point found in time
    makespan: float
    optimal: bool
    bound: float


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """HiGHS writes some notes from C straight to the process's stdout even with disp=False;
    they would break `--format json`: point file descriptors 1 and 2 elsewhere meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, sink):
            os.close(fd)


def available() -> bool:
    return importlib.util.find_spec("scipy") is not None


def pairs(problem: Problem) -> int:
    per_rank = problem.stages_per_rank * problem.microbatches * (3 if problem.split else 2)
    return problem.ranks * per_rank * (per_rank - 1) // 2


def solve(problem: Problem, time_limit: float, upper: float = math.inf) -> Exact | None:  # noqa: C901
    """The MILP's answer within `time_limit` seconds, or None when scipy is missing. `upper`:
    a makespan known to be feasible (the heuristic's), which prunes the MILP's tree."""
    if not available():
        return None
    # Imported by name: scipy is optional and ships no type stubs.
    np: Any = importlib.import_module("numpy")
    optimize: Any = importlib.import_module("scipy.optimize")
    sparse: Any = importlib.import_module("scipy.sparse")

    P, M, S = problem.ranks, problem.microbatches, problem.stages
    slots = [slot for slot, kind in enumerate(problem.rules.kind) if kind is not None]
    tables = problem.tables
    codes = [search_code(s * M + m, k) for s in range(S) for m in range(M) for k in slots]
    index = {c: i for i, c in enumerate(codes)}
    n = len(codes)
    dur = tables.duration.__getitem__

    def rank(c: int) -> int:
        return problem.placement[sm_and_slot(c)[0] // M]

    big = sum(dur(c) for c in codes) + problem.comm * 2 * S * M + 1.0
    by_rank: list[list[int]] = [[] for _ in range(P)]
    for c in codes:
        by_rank[rank(c)].append(c)
    pair_list = [(a, b) for row in by_rank for i, a in enumerate(row) for b in row[i + 1:]]
    y = {pair: n + 1 + k for k, pair in enumerate(pair_list)}  # y=1: the first of the pair runs first
    nvar = n + 1 + len(pair_list)
    cmax = n
    rows_i: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(terms: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for col, v in terms:
            rows_i.append(r)
            cols.append(col)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    def before(a: int, b: int) -> tuple[int, float, float]:
        """(variable, sign, offset): `a before b` is offset + sign * var."""
        if (a, b) in y:
            return y[(a, b)], 1.0, 0.0
        return y[(b, a)], -1.0, 1.0

    for c in codes:
        m = sm_and_slot(c)[0] % M
        i = index[c]
        deps = [(tables.local[c], 0.0), (tables.input[c], tables.lag[c])]
        for d, lag in deps:
            if d != tables.done:
                add([(i, 1.0), (index[d], -1.0)], dur(d) + lag, math.inf)
        add([(cmax, 1.0), (i, -1.0)], dur(c), math.inf)
        if m > 0:  # each stage runs each kind in microbatch order
            before_c = c - search_code(1, 0)
            add([(i, 1.0), (index[before_c], -1.0)], dur(before_c), math.inf)
    for (a, b), v in y.items():
        ia, ib = index[a], index[b]
        # y=1: s_b >= s_a + d_a ; y=0: s_a >= s_b + d_b
        add([(ib, 1.0), (ia, -1.0), (v, -big)], dur(a) - big, math.inf)
        add([(ia, 1.0), (ib, -1.0), (v, big)], dur(b), math.inf)
    delta = tables.delta
    limit = problem.limit + 1e-9
    for row in by_rank:
        for a in row:
            if delta[a] <= 0:  # memory is full where an allocation is made
                continue
            terms: list[tuple[int, float]] = []
            const = delta[a]
            for b in row:
                if b == a or delta[b] == 0:
                    continue
                var, vs, off = before(b, a)
                terms.append((var, delta[b] * vs))
                const += delta[b] * off
            add(terms, -math.inf, limit - const)
    A = sparse.coo_matrix((vals, (rows_i, cols)), shape=(len(lo), nvar)).tocsr()
    cost = np.zeros(nvar)
    cost[cmax] = 1.0
    integrality = np.zeros(nvar)
    integrality[n + 1:] = 1
    lower = np.zeros(nvar)
    top = np.full(nvar, np.inf)
    top[n + 1:] = 1.0
    top[cmax] = upper + 1e-6 if math.isfinite(upper) else np.inf
    with _quiet():
        res: Any = optimize.milp(cost, constraints=optimize.LinearConstraint(A, np.array(lo), np.array(hi)), integrality=integrality,
                                 bounds=optimize.Bounds(lower, top),
                                 options={"time_limit": max(0.1, time_limit), "disp": False})
    bound = float(getattr(res, "mip_dual_bound", None) or 0.0)
    if res.x is None:
        return Exact(None, math.inf, False, bound)
    starts = res.x[:n]
    out = [sorted(row, key=lambda c: (starts[index[c]], sm_and_slot(c)[1], c)) for row in by_rank]
    optimal = res.status == 0
    makespan = float(res.x[cmax])
    return Exact(out, makespan, optimal, makespan if optimal else bound)
