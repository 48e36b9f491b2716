"""V schedules from a repeating building block, with their warm-up and cool-down reworked for memory.

The zero-bubble authors build their automatic V schedules this way, and it is what beats the
named V schedules at a tight limit: the steady state is a period of six slots a rank, one of
each action of the rank's two chunks (chunk 0, stage r, on the way down; chunk 1, stage
2p-1-r, on the way back): `F0 F1 I1 I0 W1 W0` in some order, the building block. Rank 0's
order is one of the permutations with `F0` first; each later rank's is the one before shifted
by an offset per action (`OFFSETS`: forwards and chunk-1 gradients move on by d slots, the
others back by one), with a first offset for the first `split` ranks and a second one after;
each weight gradient takes the first free slot after its input gradient. Repeated, every
action of microbatch m sits 6m slots after microbatch 0's, and microbatch 0's first slot on
each rank is the first one after its input's. That order alone is V-Min-like; two reworks
make it short under the limit (`k` chunks a rank):

- **Warm-up** (before a rank's first chunk-0 input gradient): rank r fills its memory before
  its first backward: `min(r+1, k//2)` chunk-1 forwards and the rest chunk-0 ones, the
  chunk-0 forwards first (the later a rank, the fewer), then pairs of a chunk-0 and a chunk-1
  forward, then `I1 W1` followed by a forward, chunk 1's first: memory is full, so each
  weight gradient runs at once and frees the room the next forward takes.
- **Cool-down** (after a rank's last forward): its last `(k+1)//2` chunk-0 and last
  `min(r+1, k - (k+1)//2)` chunk-1 input gradients are packed in the order their inputs come
  (chunk 1's from the rank before, one slot later a rank; chunk 0's from the rank after), and
  the weight gradients they leave wait at the end; `gaps.fill_gaps` then pulls them into the
  gaps the gradients leave.

Each order is priced by `replay` under the problem's real costs (the slots only order a rank's
actions), so a block that suits unit costs but not yours is simply a worse candidate.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from itertools import permutations

from ..memory import EPSILON
from .problem import Problem
from .replay import peaks, replay
from .slots import FWD, GRAD, SLOTS, WGT, search_code

PERIOD = 6  # slots in a building block: one of each action of a V rank's two chunks
F0, F1, I1, I0, W1, W0 = range(PERIOD)  # the block's actions, in the order offsets are given
# Per building block position: the chunk (0: stage r, 1: stage 2p-1-r) and the search slot.
CHUNK = (0, 1, 1, 0, 1, 0)
SLOT = (FWD, FWD, GRAD, GRAD, WGT, WGT)
# The offsets from one rank's block to the next's, per F0, F1, I1, I0 (weight gradients follow
# their input gradients): each forward and chunk-1 gradient d slots on, the others one back.
OFFSETS = tuple((d, -1, d, -1) for d in range(1, PERIOD))

Block = tuple[tuple[int, ...], ...]  # per rank, the slot of each of F0 .. W0
Rows = list[list[int]]


def _place_weights(slots: list[int]) -> tuple[int, ...] | None:
    """Each weight gradient in the first slot after its input gradient no action takes."""
    if len(set(slots[:4])) < 4:
        return None
    used = set(slots[:4])
    for grad, weight in ((I1, W1), (I0, W0)):
        for step in range(1, PERIOD):
            x = (slots[grad] + step) % PERIOD
            if x not in used:
                slots[weight] = x
                used.add(x)
                break
    return tuple(slots)


def blocks(ranks: int) -> Iterator[Block]:
    """Every building block: rank 0's permutation, two offsets and where the second begins."""
    for f1, i1, i0 in permutations(range(1, PERIOD), 3):
        first = _place_weights([0, f1, i1, i0, -1, -1])
        assert first is not None
        for a in range(len(OFFSETS)):
            for b in range(a + 1):
                for split in range(1, max(2, ranks)):
                    made = [first]
                    for r in range(1, ranks):
                        offset = OFFSETS[a] if r <= split else OFFSETS[b]
                        moved = _place_weights([(made[-1][k] + offset[k]) % PERIOD for k in range(4)] + [-1, -1])
                        if moved is None:
                            break
                        made.append(moved)
                    else:
                        yield tuple(made)


def _after(slot: int, position: int) -> int:
    """The first slot after `slot` at `position` of the period."""
    x = slot + 1
    return x + (position - x) % PERIOD


