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

from ..costs import CostModel, reshape
from ..ir import Kind, Program, Step, make_action
from ..memory import EPSILON
from .blocks import block_orders
from .byte_limit import ByteLimit
from ..simulate import simulate
from .exact import MAX_PAIRS, pairs, solve
from .fit_memory import fit
from .exact import available as exact_available
from .listsched import Order, Policy, default_limits, random_policy, run
from .gaps import fill_gaps
from .local import improve
from .named import NamedResult, best_fitting, moves_activations, named_results, seed_rows
from .problem import Problem, cuts_of, make_problem
from .replay import peaks, replay
from .slots import FWD, GRAD, SLOTS, sm_and_slot

# Candidates priced per shape, and how many action-steps that may cost at most (a big pipeline
# gets fewer candidates, so 16 x 64 finishes in minutes, not hours).
CANDIDATES = 6000
ACTION_STEPS = 1_500_000
MIN_CANDIDATES = 800
# Building blocks tried per V shape, and the action-steps their memory check may cost (each is
# a cheap prefix sum; only those within the limit are reworked and priced).
BLOCKS = 2000
BLOCK_STEPS = 3_000_000
FILLED = 3  # the shortest reworked blocks whose gaps are filled
FILL_CANDIDATES = 600  # orders priced per gap filling at most (8 x 32 needs about 300)
EXACT_SECONDS = 5.0  # per shape, for the MILP on a small problem
# A result within this relative gap of a lower bound is reported optimal: HiGHS's own default
# gap, far below any difference two real costs make.
PROOF_TOLERANCE = 1e-4
# The smallest limit any shape can run under: a microbatch's forward activations of one rank's
# whole share stay live until its backward (a V rank holds both chunks at its turn).
SMALLEST_LIMIT = 1.0

# (best makespan, seconds elapsed, candidates priced, candidates the budget allows in all)
Progress = Callable[[float, float, int, int], None]
ShapeProgress = Callable[[float, float, int], None]  # one shape's: the first three
# Whether the exact MILP (`exact.py`) ran, and if not why: what `Found.exact` holds.
EXACT_RAN, EXACT_MISSING, EXACT_TOO_LARGE, EXACT_OFF = "ran", "scipy not installed", "too large", "off"


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
    planned: int = 0  # the candidates the budget allows over every shape (`planned`)
    exact: str = EXACT_OFF  # EXACT_RAN, or why the MILP did not run
    pairs: int = 0  # the MILP's ordering binaries for the largest shape (`exact.pairs`)
    moved: str = ""  # the memory actions placed to fit the limit ("recompute", "offload"), if any


@frozen
class Infeasible:
    limit: float
    smallest: float


