"""The critical path of a simulated timeline: the chain of steps that sets the makespan.

Walking back from the step that ends last, each step's start was set by one thing (the rules
are `semantics.py`'s): the data it needed (its producer's end, plus a message time across
ranks in a program without explicit communication) or the previous step of its own rank. A
send or receive under rendezvous that sat blocked until its peer came is explained by the
peer's side; a buffered receive completes when its send has. Ties go to the data dependency, so the path shows
how work flows between ranks rather than only along one rank.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from ..ir import Action, Idle, Kind, Program, actions_of

_Times = Sequence[Sequence[float | None]]
_Key = tuple[int, int, str]  # (stage, microbatch, what)
_Where = tuple[int, int]  # (rank, step index)


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


_MAKES = {Kind.F: ("F",), Kind.B: ("G",), Kind.I: ("G", "I"), Kind.RECV_F: ("RF",), Kind.RECV_B: ("RB",)}
_POSTS = {Kind.SEND_F: "SF", Kind.RECV_F: "RF", Kind.SEND_B: "SB", Kind.RECV_B: "RB"}


def critical_path(program: Program, starts: _Times, ends: _Times, message: float,
                  rendezvous: bool) -> tuple[PathStep, ...]:
    S = program.stages
    placement = program.placement
    with_comms = program.has_comms

    made: dict[_Key, _Where] = {}  # first producer, as in semantics; a send makes its message
    posts: dict[_Key, _Where] = {}
    for rank, row in enumerate(program.rows):
        for index, step in enumerate(row):
            if ends[rank][index] is None:
                continue
            for a in actions_of(step):
                m = a.microbatch
                if m is None:
                    continue
                for what in _MAKES.get(a.kind, ()):
                    made.setdefault((a.stage, m, what), (rank, index))
                post = _POSTS.get(a.kind)
                if post is not None:
                    posts.setdefault((a.stage, m, post), (rank, index))
                    if a.kind.is_send:
                        made.setdefault((a.stage, m, post), (rank, index))

    def deps(a: Action, rank: int) -> list[tuple[_Key, float]]:
        s, k, m = a.stage, a.kind, a.microbatch
        if m is None:
            return []
        if k is Kind.F and s > 0:
            if placement[s - 1] == rank or not with_comms:
                return [((s - 1, m, "F"), 0.0 if placement[s - 1] == rank else message)]
            return [((s, m, "RF"), 0.0)]
        if k is Kind.B or k is Kind.I:
            out: list[tuple[_Key, float]] = [((s, m, "F"), 0.0)]
            if s < S - 1:
                if placement[s + 1] == rank or not with_comms:
                    out.append(((s + 1, m, "G"), 0.0 if placement[s + 1] == rank else message))
                else:
                    out.append(((s, m, "RB"), 0.0))
            return out
        if k is Kind.W:
            return [((s, m, "I"), 0.0)]
        if k is Kind.SEND_F:
            return [((s, m, "F"), 0.0)]
        if k is Kind.SEND_B:
            return [((s, m, "G"), 0.0)]
        if not rendezvous and k.is_recv:  # a buffered receive completes when its send has
            return [(peer(a), 0.0)]
        return []

    def peer(a: Action) -> _Key:
        """The key of the operation a send or receive meets."""
        s, k, m = a.stage, a.kind, a.microbatch
        assert m is not None
        if k is Kind.SEND_F:
            return (s + 1, m, "RF")
        if k is Kind.RECV_F:
            return (s - 1, m, "SF")
        if k is Kind.SEND_B:
            return (s - 1, m, "RB")
        return (s + 1, m, "SB")

    def end_of(p: _Where) -> float:
        e = ends[p[0]][p[1]]
        assert e is not None
        return e

    def previous(rank: int, index: int) -> _Where | None:
        row = program.rows[rank]
        j = index - 1
        while j >= 0 and type(row[j]) is Idle:
            j -= 1
        return (rank, j) if j >= 0 and ends[rank][j] is not None else None

    def binding(rank: int, index: int, at: float) -> _Where | None:
        """The step whose end made this one start at `at`."""
        acts = actions_of(program.rows[rank][index])
        for a in acts:
            for k, delay in deps(a, rank):
                p = made.get(k)
                if p is not None and _close(end_of(p) + delay, at):
                    return p
        return previous(rank, index)

    last: _Where | None = None
    for rank, row_ends in enumerate(ends):
        for index in range(len(row_ends) - 1, -1, -1):
            e = row_ends[index]
            if e is not None:
                if last is None or e > end_of(last):
                    last = (rank, index)
                break

    path: list[_Where] = []
    seen: set[_Where] = set()
    cur = last
    while cur is not None and cur not in seen:
        seen.add(cur)
        path.append(cur)
        rank, index = cur
        start = starts[rank][index]
        assert start is not None
        acts = actions_of(program.rows[rank][index])
        if rendezvous and len(acts) == 1 and acts[0].kind.is_comm and acts[0].microbatch is not None:
            # Blocked from its posting until the peer came: the peer's side explains the end.
            p = posts.get(peer(acts[0]))
            if p is not None and p not in seen and end_of(cur) > start + message and not _close(end_of(cur), start + message):
                cur = p
                continue
        if start <= 0.0:
            break
        cur = binding(rank, index, start)
    path.reverse()
    out = []
    for rank, index in path:
        s, e = starts[rank][index], ends[rank][index]
        assert s is not None and e is not None
        out.append(PathStep(rank, index, str(program.rows[rank][index]), s, e))
    return tuple(out)
