"""List scheduling under real costs and a memory limit: one policy in, each rank's order out.

Time is continuous. The rank that is free earliest picks, among the actions whose inputs have
arrived, by its policy: a ready backward (`I`, or `B` unsplit) first when `backward_first`,
else a forward that fits under the rank's forward limit, else a deferred `W`, which frees an
activation. A forward that does not fit waits for a `W`; a rank with nothing ready sleeps
until the next input it waits for arrives. Starting every chosen action at once gives the
same times as the simulator replaying the order (each action starts when its rank is free
and its inputs are in), so the makespan found here is the one `ppdsl simulate` reports.

Actions are numbered as in `slots` (`sm * SLOTS + slot`: the forward, the input gradient or
full backward, the weight gradient), and what each waits for, what its input's message costs
and what it does to memory are read from `Problem.rules`; each stage runs its forwards and its
backwards in microbatch order (so messages on a link stay in order).
"""

from __future__ import annotations

import random
from collections import deque

from attrs import frozen

from ..memory import EPSILON
from .problem import Problem
from .slots import FWD, GRAD, SLOTS, WGT

NEVER = float("inf")  # the arrival time of an input whose producer is not scheduled yet


@frozen
class Policy:
    """The choices a rank makes. `forward_limit[r]`: memory rank r may fill with forwards
    (at most the problem's limit); `noise`: the chance a decision between a forward and a
    backward is flipped, drawn from `seed` (0: none, the policy is deterministic)."""

    forward_limit: tuple[float, ...]
    backward_first: bool = True
    later_stage_first: bool = True
    reserve: bool = True
    eager_w: bool = False
    noise: float = 0.0
    seed: int = 0
    priority_only: bool = False  # with a bias: the bias alone ranks candidates, not their class


@frozen
class Order:
    """Each rank's actions as codes, in order, and the makespan they run in."""

    rows: tuple[tuple[int, ...], ...]
    makespan: float
    peak: tuple[float, ...]


