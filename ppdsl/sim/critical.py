"""The critical path of a simulated timeline: the chain of steps that sets the makespan.

Walking back from the step that ends last, each step's start was set by one thing (the rules
are the engine's, read from the same table, `encoding.Needs`): the data it needed (its producer's end, plus a message time across
ranks in a program without explicit communication), the previous step of its own rank, or a
copy on the rank's copy lane (a reload its backward waited for). A
send or receive under rendezvous that sat blocked until its peer came is explained by the
peer's side; a buffered receive completes when its send has. Ties go to the data dependency,
so the path shows how work flows between ranks rather than only along one rank.

Producers are found through the program's integer codes (`encoding.encode`): one table,
code -> where it first ran, built by C-level passes; the walk itself touches only the steps
on the path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from attrs import frozen

from ..ir import Action, Idle, Kind, Program, actions_of
from ..encoding import LOW as _LOW, SHIFT as _SHIFT, Encoded, code as code_at, code_of, code_space, encode, producers
from ..kinds import TABLE

_Times = Sequence[Sequence[float | None]]


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
    enc = encode(program)
    size = code_space(S, M)
    where = _places(enc, ends, size)

    needs = enc.needs(not rendezvous)  # what each code waits for: the engine's own table

    def made(key: int) -> int:
        """Where what `key` stands for was completed: the first of its producers that ran (a
        gradient by the `B` or the `I`), or -1."""
        places = [where[c] for c in producers(key) if 0 <= c < size and where[c] >= 0]
        return min(places, default=-1)

    def peer(a: Action) -> int:
        """The code of the operation a send or receive meets on its link (-1: none)."""
        assert a.microbatch is not None
        code = enc.meets(code_of(a, M))
        return code if 0 <= code < size else -1

    def deps(a: Action) -> list[tuple[int, float]]:
        """(key it waits for, delay): the engine's rule (`encoding.Needs`), with a message
        time where an input crosses ranks with no receive."""
        if a.microbatch is None:
            return []
        return [(key, message if crosses else 0.0) for key, crosses in needs.of(code_of(a, M))]

    def end_of(p: int) -> float:
        e = ends[p >> _SHIFT][p & _LOW]
        assert e is not None
        return e

    # Per rank, (stage, index) of each compute -> the index of its stage's last UNSHARD before
    # it: what a compute waits for on the lane (none in a program without one).
    gathers: list[dict[tuple[int, int], int]] = []
    if any(type(step) is Action and step.kind is Kind.UNSHARD for row in program.rows for step in row):
        for row in program.rows:
            latest: dict[int, int] = {}
            found: dict[tuple[int, int], int] = {}
            for index, step in enumerate(row):
                if type(step) is Action:
                    if step.kind is Kind.UNSHARD:
                        latest[step.stage] = index
                    elif step.stage in latest:
                        found[(step.stage, index)] = latest[step.stage]
            gathers.append(found)

    def previous(rank: int, index: int, at: float) -> int:
        """The step before it on its rank: the last one on the compute lane, unless a copy (an
        offload or reload, on the copy lane beside it) ended at `at` and held it: the reload of
        a backward's own activations, or the copy before a copy on the lane."""
        row = program.rows[rank]
        step = row[index]
        held = -1
        if type(step) is Action and step.microbatch is not None and step.kind.value in TABLE.after_reload:
            for k in TABLE.reloads:
                c = code_at(step.stage, step.microbatch, Kind(k), M)
                p = where[c] if 0 <= c < size else -1
                if p >= 0 and p >> _SHIFT == rank and (p & _LOW) < index and _close(end_of(p), at):
                    held = p
        if gathers and type(step) is Action and step.kind.is_compute and not step.kind.on_copy_lane:
            j = gathers[rank].get((step.stage, index), -1)  # the gather of its stage's weights, on the lane
            if j >= 0:
                e = ends[rank][j]
                if e is not None and _close(e, at):
                    held = (rank << _SHIFT) | j
        copy = type(step) is Action and step.kind.on_copy_lane
        last = -1
        j = index - 1
        while j >= 0:  # the nearest step on the compute lane, and for a copy the copy before it
            s = row[j]
            if type(s) is not Idle and ends[rank][j] is not None:
                on_copy = type(s) is Action and s.kind.on_copy_lane
                if on_copy and copy:
                    if _close(end_of((rank << _SHIFT) | j), at):
                        held = (rank << _SHIFT) | j
                    copy = False
                elif not on_copy and last < 0:
                    last = (rank << _SHIFT) | j
                if last >= 0 and not copy:
                    break
            j -= 1
        return held if held >= 0 else last

    def binding(rank: int, index: int, at: float) -> int:
        """The step whose end made this one start at `at`."""
        for a in actions_of(program.rows[rank][index]):
            for key, delay in deps(a):
                p = made(key)
                if p >= 0 and _close(end_of(p) + delay, at):
                    return p
        return previous(rank, index, at)

    last = -1
    lanes = any(type(step) is Action and step.kind.on_copy_lane for row in program.rows for step in row)
    for rank, row_ends in enumerate(ends):
        for index in range(len(row_ends) - 1, -1, -1):
            e = row_ends[index]
            if e is not None:
                if last < 0 or e > end_of(last):
                    last = (rank << _SHIFT) | index
                # The row's last step on the compute lane ends the compute lane; a copy lane's
                # step anywhere in the row may end later (a gradient reduction).
                if not lanes:
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
