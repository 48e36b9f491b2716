"""The critical path of a simulated timeline: the chain of steps that sets the makespan.

Walking back from the step that ends last, each step's start was set by one thing (the rules
are `semantics.py`'s): the data it needed (its producer's end, plus a message time across
ranks in a program without explicit communication) or the previous step of its own rank. A
send or receive under rendezvous that sat blocked until its peer came is explained by the
peer's side; a buffered receive completes when its send has. Ties go to the data dependency,
so the path shows how work flows between ranks rather than only along one rank.

Producers are found through the program's integer codes (`semantics.encode`): one table,
code -> where it first ran, built by C-level passes; the walk itself touches only the steps
on the path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from attrs import frozen

from ..ir import Action, Idle, Kind, Program, actions_of
from ..semantics import Encoded, encode

_Times = Sequence[Sequence[float | None]]

_SHIFT = 32  # a place is `rank << _SHIFT | step`
_LOW = (1 << _SHIFT) - 1
_COMM = frozenset((Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B))


@frozen
class PathStep:
    """One step on the critical path: rank, step index, what it runs, when."""

    rank: int
    step: int
    text: str
    start: float
    end: float


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _places(enc: Encoded, ends: _Times, size: int) -> list[int]:
    """code -> the place of its first occurrence (rank by rank, in row order) among the steps
    that ran to their end, or -1: the producer the engine used."""
    where = [-1] * size
    setter = where.__setitem__
    for rank in range(len(enc.codes) - 1, -1, -1):
        codes, steps, row_ends = enc.codes[rank], enc.steps[rank], ends[rank]
        base = rank << _SHIFT
        if steps is None:  # one action per step, run in order: the ended steps are a prefix
            n = list(row_ends).index(None) if None in row_ends else len(row_ends)
            deque(map(setter, reversed(codes[:n]), range(base + n - 1, base - 1, -1)), maxlen=0)
            continue
        for i in range(len(codes) - 1, -1, -1):
            if row_ends[steps[i]] is not None and codes[i] >= 0:
                where[codes[i]] = base | steps[i]
    return where


def critical_path(program: Program, starts: _Times, ends: _Times, message: float,
                  rendezvous: bool) -> tuple[PathStep, ...]:
    S, M = program.stages, program.microbatches
    placement = program.placement
    enc = encode(program)
    with_comms = not enc.kinds.isdisjoint(_COMM)
    size = S * M * 16
    where = _places(enc, ends, size)

    def made(code: int) -> int:
        """Where what `code` names was made; a `B` code stands for "the gradient", made by the
        first `B` or `I` of that stage and microbatch."""
        if not 0 <= code < size:
            return -1
        p = where[code]
        if code & 15 == Kind.B:
            q = where[code - Kind.B + Kind.I]
            if q >= 0 and (p < 0 or q < p):
                return q
        return p

    def peer(a: Action) -> int:
        """The code of the operation a send or receive meets on its link (-1: none)."""
        assert a.microbatch is not None
        code = enc.meets(((a.stage * M + a.microbatch) << 4) | a.kind)
        return code if 0 <= code < size else -1

    def deps(a: Action, rank: int) -> list[tuple[int, float]]:
        """(code of what it waits for, delay), as in semantics."""
        s, k, m = a.stage, a.kind, a.microbatch
        if m is None:
            return []
        sm = s * M + m
        if k is Kind.F and s > 0:
            if placement[s - 1] == rank or not with_comms:
                return [(((sm - M) << 4) | Kind.F, 0.0 if placement[s - 1] == rank else message)]
            return [((sm << 4) | Kind.RECV_F, 0.0)]
        if k is Kind.B or k is Kind.I:
            out: list[tuple[int, float]] = [((sm << 4) | Kind.F, 0.0)]
            if s < S - 1:
                if placement[s + 1] == rank or not with_comms:
                    out.append((((sm + M) << 4) | Kind.B, 0.0 if placement[s + 1] == rank else message))
                else:
                    out.append(((sm << 4) | Kind.RECV_B, 0.0))
            return out
        if k is Kind.W:
            return [((sm << 4) | Kind.I, 0.0)]
        if k is Kind.SEND_F:
            return [((sm << 4) | Kind.F, 0.0)]
        if k is Kind.SEND_B:
            return [((sm << 4) | Kind.B, 0.0)]
        if not rendezvous and k.is_recv:  # a buffered receive completes when its send has
            return [(peer(a), 0.0)]
        return []

    def end_of(p: int) -> float:
        e = ends[p >> _SHIFT][p & _LOW]
        assert e is not None
        return e

    def previous(rank: int, index: int) -> int:
        row = program.rows[rank]
        j = index - 1
        while j >= 0 and type(row[j]) is Idle:
            j -= 1
        return (rank << _SHIFT) | j if j >= 0 and ends[rank][j] is not None else -1

    def binding(rank: int, index: int, at: float) -> int:
        """The step whose end made this one start at `at`."""
        for a in actions_of(program.rows[rank][index]):
            for code, delay in deps(a, rank):
                p = made(code)
                if p >= 0 and _close(end_of(p) + delay, at):
                    return p
        return previous(rank, index)

    last = -1
    for rank, row_ends in enumerate(ends):
        for index in range(len(row_ends) - 1, -1, -1):
            e = row_ends[index]
            if e is not None:
                if last < 0 or e > end_of(last):
                    last = (rank << _SHIFT) | index
                break

    path: list[int] = []
    seen: set[int] = set()
    cur = last
    while cur >= 0 and cur not in seen:
        seen.add(cur)
        path.append(cur)
        rank, index = cur >> _SHIFT, cur & _LOW
        start = starts[rank][index]
        assert start is not None
        acts = actions_of(program.rows[rank][index])
        if rendezvous and len(acts) == 1 and acts[0].kind.is_comm and acts[0].microbatch is not None:
            # Blocked from its posting until the peer came: the peer's side explains the end.
            code = peer(acts[0])
            p = where[code] if code >= 0 else -1
            if p >= 0 and p not in seen and end_of(cur) > start + message and not _close(end_of(cur), start + message):
                cur = p
                continue
        if start <= 0.0:
            break
        cur = binding(rank, index, start)
    path.reverse()
    out = []
    for place in path:
        rank, index = place >> _SHIFT, place & _LOW
        s, e = starts[rank][index], ends[rank][index]
        assert s is not None and e is not None
        out.append(PathStep(rank, index, str(program.rows[rank][index]), s, e))
    return tuple(out)