def budget(problem: Problem) -> int:
    actions = problem.stages * problem.microbatches * SLOTS
    return max(MIN_CANDIDATES, min(CANDIDATES, ACTION_STEPS // actions))


def planned(problem: Problem) -> int:
    """The candidates a shape's search may price: its phases' budget, the building blocks
    and every gap filling (what progress counts towards)."""
    blocks = block_budget(problem) if problem.stages_per_rank == 2 else 0
    fills = (FILLED + 1) * FILL_CANDIDATES if problem.stages_per_rank == 2 else FILL_CANDIDATES
    return budget(problem) + blocks + fills


def block_budget(problem: Problem) -> int:
    actions = problem.stages * problem.microbatches * SLOTS
    return max(MIN_CANDIDATES // 4, min(BLOCKS, BLOCK_STEPS // actions))


def lower_bound(problem: Problem) -> float:
    """No schedule is shorter than the longest of: one microbatch's whole chain of forwards,
    input gradients and its last weight gradient; and, for each rank, the time its first
    input can reach it plus its work plus the idle time memory forces on it before its first
    free can start.

    The last term, for rank r with first input at `a` (`arrive`): let `t` be the earliest a
    freeing action (`W`; `B` unsplit) of r can start, and `g` the earliest any of its
    gradients can. Until r's first free starts, its live activations only grow, so the
    forwards it runs before then weigh at most the limit L together, and take at most
    L x (the largest cost-to-weight ratio of its stages) of its time; its gradients (with a
    split backward; unsplit, the gradient is the free) cannot run before `g`, so they take at
    most t - g of [a, t]. Nothing else can run before a free (a `W` needs its own gradient), so
    r idles at least (t - a) - that in [a, t], and all its work lies after a. At a limit that
    holds a rank's whole warm-up this term is 0 (ZB-V at p meets the bound); below it, it is
    the warm-up bubble the limit forces on the last rank.
    """
    P, S, M = problem.ranks, problem.stages, problem.microbatches
    # A cost row is indexed by Kind value; `makes_grad` is the action that makes a stage's input gradient.
    F, W, makes_grad = Kind.F, Kind.W, Kind.I if problem.split else Kind.B
    cost = problem.cost

    def hop(a: int, b: int) -> float:
        return problem.comm if problem.placement[a] != problem.placement[b] else 0.0

    arrive = [0.0] * S  # earliest start of F(s, 0)
    for s in range(1, S):
        arrive[s] = arrive[s - 1] + cost[s - 1][F] + hop(s - 1, s)
    grad = [0.0] * S  # earliest start of stage s's first gradient
    grad[S - 1] = arrive[S - 1] + cost[S - 1][F]
    for s in range(S - 2, -1, -1):
        grad[s] = max(arrive[s] + cost[s][F], grad[s + 1] + cost[s + 1][makes_grad] + hop(s + 1, s))
    weight = problem.weight
    bound = 0.0
    for r in range(P):
        mine = [s for s in range(S) if problem.placement[s] == r]
        work = sum(M * (cost[s][F] + cost[s][makes_grad] + (cost[s][W] if problem.split else 0.0)) for s in mine)
        first = min(arrive[s] for s in mine)
        g = min(grad[s] for s in mine)
        t = min(grad[s] + cost[s][makes_grad] for s in mine) if problem.split else g
        forwards = problem.limit * max(cost[s][F] / weight[s] for s in mine)
        idle = max(0.0, (t - first) - forwards - max(0.0, t - g))
        bound = max(bound, first + work + idle)
    chain = arrive[S - 1] + cost[S - 1][F]
    for s in range(S - 1, -1, -1):
        chain += cost[s][makes_grad]
        if s > 0:
            chain += hop(s - 1, s)
    if problem.split:
        chain += cost[0][W]
    return max(bound, chain)


class _Best:
    def __init__(self, problem: Problem, progress: ShapeProgress | None, started: float):
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
                 deadline: float | None, progress: ShapeProgress | None, started: float) -> _Best:
    rng = random.Random(seed)
    best = _Best(problem, progress, started)

    def stop() -> bool:
        return deadline is not None and time.monotonic() > deadline

    for name, rows in seed_rows(problem, named):
        t = replay(problem, rows)
        if t is not None:
            best.offer(rows, t, name)
    # Phase 0 (V only): building blocks with their ends reworked, the shortest gap-filled.
    orders, tried = block_orders(problem, block_budget(problem), rng, stop)
    best.count += tried
    for t, rows in orders[:FILLED]:
        if stop():
            return best
        filled, t, priced = fill_gaps(problem, rows, FILL_CANDIDATES, stop)
        best.count += priced
        best.offer(filled, t, "building block + gap filling")
    spent = best.count  # the phases below keep their own budgets
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
        n3 = candidates + spent - best.count
        if n3 > 0:
            rows, t = improve(problem, best.rows, best.makespan, n3, rng, stop)
            best.count += n3
            if t < best.makespan - EPSILON:
                best.rows, best.makespan, best.start = rows, t, best.start + " + local search"
        filled, t, priced = fill_gaps(problem, best.rows, FILL_CANDIDATES, stop)
        best.count += priced
        if t < best.makespan - EPSILON:
            best.rows, best.makespan, best.start = filled, t, best.start + " + gap filling"
    return best


def fusing_saves(problem: Problem) -> bool:
    """Whether some stage's whole backward `B` costs less than its `I` and `W` apart (a profile
    that measured both): orders of unsplit backwards may then be the shortest."""
    return any(b < i + w - EPSILON * max(1.0, i + w) for _, i, w, b in problem.cost)


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


def shapes_of(stages_per_rank: str) -> tuple[int, ...]:
    """The stages a rank of each shape searched: "auto" is both, one and two."""
    return (1, 2) if stages_per_rank == "auto" else (int(stages_per_rank),)


def search(ranks: int, microbatches: int, costs: CostModel, limit: float, shapes: tuple[int, ...] = (1, 2),
           time_limit: float | None = None, progress: Progress | None = None, seed: int = 0,
           cuts: int | None = None, exact: bool = True, in_bytes: ByteLimit | None = None,
           memory_actions: tuple[str, ...] = ()) -> Found | Infeasible:
    """Search the shapes `shapes` (stages a rank: 1, the loop; 2, the V). `cuts`: how many stages the
    per-stage costs number (default: `problem.cuts_of`, one or two a rank by the highest key).
    `exact`: also run the MILP (`exact.py`) on small problems when scipy is installed.
    `in_bytes`: the limit is in bytes, `limit` is `byte_limit.SCALED_LIMIT` and each shape's
    stages weigh what `ByteLimit.weights` says (the shapes asked for must fit).
    `memory_actions` ("recompute", "offload"): the schedules the search may also return, each
    named generator of the shapes with those actions placed to fit the limit (`fit_memory`),
    priced by the simulator (a copy lane for the moves); the shortest wins."""
    if in_bytes is not None and memory_actions:
        raise ValueError("memory actions are placed under a limit in the unit, not in bytes")
    if cuts is None:
        cuts = cuts_of(costs, ranks)
        if cuts is None:
            raise ValueError("per-stage costs name a stage past two a rank")
    started = time.monotonic()
    if limit < SMALLEST_LIMIT - EPSILON and not memory_actions:
        return Infeasible(limit, SMALLEST_LIMIT)
    deadline = started + time_limit if time_limit is not None else None
    # Compared with the named generators of the shapes searched only (the others' costs may be estimates).
    named = [n for n in named_results(ranks, microbatches, costs, cuts, moves=bool(memory_actions))
             if n.program.stages // ranks in shapes]
    results: list[tuple[float, int, _Best]] = []  # (makespan, index in problems, best)
    done_best, done_count = math.inf, 0
    problems: list[Problem] = []
    searched = max(limit, SMALLEST_LIMIT)  # below it only memory actions fit: the search proper runs at it
    for v in shapes:
        split = make_problem(ranks, microbatches, v, searched, costs, cuts=cuts,
                             weights=None if in_bytes is None else in_bytes.weights(ranks, v))
        problems.append(split)
        if fusing_saves(split):  # a measured B cheaper than its I and W: orders of F and B as well
            problems.append(split.with_split(False))
    total = sum(planned(problem) for problem in problems)
    for k, problem in enumerate(problems):
        report: ShapeProgress | None = None
        if progress is not None:
            def report(best: float, elapsed: float, count: int, b: float = done_best, c: int = done_count) -> None:
                assert progress is not None
                progress(min(best, b), elapsed, min(count + c, total), total)
        best = search_shape(problem, named, seed + k, budget(problem), deadline, report, started)
        done_best, done_count = min(done_best, best.makespan), done_count + best.count
        if best.rows is not None:
            results.append((best.makespan, k, best))
    if not results:  # pragma: no cover - every shape finishes at the smallest limit
        raise AssertionError(f"no schedule found at memory limit {limit}")
    method = ("heuristic: named-generator seeds, V building blocks, list scheduling, priority search, local search "
              "over orders, gap filling")
    # A shape may hold a split and an unsplit problem: each has its own bound.
    bounds = [lower_bound(problem) for problem in problems]
    largest = max(pairs(problem) for problem in problems)
    status = EXACT_OFF if not exact else EXACT_TOO_LARGE if largest > MAX_PAIRS else EXACT_MISSING if not exact_available() else EXACT_RAN
    if status == EXACT_RAN:
        method += "; exact MILP (scipy HiGHS) on each shape"
        for _, k, best in results:
            problem = problems[k]
            left = EXACT_SECONDS if deadline is None else min(EXACT_SECONDS, deadline - time.monotonic())
            if left <= 0:
                break
            answer = solve(problem, left, best.makespan)
            if answer is None:
                continue
            bounds[k] = max(bounds[k], answer.bound)
            # Only a proven optimum replaces the heuristic's order: a time-limited MILP's
            # incumbent would make the result depend on the machine's load.
            if answer.optimal and answer.rows is not None:
                t = replay(problem, answer.rows)
                if t is not None and t < best.makespan - EPSILON and max(peaks(problem, answer.rows)) <= limit + EPSILON:
                    best.rows, best.makespan, best.start = answer.rows, t, "exact MILP"
            best.count += 1
        results = [(b.makespan, k, b) for _, k, b in results]
    results.sort(key=lambda x: (x[0], problems[x[1]].stages_per_rank))
    makespan, k, best = results[0]
    problem = problems[k]
    v = problem.stages_per_rank
    assert best.rows is not None
    program = to_program(problem, best.rows, can_fuse(problem))
    # Every problem considered (each shape, split and unsplit) must be bounded for the result to be proven optimal.
    bound = min(bounds)
    stopped = deadline is not None and time.monotonic() > deadline
    peak = max(peaks(problem, best.rows))
    count = sum(r[2].count for r in results)
    fitted = _with_memory_actions(named, ranks, microbatches, costs, cuts, limit, memory_actions)
    if fitted is not None and (fitted[2] < makespan - EPSILON or peak > limit + EPSILON):
        # The bound of a schedule that may move or remake activations: without the idle time
        # the limit forces (its `lower_bound` term), which memory actions can avoid.
        free = [lower_bound(make_problem(ranks, microbatches, v, float(ranks * microbatches), costs, cuts=cuts))
                for v in shapes]
        name, kind, time_of, peak_of, fitted_program = fitted
        return Found(fitted_program, time_of, 0.0, peak_of, limit, fitted_program.stages // ranks,
                     method + "; memory actions: each named generator with R (recompute) or OFFLOAD and RELOAD "
                     "placed where the limit needs them", False, min(free), count + 1, time.monotonic() - started,
                     stopped, f"{name} with {kind} placed to fit the limit", best_fitting(named, limit), cuts, total,
                     status, largest, kind)
    if peak > limit + EPSILON:  # below the smallest limit and no memory action fits it either
        return Infeasible(limit, SMALLEST_LIMIT)
    return Found(program, makespan, 0.0, peak, limit, v, method, makespan <= bound + PROOF_TOLERANCE * max(1.0, makespan), bound,
                 count, time.monotonic() - started, stopped, best.start,
                 best_fitting(named, limit), cuts, total, status, largest)


def _with_memory_actions(named: list[NamedResult], ranks: int, microbatches: int, costs: CostModel, cuts: int,
                         limit: float, how: tuple[str, ...]) -> tuple[str, str, float, float, Program] | None:
    """The shortest named schedule with memory actions placed to fit `limit` (`fit_memory`):
    (its generator, the actions, its makespan, its peak, the program), or None."""
    best: tuple[str, str, float, float, Program] | None = None
    for n in named:
        for kind in how:
            # A generator that places its own offloads (`pipeoffload`) is taken as it is.
            program = (n.program if kind == "offload" else None) if moves_activations(n.program) \
                else fit(n.program, limit, kind)
            if program is None:
                continue
            sim = simulate(program, reshape(costs, cuts, program.stages))
            peak = max(sim.peak_memory)
            if sim.completed and peak <= limit + EPSILON and (best is None or sim.makespan < best[2] - EPSILON):
                best = (n.name, kind, sim.makespan, peak, program)
    return best
