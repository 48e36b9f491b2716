"""The search: the shortest schedule it can find under a memory limit, checked before it is returned.

For each shape considered (one stage a rank, loop; two, V) it starts from every named
generator that fits the limit (`named.seed_rows`) and from list schedules (`listsched`), then
spends a fixed budget of priced candidates in three phases: random list-scheduling policies,
a priority search (random per-action biases on the best policy, kept when no slower), and a
local search over the best order (`local`). The budget is counted in candidates, not seconds,
so the same inputs always give the same schedule; a `time_limit` stops early with the best so
far (and the result says so).

A result is proven optimal only when it meets `lower_bound`; otherwise it is the best found.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

from attrs import frozen

from ..costs import CostModel
from ..ir import Kind, Program, Step, make_action
from ..memory import EPSILON
from .byte_limit import ByteLimit
from .exact import MAX_PAIRS, pairs, solve
from .exact import available as exact_available
from .listsched import Order, Policy, default_limits, random_policy, run
from .local import improve
from .named import NamedResult, best_fitting, named_results, seed_rows
from .problem import Problem, cuts_of, make_problem
from .replay import peaks, replay
from .slots import FWD, GRAD, SLOTS, sm_and_slot

# Candidates priced per shape, and how many action-steps that may cost at most (a big pipeline
# gets fewer candidates, so 16 x 64 finishes in minutes, not hours).
CANDIDATES = 6000
ACTION_STEPS = 1_500_000
MIN_CANDIDATES = 800
EXACT_SECONDS = 5.0  # per shape, for the MILP on a small problem
# A result within this relative gap of a lower bound is reported optimal: HiGHS's own default
# gap, far below any difference two real costs make.
PROOF_TOLERANCE = 1e-4
# The smallest limit any shape can run under: a microbatch's forward activations of one rank's
# whole share stay live until its backward (a V rank holds both chunks at its turn).
SMALLEST_LIMIT = 1.0

Progress = Callable[[float, float, int], None]  # (best makespan, seconds elapsed, candidates priced)


@frozen
class Found:
    program: Program  # compute-only rows; `B` where a W right after its I could be fused
    makespan: float
    bubble: float
    peak: float  # in the search's unit
    limit: float
    stages_per_rank: int
    method: str
    optimal: bool
    lower_bound: float
    candidates: int
    seconds: float
    stopped_early: bool
    start: str  # what the winning order grew from
    named: NamedResult | None  # the best named generator within the limit, for comparison
    cuts: int  # how many stages the per-stage costs number (see costs.reshape)


@frozen
class Infeasible:
    limit: float
    smallest: float


def budget(problem: Problem) -> int:
    actions = problem.stages * problem.microbatches * SLOTS
    return max(MIN_CANDIDATES, min(CANDIDATES, ACTION_STEPS // actions))


def lower_bound(problem: Problem) -> float:
    """No schedule is shorter: a rank's work after the first input can reach it, or one
    microbatch's whole chain of forwards, input gradients and its last weight gradient."""
    P, S, M = problem.ranks, problem.stages, problem.microbatches
    gk = 1 if problem.split else 3
    arrive = [0.0] * S  # earliest start of F(s, 0)
    for s in range(1, S):
        hop = problem.comm if problem.placement[s - 1] != problem.placement[s] else 0.0
        arrive[s] = arrive[s - 1] + problem.cost[s - 1][0] + hop
    bound = 0.0
    for r in range(P):
        mine = [s for s in range(S) if problem.placement[s] == r]
        work = sum(M * (problem.cost[s][0] + problem.cost[s][gk] + (problem.cost[s][2] if problem.split else 0.0))
                   for s in mine)
        bound = max(bound, min(arrive[s] for s in mine) + work)
    chain = arrive[S - 1] + problem.cost[S - 1][0]
    for s in range(S - 1, -1, -1):
        chain += problem.cost[s][gk]
        if s > 0 and problem.placement[s - 1] != problem.placement[s]:
            chain += problem.comm
    if problem.split:
        chain += problem.cost[0][2]
    return max(bound, chain)


