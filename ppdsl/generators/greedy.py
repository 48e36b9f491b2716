"""A list scheduler under unit costs: the engine behind the zero-bubble and V generators.

The zero-bubble family (Qi et al., 2023 and 2024) is defined by a memory budget and a
priority rule rather than by one closed formula: every rank, whenever it is free, runs

1. a ready backward (`I`, or `B` when the backward is not split), oldest microbatch first,
   then the later stage: it is on the critical path and frees nothing yet;
2. else a ready forward, if the activation budget allows: the later local stage first, so a
   microbatch already admitted on this rank moves on before a new one is admitted;
3. else a deferred weight gradient `W` (oldest first), which fills what would be a bubble
   and frees an activation;
4. else it idles until something arrives.

Time advances in unit steps (F = I = W = 1, B = 2 when not split), the costs the published
figures assume. The result is each rank's order of actions; an event-driven run under any
costs keeps the order and only moves the start times.

A new microbatch is admitted on a rank (its forward on the rank's first local stage) only when
the budget can also hold its forwards on the rank's other local stages. That reservation
keeps the scheduler from filling a rank with half-finished microbatches that can never reach
their backward, so it finishes whenever the budget is at least the local stage count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ..wording import plural
from ..ir import Kind, Step, make_action


def schedule(ranks: int, microbatches: int, placement: Sequence[int], budget: Sequence[int],
             split: bool = True) -> tuple[tuple[Step, ...], ...]:
    """Rows for `placement` with at most `budget[r]` live activations on rank r (per stage).

    `split` runs backward-input `I` and backward-weight `W` separately; otherwise full `B`.
    """
    stages = len(placement)
    M = microbatches
    local: list[list[int]] = [[] for _ in range(ranks)]
    for s, r in enumerate(placement):  # (one pass: ranks x stages is 4e9 at 65,536 ranks)
        local[r].append(s)
    for r in range(ranks):
        if budget[r] < len(local[r]):  # pragma: no cover - callers check their budgets
            raise ValueError(f"rank {r} holds {plural(len(local[r]), 'stage')} but may keep only {plural(budget[r], 'activation')}")
    first_local = [loc[0] if loc else -1 for loc in local]
    # When each (stage, microbatch) forward / input-gradient finished (None: not yet).
    f_end: list[list[int | None]] = [[None] * M for _ in range(stages)]
    g_end: list[list[int | None]] = [[None] * M for _ in range(stages)]
    next_f = [0] * stages
    next_g = [0] * stages
    w_queue: list[deque[tuple[int, int]]] = [deque() for _ in range(ranks)]
    live = [0] * ranks
    reserved = [0] * ranks  # forwards still owed on later local stages by admitted microbatches
    busy_until = [0] * ranks
    rows: list[list[Step]] = [[] for _ in range(ranks)]
    pending_free: list[list[tuple[int, int]]] = [[] for _ in range(ranks)]  # (time, amount)
    backward_kind = Kind.I if split else Kind.B
    back_cost = 1 if split else 2
    remaining = stages * M * (3 if split else 2)
    # Event-driven: a rank is looked at only at a time when something it may wait for ends
    # (its own step, the forward of the stage before one of its stages, the backward of the
    # stage after). Between those times nothing it could choose changes, so the rows are those
    # of stepping every rank through every time unit, at the cost of the steps alone.
    wake: dict[int, set[int]] = {0: set(range(ranks))}
    while remaining:
        if not wake:  # pragma: no cover - the reservation rule rules this out
            raise AssertionError("list scheduler made no progress")
        t = min(wake)
        for r in sorted(wake.pop(t)):
            if busy_until[r] > t:
                continue  # woken by a neighbour while busy: its own end wakes it again
            # Activations freed by work that has ended by now.
            if pending_free[r]:
                keep = []
                for when, amount in pending_free[r]:
                    if when <= t:
                        live[r] -= amount
                    else:
                        keep.append((when, amount))
                pending_free[r] = keep
            chosen = _pick_backward(local[r], M, stages, f_end, g_end, next_g, t)
            if chosen is not None:
                s, m = chosen
                rows[r].append(make_action(s, backward_kind, m))
                g_end[s][m] = t + back_cost
                next_g[s] += 1
                busy_until[r] = t + back_cost
                remaining -= 1
                if split:
                    w_queue[r].append((s, m))
                else:
                    pending_free[r].append((t + back_cost, 1))
                woken = wake.setdefault(t + back_cost, set())
                woken.add(r)
                if s > 0:
                    woken.add(placement[s - 1])
                continue
            chosen = _pick_forward(local[r], first_local[r], M, f_end, next_f, t, live[r], reserved[r], budget[r])
            if chosen is not None:
                s, m = chosen
                rows[r].append(make_action(s, Kind.F, m))
                f_end[s][m] = t + 1
                next_f[s] += 1
                live[r] += 1
                if s == first_local[r]:
                    reserved[r] += len(local[r]) - 1
                else:
                    reserved[r] -= 1
                busy_until[r] = t + 1
                remaining -= 1
                woken = wake.setdefault(t + 1, set())
                woken.add(r)
                if s < stages - 1:
                    woken.add(placement[s + 1])
                continue
            if w_queue[r]:
                s, m = w_queue[r].popleft()
                rows[r].append(make_action(s, Kind.W, m))
                pending_free[r].append((t + 1, 1))
                busy_until[r] = t + 1
                remaining -= 1
                wake.setdefault(t + 1, set()).add(r)
    return tuple(tuple(row) for row in rows)


def _pick_backward(stages_here: list[int], M: int, S: int, f_end: list[list[int | None]],
                   g_end: list[list[int | None]], next_g: list[int], t: int) -> tuple[int, int] | None:
    best: tuple[int, int] | None = None
    for s in stages_here:
        m = next_g[s]
        if m >= M:
            continue
        f = f_end[s][m]
        if f is None or f > t:
            continue
        if s < S - 1:
            g = g_end[s + 1][m]
            if g is None or g > t:
                continue
        if best is None or (m, -s) < (best[1], -best[0]):
            best = (s, m)
    return best


def _pick_forward(stages_here: list[int], first: int, M: int, f_end: list[list[int | None]], next_f: list[int],
                  t: int, live: int, reserved: int, budget: int) -> tuple[int, int] | None:
    for s in reversed(stages_here):
        m = next_f[s]
        if m >= M:
            continue
        if s > 0:
            f = f_end[s - 1][m]
            if f is None or f > t:
                continue
        if s == first:
            if live + 1 + reserved + (len(stages_here) - 1) > budget:
                continue
        elif live + 1 > budget:  # pragma: no cover - the reservation makes room
            continue
        return s, m
    return None

