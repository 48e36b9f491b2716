"""PPS108, PPS210, PPS211: does the program run to the end?

Runs the program under the chosen communication model (`semantics.execute`, the one
definition the simulator and runtime share) and explains what got stuck.

PPS108 - in a compute-only program, program order plus data dependencies form a cycle. The
    report names a shortest cycle (fewest dependencies between ranks), e.g.
    "`0B0` (rank 0, step 0) needs `1B0` (rank 1, step 1), which runs after `1F0` (rank 1,
    step 0), which needs `0F0` (rank 0, step 1), which runs after `0B0`". Fix: reorder one
    of the rows so the cycle is broken. An overlapped pair whose one action needs the other
    is told first, as that pair waiting for itself (under any model, with sends or without).

PPS210 - deadlock: ranks wait for each other in a cycle under the communication model, e.g.
    "rank 0 waits at step 3 `0SEND_F1` for rank 1, which waits at step 3 `1SEND_B0` for
    rank 0" (under `rendezvous` both sends block until the other side receives). The help
    names one move that breaks the cycle, tried on the program first (`moves.py`). Fix: make
    it, or delete the sends and receives and let `ppdsl expand --comms` place them.

PPS211 - a rank waits forever for something no rank reaches (no cycle; usually a symptom of
    another error reported beside it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from ..diagnostics import Diagnostic
from ..encoding import compute_outputs, producers
from ..wording import plural
from ..semantics import CommModel, Wait, completes, execute, wait_cycle
from .context import RELOWER, SHIFT, Context
from .moves import breaking_move

FAMILY = "deadlock"
CODES = ("PPS108", "PPS210", "PPS211")
REQUIRES: tuple[str, ...] = ("structure", "completeness", "order", "comms")  # families that must have found no error

# Search effort for a shortest dependency cycle; past it, the best cycle found so far is
# reported (still a real cycle).
_SEARCH_BUDGET = 400_000


def check(ctx: Context) -> Iterator[Diagnostic]:
    if completes(ctx.program, ctx.model, encoded=ctx.enc):
        return  # runs to the end: no times needed (lowering runs the engine itself, once)
    ex = execute(ctx.program, ctx.model, encoded=ctx.enc)
    ctx.execution = ex
    if ex.completed:
        return
    inside = _pair_needing_itself(ctx)
    if inside is not None:
        yield inside
        return
    if not ctx.has_comms:
        cycle = shortest_cycle(ctx)
        if cycle:
            yield _cycle_diag(ctx, cycle)
            return
    cycle_waits = wait_cycle(ex.waits)
    if cycle_waits:
        start = min(range(len(cycle_waits)), key=lambda j: cycle_waits[j].rank)
        cycle_waits = cycle_waits[start:] + cycle_waits[:start]
        parts = []
        for j, w in enumerate(cycle_waits):
            lead = f"rank {w.rank} waits" if j == 0 else f"which waits"
            parts.append(f"{lead} at step {w.step} `{w.action}` for rank {w.on_rank}")
        first = cycle_waits[0]
        notes = [f"rank {w.rank} `{w.action}` needs `{w.needs}`"
                 + (" to be posted" if w.reason == "peer" else " to be computed") for w in cycle_waits]
        yield ctx.diag("PPS210", f"deadlock under `{ctx.model}`: " + ", ".join(parts), first.rank, first.step,
                       notes=notes, help=_help(ctx, cycle_waits))
        return
    for w in ex.waits:
        if w.on_rank is None or w.reason == "missing":
            yield ctx.diag("PPS211", f"rank {w.rank} waits forever at step {w.step} `{w.action}` for `{w.needs}`, "
                           "which no rank runs", w.rank, w.step)
            return
    w = ex.waits[0]
    yield ctx.diag("PPS211", f"rank {w.rank} waits forever at step {w.step} `{w.action}` for `{w.needs}` on rank {w.on_rank}",
                   w.rank, w.step)


def _pair_needing_itself(ctx: Context) -> Diagnostic | None:
    """An overlapped pair one of whose actions needs the other: both start together, so it
    waits for itself. No move of whole steps mends that (the cycle's help would offer one),
    only taking the pair apart."""
    enc = ctx.enc
    needs = enc.needs(ctx.model is CommModel.BUFFERED)
    for rank, groups in enumerate(enc.groups):
        for i, (is_batch, count) in sorted(groups.items()):
            if is_batch:
                continue
            members = enc.codes[rank][i:i + count]
            for a in members:
                made = set(compute_outputs(a))
                for b in members:
                    if b != a and any(key in made for key, _ in needs.of(b)):
                        step = enc.step_of(rank, i)
                        return ctx.diag("PPS108", f"the overlapped pair at step {step} of rank {rank} waits for itself: "
                                        f"{ctx.text(b)} needs {ctx.text(a)}, which runs beside it", rank, step,
                                        help=f"take the pair apart: {ctx.text(a)} first, then {ctx.text(b)}")
    return None


def _help(ctx: Context, cycle: list[Wait]) -> str:
    others = [m for m in CommModel if m is not ctx.model]
    fine = [str(m) for m in others if completes(ctx.program, m, encoded=ctx.enc)]
    move = breaking_move(ctx.program, ctx.model, cycle)
    if move is not None:
        words, completed = move
        text = f"{words}: with that one move the program " + (
            f"runs to the end under `{ctx.model}` (checked)" if completed else
            f"gets past this cycle under `{ctx.model}` (checked; it stops later: lint again for the next move)")
    else:
        text = ("none of the moves of one step on the cycle tried breaks it; reorder so that each rank named reaches the "
                f"operation its peer waits for (the notes) first, or {RELOWER}")
    if fine:
        text = f"the program completes under {' and '.join(f'`{m}`' for m in fine)}; " + text
    return text


# -- shortest dependency cycle (compute-only programs) -----------------------------------------

def _cycle_diag(ctx: Context, cycle: list[tuple[int, bool]]) -> Diagnostic:
    """cycle: [(global index, the edge to the next node is a data dependency)], each node
    waiting for the next, the last for the first."""
    def name(g: int) -> str:
        rank, step = ctx.locate(g)
        return f"{ctx.text(ctx.enc.codes[rank][g & ((1 << SHIFT) - 1)])} (rank {rank}, step {step})"

    text = name(cycle[0][0])
    for j, (_, data) in enumerate(cycle):
        verb = "needs" if data else "runs after"
        nxt = cycle[(j + 1) % len(cycle)][0]
        target = name(nxt) if j + 1 < len(cycle) else ctx.text(ctx.enc.codes[nxt >> SHIFT][nxt & ((1 << SHIFT) - 1)])
        text += f" {verb} {target}" if j == 0 else f", which {verb} {target}"
    rank, step = ctx.locate(cycle[0][0])
    data_hops = sum(1 for _, d in cycle if d)
    return ctx.diag("PPS108", f"dependency cycle: {text}", rank, step,
                    notes=[f"a shortest cycle: {plural(len(cycle), 'action')}, {data_hops} data dependenc{'y' if data_hops == 1 else 'ies'}"],
                    help="reorder a row so that every action's inputs are computed before it")


def shortest_cycle(ctx: Context) -> list[tuple[int, bool]]:
    """A cycle among the actions that never ran, with the fewest data dependencies (0-1 BFS:
    program order costs 0, a data dependency 1), as [(global index, edge into it is data)]."""
    ex = ctx.execution
    assert ex is not None
    enc, pos = ctx.enc, ctx.pos
    needs = enc.needs(False)  # compute-only: the model does not matter
    unfinished: set[int] = set()
    for rank, codes in enumerate(enc.codes):
        ends = ex.ends[rank]
        for i in range(len(codes)):
            if ends[enc.step_of(rank, i)] is None:
                unfinished.add(rank << SHIFT | i)

    def waits_for(g: int) -> list[tuple[int, int]]:
        """(node, cost) pairs: what node g waits for."""
        rank, i = g >> SHIFT, g & ((1 << SHIFT) - 1)
        out: list[tuple[int, int]] = []
        if i > 0 and (g - 1) in unfinished:
            out.append((g - 1, 0))
        for key, _ in needs.of(enc.codes[rank][i]):  # the engine's rule (encoding.Needs)
            for d in producers(key):
                h = pos[d]
                if h >= 0 and h in unfinished:
                    out.append((h, 1))
        return out

    best: list[tuple[int, bool]] = []
    best_cost = 1 << 30
    budget = _SEARCH_BUDGET
    # Stuck heads first: a good cycle is found early, which bounds later searches.
    heads = sorted(unfinished, key=lambda g: (g & ((1 << SHIFT) - 1), g >> SHIFT))
    for start in heads:
        if budget <= 0:
            break
        dist = {start: 0}
        parent: dict[int, tuple[int, bool]] = {}
        dq: deque[int] = deque([start])
        found: tuple[int, int] | None = None  # (node that waits for start, cost)
        while dq and budget > 0:
            u = dq.popleft()
            du = dist[u]
            if du >= best_cost:
                continue
            budget -= 1
            for v, cost in waits_for(u):
                dv = du + cost
                if v == start:
                    if dv >= 1 and (found is None or dv < found[1]):
                        found = (u, dv)
                    continue
                if dv < dist.get(v, 1 << 30) and dv < best_cost:
                    dist[v] = dv
                    parent[v] = (u, cost == 1)
                    if cost == 0:
                        dq.appendleft(v)
                    else:
                        dq.append(v)
        if found is not None and found[1] < best_cost:
            # Rebuild start -> ... -> u (each waits for the next), then u waits for start.
            u, cost = found
            chain = [u]
            while chain[-1] != start:
                chain.append(parent[chain[-1]][0])
            chain.reverse()  # start ... u
            closing_is_data = (start, 0) not in waits_for(u)
            full = [(n, parent[chain[j + 1]][1] if j + 1 < len(chain) else closing_is_data) for j, n in enumerate(chain)]
            best = _compress(full)
            best_cost = cost
    return best


def _compress(cycle: list[tuple[int, bool]]) -> list[tuple[int, bool]]:
    """Drop the steps inside a run of program-order edges: `x runs after y, which runs after
    z` says no more than `x runs after z`. A node goes when both its edges are program order."""
    n = len(cycle)
    return [cycle[j] for j in range(n) if cycle[j - 1][1] or cycle[j][1]]