class _Rank:
    """The search codes of rank r's six block actions."""

    def __init__(self, problem: Problem, r: int):
        self.stages = (r, 2 * problem.ranks - 1 - r)
        self.M = problem.microbatches

    def code(self, action: int, microbatch: int) -> int:
        return search_code(self.stages[CHUNK[action]] * self.M + microbatch, SLOT[action])

    def action(self, code: int) -> int:
        sm, slot = divmod(code, SLOTS)
        chunk = self.stages.index(sm // self.M)
        return next(a for a in range(PERIOD) if CHUNK[a] == chunk and SLOT[a] == slot)


def repeated(problem: Problem, block: Block) -> Rows:
    """Each rank's order when the block repeats: microbatch 0 of each action in the first slot
    after its input's (or after the rank's own earlier action at the V's turns)."""
    P, M = problem.ranks, problem.microbatches
    first = [[0] * PERIOD for _ in range(P)]
    for r in range(P):
        first[r][F0] = block[0][F0] if r == 0 else _after(first[r - 1][F0], block[r][F0])
    for r in range(P - 1, -1, -1):
        first[r][F1] = _after(first[r][F0] if r == P - 1 else first[r + 1][F1], block[r][F1])
    for r in range(P):
        first[r][I1] = _after(first[r][F1] if r == 0 else first[r - 1][I1], block[r][I1])
    for r in range(P - 1, -1, -1):
        first[r][I0] = _after(first[r][I1] if r == P - 1 else first[r + 1][I0], block[r][I0])
    for r in range(P):
        first[r][W1] = _after(first[r][I1], block[r][W1])
        first[r][W0] = _after(first[r][I0], block[r][W0])
    rows = []
    for r in range(P):
        rank = _Rank(problem, r)
        timed = sorted((first[r][a] + PERIOD * m, rank.code(a, m)) for a in range(PERIOD) for m in range(M))
        rows.append([code for _, code in timed])
    return rows


def _warm_up(rank: _Rank, row: list[int], r: int, ranks: int, k: int) -> list[int]:
    """The rank's actions before its first chunk-0 input gradient, reordered (module docstring)."""
    kinds = [rank.action(c) for c in row]
    cut = kinds.index(I0)
    queue: list[list[int]] = [[] for _ in range(PERIOD)]
    for code, kind in zip(row[:cut], kinds[:cut]):
        queue[kind].append(code)
    want_f1 = min(r + 1, k // 2, rank.M)
    want_f0 = min(k - want_f1, rank.M)
    out: list[int] = []
    taken = {F0: 0, F1: 0}

    def take(kind: int, cap: int | None = None) -> None:
        if queue[kind] and (cap is None or taken[kind] < cap):
            out.append(queue[kind].pop(0))
            if kind in taken:
                taken[kind] += 1

    for _ in range(2 * (ranks - 1 - r)):
        take(F0, want_f0)
    for _ in range(r + 1):
        take(F0, want_f0)
        take(F1, want_f1)
    while any(queue):  # before the first I0 a rank holds only F0, F1, I1 and W1
        take(I1)
        take(W1)
        take(F1 if queue[F1] else F0)
    return out + row[cut:]


def _cool_down(rank: _Rank, row: list[int], r: int, ranks: int, k: int) -> list[int]:
    """The rank's actions after its last forward, reordered (module docstring)."""
    kinds = [rank.action(c) for c in row]
    last = max(j for j, kind in enumerate(kinds) if kind in (F0, F1))
    head, tail, tail_kinds = row[:last + 1], row[last + 1:], kinds[last + 1:]
    n0 = min((k + 1) // 2, rank.M)
    n1 = min(r + 1, k - n0, rank.M)
    late0 = [c for c, kind in zip(tail, tail_kinds) if kind == I0][-n0:] if n0 else []
    late1 = [c for c, kind in zip(tail, tail_kinds) if kind == I1][-n1:] if n1 else []
    weights: list[int] = []
    w0 = w1 = 0
    for code, kind in zip(reversed(tail), reversed(tail_kinds)):
        if w1 >= len(late1) and w0 >= len(late0) and w0 + w1 >= k:
            break
        if kind in (W0, W1):
            weights.append(code)
            w0, w1 = w0 + (kind == W0), w1 + (kind == W1)
    moved = set(late0) | set(late1) | set(weights)
    kept = [c for c in tail if c not in moved]
    # Where their inputs come: chunk 1's one slot later a rank down the pipeline, chunk 0's
    # one slot earlier; two slots apart on a rank (the gradient and its partner chunk's).
    at = [(1 + r - 2 * (len(late1) - 1 - j), c) for j, c in enumerate(late1)]
    at += [(2 * ranks - r - 2 * (len(late0) - 1 - j), c) for j, c in enumerate(late0)]
    grads = [c for _, c in sorted(at)]
    body = head + kept + grads
    position = {c: n for n, c in enumerate(body)}
    held = sorted(weights, key=lambda c: position[c - WGT + GRAD])
    return body + held


def reworked(problem: Problem, rows: Sequence[Sequence[int]]) -> Rows:
    """`repeated` rows with their warm-up and cool-down reworked for the problem's limit."""
    k = int(problem.limit * problem.stages_per_rank + EPSILON)  # the limit in chunks
    out = []
    for r, row in enumerate(rows):
        rank = _Rank(problem, r)
        out.append(_cool_down(rank, _warm_up(rank, list(row), r, problem.ranks, k), r, problem.ranks, k))
    return out


def block_orders(problem: Problem, budget: int, rng: random.Random,
                 stop: Callable[[], bool] = lambda: False) -> tuple[list[tuple[float, Rows]], int]:
    """The reworked orders of up to `budget` building blocks (a sample drawn with `rng` when
    there are more) whose repeated order fits the limit, shortest first, with their
    makespans, and how many blocks were tried (a V problem only; none for a loop). `stop`
    ends the tries early (a time limit)."""
    if problem.stages_per_rank != 2:
        return [], 0
    every = list(blocks(problem.ranks))
    if len(every) > budget:
        every = rng.sample(every, budget)
    limit = problem.limit + EPSILON
    found: list[tuple[float, Rows]] = []
    seen: set[tuple[tuple[int, ...], ...]] = set()
    tried = 0
    for block in every:
        if tried % 64 == 0 and stop():
            break
        tried += 1
        rows = repeated(problem, block)
        if max(peaks(problem, rows)) > limit:
            continue
        rows = reworked(problem, rows)
        key = tuple(tuple(r) for r in rows)
        if key in seen or max(peaks(problem, rows)) > limit:
            continue
        seen.add(key)
        t = replay(problem, rows)
        if t is not None:
            found.append((t, rows))
    found.sort(key=lambda x: x[0])
    return found, tried