def run(problem: Problem, policy: Policy, bias: list[float] | None = None) -> Order | None:  # noqa: C901 - one hot loop, kept flat for speed
    """The order `policy` makes, or None when it gets stuck (memory too small for its choices)."""
    P, M, S = problem.ranks, problem.microbatches, problem.stages
    placement = problem.placement
    cost = problem.cost
    comm = problem.comm
    split = problem.split
    weight = problem.weight
    limit = problem.limit + EPSILON
    rng = random.Random(policy.seed) if policy.noise > 0 else None
    local = [[s for s in range(S) if placement[s] == r] for r in range(P)]
    fwd_order = [list(reversed(loc)) if policy.later_stage_first else list(loc) for loc in local]
    first_local = [loc[0] for loc in local]
    # later local stages a microbatch admitted on rank r still owes a forward on
    owed_weight = [sum(weight[s] for s in loc[1:]) for loc in local]
    f_end = [NEVER] * (S * M)
    g_end = [NEVER] * (S * M)
    next_f = [0] * S
    next_g = [0] * S
    wq: list[deque[int]] = [deque() for _ in range(P)]
    live = [0.0] * P
    peak = [0.0] * P
    reserved = [0.0] * P
    free = [0.0] * P  # when the rank's last action ends
    wake = [0.0] * P  # when the rank next looks for work
    rows: list[list[int]] = [[] for _ in range(P)]
    remaining = [len(loc) * M * (3 if split else 2) for loc in local]
    left = sum(remaining)
    rules = problem.rules
    n_slots = SLOTS  # `slots.search_code`, inline: a call per action costs the hot loop
    f_kind, g_kind, w_kind = rules.kind
    assert f_kind is not None and g_kind is not None, "every layout has a forward and a backward"
    f_cost = [c[f_kind] for c in cost]
    g_cost = [c[g_kind] for c in cost]
    w_cost = [c[w_kind] if w_kind is not None else 0.0 for c in cost]
    # per stage: what its F, its I (or B) and its W add to the rank's live activations
    f_delta, g_delta, w_delta = ([sign * w for w in weight] for sign in rules.sign)
    # from a stage's sm to its input's: the previous stage's forward, the next one's gradient
    f_off, g_off = rules.step[FWD] * M, rules.step[GRAD] * M
    f_input = [0 <= s + rules.step[FWD] < S for s in range(S)]
    g_input = [0 <= s + rules.step[GRAD] < S for s in range(S)]
    f_lim = [min(limit, x + EPSILON) for x in policy.forward_limit]
    eager_w = policy.eager_w
    backward_first = policy.backward_first
    # With `bias`, each candidate scores its class (backward, forward, W) plus its own bias.
    g_base, f_base = (2.0, 1.0) if backward_first else (1.0, 2.0)
    if policy.priority_only:
        g_base = f_base = 0.0

    # the message time into stage s from the stage before (forward) and after (gradient)
    hop_f = [comm if hop else 0.0 for hop in rules.hop[FWD]]
    hop_g = [comm if hop else 0.0 for hop in rules.hop[GRAD]]
    reserve = policy.reserve
    while left:
        t = min(wake)
        r = wake.index(t)
        if t == NEVER:
            return None
        # candidates
        g_pick = -1
        g_next = NEVER
        best_m = M
        for s in local[r]:
            m = next_g[s]
            if m >= M:
                continue
            sm = s * M + m
            ready = f_end[sm]
            if g_input[s]:
                up = g_end[sm + g_off] + hop_g[s]
                if up > ready:
                    ready = up
            if ready <= t:
                if m < best_m:
                    best_m = m
                    g_pick = s
            elif ready < g_next:
                g_next = ready
        f_pick = -1
        f_next = NEVER
        for s in fwd_order[r]:
            m = next_f[s]
            if m >= M:
                continue
            sm = s * M + m
            if f_input[s]:
                ready = f_end[sm + f_off] + hop_f[s]
            else:
                ready = 0.0
            if ready > t:
                if ready < f_next:
                    f_next = ready
                continue
            need = weight[s]
            if s == first_local[r]:
                if reserve:
                    need += owed_weight[r]
                fits = live[r] + reserved[r] + need <= f_lim[r]
            else:
                fits = live[r] + need <= limit
            if fits:
                f_pick = s
                break
        w_ready = bool(wq[r])
        choice = -1  # slot chosen
        if bias is not None:
            score = -NEVER
            if g_pick >= 0:
                score = g_base + bias[(g_pick * M + next_g[g_pick]) * n_slots + GRAD]
                choice = GRAD
            if f_pick >= 0:
                x = f_base + bias[(f_pick * M + next_f[f_pick]) * n_slots + FWD]
                if x > score:
                    score, choice = x, FWD
            if w_ready:
                x = bias[wq[r][0] * n_slots + WGT]
                if x > score:
                    choice = WGT
        else:
            prefer_g = backward_first
            if rng is not None and g_pick >= 0 and f_pick >= 0 and rng.random() < policy.noise:
                prefer_g = not prefer_g
            if eager_w and w_ready:
                choice = WGT
            elif g_pick >= 0 and (prefer_g or f_pick < 0):
                choice = GRAD
            elif f_pick >= 0:
                choice = FWD
            elif w_ready:
                choice = WGT
        if choice < 0:
            nxt = min(g_next, f_next)
            wake[r] = nxt if nxt > t else NEVER
            continue
        if choice == GRAD:
            s = g_pick
            m = next_g[s]
            next_g[s] = m + 1
            sm = s * M + m
            end = t + g_cost[s]
            g_end[sm] = end
            rows[r].append(sm * n_slots + GRAD)
            if split:
                wq[r].append(sm)  # its W frees the activation (g_delta is 0)
            else:
                live[r] += g_delta[s]
            # wake the rank that waits for this gradient
            if s > 0:
                q = placement[s - 1]
                arrive = end + hop_g[s - 1]
                if q != r and wake[q] > arrive:
                    wake[q] = max(arrive, free[q])
        elif choice == FWD:
            s = f_pick
            m = next_f[s]
            next_f[s] = m + 1
            sm = s * M + m
            end = t + f_cost[s]
            f_end[sm] = end
            rows[r].append(sm * n_slots + FWD)
            live[r] += f_delta[s]
            if live[r] > peak[r]:
                peak[r] = live[r]
            if s == first_local[r]:
                reserved[r] += owed_weight[r]
            else:
                reserved[r] -= weight[s]
            q = placement[s + 1] if s < S - 1 else r
            if q != r:
                arrive = end + comm
                if wake[q] > arrive:
                    wake[q] = max(arrive, free[q])
        else:
            sm = wq[r].popleft()
            s = sm // M
            end = t + w_cost[s]
            rows[r].append(sm * n_slots + WGT)
            live[r] += w_delta[s]
        free[r] = end
        wake[r] = end
        left -= 1
    makespan = max(free)
    return Order(tuple(tuple(row) for row in rows), makespan, tuple(peak))


def default_limits(problem: Problem) -> tuple[float, ...]:
    return tuple(problem.limit for _ in range(problem.ranks))


def random_policy(problem: Problem, rng: random.Random) -> Policy:
    """A policy drawn around the shapes that work: per-rank forward limits falling with the
    rank (1F1B's warm-up) or flat, and occasional flips of forward-versus-backward."""
    P = problem.ranks
    L = problem.limit
    unit = 1.0 / problem.stages_per_rank
    flat = rng.random() < 0.4
    slope = 0.0 if flat else rng.choice((0.5, 1.0, 1.0, 2.0)) * unit
    top = L - rng.choice((0, 0, 0, 1, 2)) * unit
    limits = tuple(max(unit, min(L, top - slope * r)) for r in range(P))
    return Policy(limits, backward_first=rng.random() < 0.9, later_stage_first=rng.random() < 0.8,
                  reserve=rng.random() < 0.7, eager_w=rng.random() < 0.05,
                  noise=rng.choice((0.0, 0.0, 0.02, 0.05, 0.1)), seed=rng.randrange(1 << 30))