class _Best:
    def __init__(self, problem: Problem, progress: Progress | None, started: float):
        self.problem = problem
        self.rows: list[list[int]] | None = None
        self.makespan = math.inf
        self.start = ""
        self.count = 0
        self.progress = progress
        self.started = started
        self.last_report = started

    def offer(self, rows: list[list[int]], makespan: float, start: str) -> bool:
        self.count += 1
        better = makespan < self.makespan - EPSILON
        if better:
            self.rows, self.makespan, self.start = rows, makespan, start
        now = time.monotonic()
        if self.progress is not None and now - self.last_report >= 1.0:
            self.last_report = now
            self.progress(self.makespan, now - self.started, self.count)
        return better


def search_shape(problem: Problem, named: list[NamedResult], seed: int, candidates: int,
                 deadline: float | None, progress: Progress | None, started: float) -> _Best:
    rng = random.Random(seed)
    best = _Best(problem, progress, started)

    def stop() -> bool:
        return deadline is not None and time.monotonic() > deadline

    for name, rows in seed_rows(problem, named):
        t = replay(problem, rows)
        if t is not None:
            best.offer(rows, t, name)
    # Phase 1: list-scheduling policies.
    policies: list[tuple[float, Policy]] = []
    tries = [Policy(default_limits(problem)), Policy(default_limits(problem), reserve=False)]
    n1 = candidates // 5
    for k in range(n1):
        if k >= len(tries) and stop():  # the plain policies always run: a result even at once
            return best
        policy = tries[k] if k < len(tries) else random_policy(problem, rng)
        order = run(problem, policy)
        if order is None:
            continue
        policies.append((order.makespan, policy))
        best.offer([list(r) for r in order.rows], order.makespan, "list scheduling")
    # Phase 2: per-action priorities on the best policies.
    policies.sort(key=lambda x: x[0])
    n2 = 2 * candidates // 5
    if policies:
        actions = problem.stages * problem.microbatches * SLOTS
        top = [p for _, p in policies[:3]]
        per = max(1, n2 // len(top))
        for policy in top:
            bias = [0.0] * actions
            here = math.inf
            for _ in range(per):
                if stop():
                    return best
                trial = list(bias)
                for _ in range(rng.choice((1, 1, 2, 3, 5))):
                    trial[rng.randrange(actions)] = rng.uniform(-1.5, 1.5)
                order = run(problem, policy, trial)
                if order is not None and order.makespan <= here + EPSILON:
                    here, bias = order.makespan, trial
                    best.offer([list(r) for r in order.rows], order.makespan, "priority search")
                else:
                    best.count += 1
    # Phase 3: local search over the best order.
    if best.rows is not None:
        n3 = candidates - best.count
        if n3 > 0:
            rows, t = improve(problem, best.rows, best.makespan, n3, rng, stop)
            best.count += n3
            if t < best.makespan - EPSILON:
                best.rows, best.makespan, best.start = rows, t, best.start + " + local search"
    return best


def to_program(problem: Problem, rows: list[list[int]], fuse: bool) -> Program:
    """Codes -> compute-only rows. With `fuse`, stage 0's W right after its own I becomes one B:
    no stage waits for stage 0's input gradient, so the fused B ends when the W would have
    (elsewhere a B would hold back the gradient the stage before waits for)."""
    M = problem.microbatches
    out: list[tuple[Step, ...]] = []
    for row in rows:
        steps: list[Step] = []
        i = 0
        while i < len(row):
            code = row[i]
            sm, slot = sm_and_slot(code)
            s, m = divmod(sm, M)
            if slot == FWD:
                steps.append(make_action(s, Kind.F, m))
            elif slot == GRAD:
                if not problem.split:
                    steps.append(make_action(s, Kind.B, m))
                elif fuse and s == 0 and i + 1 < len(row) and row[i + 1] == code + 1:
                    steps.append(make_action(s, Kind.B, m))
                    i += 1
                else:
                    steps.append(make_action(s, Kind.I, m))
            else:
                steps.append(make_action(s, Kind.W, m))
            i += 1
        out.append(tuple(steps))
    return Program(problem.ranks, problem.stages, M, problem.placement, tuple(out))


def can_fuse(problem: Problem) -> bool:
    """A B costs what its I and W cost together on every stage: fusing them changes no time."""
    return all(abs(c[3] - (c[1] + c[2])) <= EPSILON for c in problem.cost)


def search(ranks: int, microbatches: int, costs: CostModel, limit: float, stages_per_rank: str = "auto",
           time_limit: float | None = None, progress: Progress | None = None, seed: int = 0,
           cuts: int | None = None, exact: bool = True, in_bytes: ByteLimit | None = None) -> Found | Infeasible:
    """Search; `stages_per_rank` is "1", "2" or "auto" (both). `cuts`: how many stages the
    per-stage costs number (default: `problem.cuts_of`, one or two a rank by the highest key).
    `exact`: also run the MILP (`exact.py`) on small problems when scipy is installed.
    `in_bytes`: the limit is in bytes, `limit` is `byte_limit.SCALED_LIMIT` and each shape's
    stages weigh what `ByteLimit.weights` says (the shapes asked for must fit)."""
    if cuts is None:
        cuts = cuts_of(costs, ranks)
        if cuts is None:
            raise ValueError("per-stage costs name a stage past two a rank")
    started = time.monotonic()
    if limit < SMALLEST_LIMIT - EPSILON:
        return Infeasible(limit, SMALLEST_LIMIT)
    deadline = started + time_limit if time_limit is not None else None
    shapes = (1, 2) if stages_per_rank == "auto" else (int(stages_per_rank),)
    named = named_results(ranks, microbatches, costs, cuts)
    results: list[tuple[float, int, Problem, _Best]] = []
    done_best, done_count = math.inf, 0
    for k, v in enumerate(shapes):
        weights = None if in_bytes is None else in_bytes.weights(ranks, v)
        problem = make_problem(ranks, microbatches, v, limit, costs, cuts=cuts, weights=weights)
        report: Progress | None = None
        if progress is not None:
            def report(best: float, elapsed: float, count: int, b: float = done_best, c: int = done_count) -> None:
                assert progress is not None
                progress(min(best, b), elapsed, count + c)
        best = search_shape(problem, named, seed + k, budget(problem), deadline, report, started)
        done_best, done_count = min(done_best, best.makespan), done_count + best.count
        if best.rows is not None:
            results.append((best.makespan, v, problem, best))
    if not results:  # pragma: no cover - every shape finishes at the smallest limit
        raise AssertionError(f"no schedule found at memory limit {limit}")
    method = "heuristic: named-generator seeds, list scheduling, priority search, local search over orders"
    bounds = {v: lower_bound(problem) for _, v, problem, _ in results}
    if exact and all(pairs(problem) <= MAX_PAIRS for _, _, problem, _ in results) and exact_available():
        method += "; exact MILP (scipy HiGHS) on each shape"
        for entry in results:
            _, v, problem, best = entry
            left = EXACT_SECONDS if deadline is None else min(EXACT_SECONDS, deadline - time.monotonic())
            if left <= 0:
                break
            answer = solve(problem, left, best.makespan)
            if answer is None:
                continue
            bounds[v] = max(bounds[v], answer.bound)
            # Only a proven optimum replaces the heuristic's order: a time-limited MILP's
            # incumbent would make the result depend on the machine's load.
            if answer.optimal and answer.rows is not None:
                t = replay(problem, answer.rows)
                if t is not None and t < best.makespan - EPSILON and max(peaks(problem, answer.rows)) <= limit + EPSILON:
                    best.rows, best.makespan, best.start = answer.rows, t, "exact MILP"
            best.count += 1
        results = [(b.makespan, v, p, b) for _, v, p, b in results]
    results.sort(key=lambda x: (x[0], x[1]))
    makespan, v, problem, best = results[0]
    assert best.rows is not None
    program = to_program(problem, best.rows, can_fuse(problem))
    # Every shape considered must be bounded for the result to be proven optimal.
    bound = min(bounds[s] if s in bounds else lower_bound(make_problem(ranks, microbatches, s, limit, costs, cuts=cuts))
                for s in shapes)
    stopped = deadline is not None and time.monotonic() > deadline
    peak = max(peaks(problem, best.rows))
    return Found(program, makespan, 0.0, peak, limit, v, method, makespan <= bound + PROOF_TOLERANCE * max(1.0, makespan), bound,
                 sum(r[3].count for r in results), time.monotonic() - started, stopped, best.start,
                 best_fitting(named, limit), cuts)
