"""What a schedule means when it runs: one definition for the checker, simulator and runtime.

Every rank executes its row in order. A compute action waits for the data it needs; a send or
receive waits according to the communication model:

- `rendezvous`: an operation completes only when its peer operation is posted too (gloo in
  Paddle; NCCL for large messages). A batch's members run one after another, as written.
- `grouped`: a batch's members are posted together and the batch completes once every member
  has met its peer (NCCL's group calls). Operations outside batches behave as in rendezvous.
- `buffered`: a send completes at once; a receive waits for its send (PyTorch's simulator).

Data dependencies (stage s of microbatch m):
- `F(s,m)` needs `F(s-1,m)`;
- `B(s,m)` and `I(s,m)` need `F(s,m)` and the input gradient of stage s+1 (`B` or `I` of s+1);
- `W(s,m)` needs `I(s,m)`.
In a program with communication, a dependency across ranks is carried by the receive on the
consumer's rank (`RECV_F(s,m)` carries F(s-1,m) to stage s; `RECV_B(s,m)` carries the input
gradient of s+1 to stage s), and a send needs the compute that produces what it sends. In a
compute-only program, cross-rank dependencies are implicit: the data arrives a message time
after its producer ends.

`execute` runs a program under a model and a timing, event by event, and returns either the
full timeline or, when it gets stuck, where every unfinished rank waits and on whom: the raw
material of the checker's deadlock and cycle reports.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable

from attrs import frozen

from .ir import Action, Batch, Idle, Kind, Overlap, Program, Step


class CommModel(str, enum.Enum):
    RENDEZVOUS = "rendezvous"
    GROUPED = "grouped"
    BUFFERED = "buffered"

    def __str__(self) -> str:
        return self.value


# Slots of a dependency key: key = ((stage * microbatches) + microbatch) * SLOTS + slot.
F_DONE, GRAD_DONE, I_DONE, RECV_F_DONE, RECV_B_DONE, MSG_F_SENT, MSG_B_SENT = range(7)
SEND_F_POSTED, RECV_F_POSTED, SEND_B_POSTED, RECV_B_POSTED = range(7, 11)
SLOTS = 11
SLOT_NAMES = {
    F_DONE: "F", GRAD_DONE: "B/I", I_DONE: "I", RECV_F_DONE: "RECV_F", RECV_B_DONE: "RECV_B",
    MSG_F_SENT: "SEND_F", MSG_B_SENT: "SEND_B", SEND_F_POSTED: "SEND_F", RECV_F_POSTED: "RECV_F",
    SEND_B_POSTED: "SEND_B", RECV_B_POSTED: "RECV_B",
}


@frozen
class Timing:
    """Durations. `compute(action)`, `overlap(step)` and `message(action)` (one send/receive or
    one implicit hand-off between ranks). The default is unit compute and free messages."""

    compute: Callable[[Action], float] = lambda a: 1.0
    overlap: Callable[[Overlap], float] | None = None
    message: Callable[[Action], float] = lambda a: 0.0

    def overlap_time(self, step: Overlap) -> float:
        if self.overlap is not None:
            return self.overlap(step)
        return max(self.compute(p) for p in step.parts)


UNIT = Timing()


@frozen
class Wait:
    """Rank `rank` is stuck at step `step` (action `action`), waiting for `needs`.

    `on_rank` is the rank that should produce it (None when no rank does), `reason` one of
    "data" (a computed value), "peer" (the matching send or receive is not posted),
    "missing" (nothing in the program produces it).
    """

    rank: int
    step: int
    action: Action
    needs: str
    on_rank: int | None
    reason: str


@frozen
class Execution:
    completed: bool
    # Per rank, per step: start and end times (idle steps and unreached steps are None).
    starts: tuple[tuple[float | None, ...], ...]
    ends: tuple[tuple[float | None, ...], ...]
    waits: tuple[Wait, ...]
    makespan: float


# An op is one thing a rank does in turn: (step index, step, members). For a batch under
# rendezvous/buffered each member is its own op; under grouped the batch is one op.
_Op = tuple[int, Step]


def _ops(row: tuple[Step, ...], grouped: bool) -> list[_Op]:
    ops: list[_Op] = []
    for index, step in enumerate(row):
        t = type(step)
        if t is Idle:
            continue
        if t is Batch and not grouped:
            ops.extend((index, part) for part in step.parts)  # type: ignore[union-attr]
        else:
            ops.append((index, step))
    return ops


def execute(program: Program, model: CommModel | str = CommModel.RENDEZVOUS, timing: Timing = UNIT) -> Execution:
    model = CommModel(model)
    grouped = model is CommModel.GROUPED
    buffered = model is CommModel.BUFFERED
    S, M = program.stages, program.microbatches
    placement = program.placement
    with_comms = program.has_comms
    rows = [_ops(row, grouped) for row in program.rows]
    R = len(rows)
    pc = [0] * R
    ready = [0.0] * R
    starts: list[list[float | None]] = [[None] * len(row) for row in program.rows]
    ends: list[list[float | None]] = [[None] * len(row) for row in program.rows]
    done: dict[int, float] = {}
    posted: dict[int, tuple[int, float]] = {}  # a posted send/receive: key -> (rank, time)
    waiters: dict[int, list[int]] = {}
    blocked_on: list[int] = [-1] * R
    inference = program.mode == "inference"

    def key(stage: int, mb: int, slot: int) -> int:
        return (stage * M + mb) * SLOTS + slot

    def needs(a: Action, rank: int) -> list[tuple[int, float]]:
        """Keys this action waits for, each with the delay added after it is done."""
        s, k, m = a.stage, a.kind, a.microbatch
        if m is None:
            return []
        out: list[tuple[int, float]] = []
        if k is Kind.F:
            if s > 0:
                if placement[s - 1] == rank or not with_comms:
                    out.append((key(s - 1, m, F_DONE), 0.0 if placement[s - 1] == rank else timing.message(a)))
                else:
                    out.append((key(s, m, RECV_F_DONE), 0.0))
        elif k is Kind.B or k is Kind.I:
            out.append((key(s, m, F_DONE), 0.0))
            if s < S - 1:
                if placement[s + 1] == rank or not with_comms:
                    out.append((key(s + 1, m, GRAD_DONE), 0.0 if placement[s + 1] == rank else timing.message(a)))
                else:
                    out.append((key(s, m, RECV_B_DONE), 0.0))
        elif k is Kind.W:
            out.append((key(s, m, I_DONE), 0.0))
        elif k is Kind.SEND_F:
            out.append((key(s, m, F_DONE), 0.0))
        elif k is Kind.SEND_B:
            out.append((key(s, m, GRAD_DONE), 0.0))
        return out

    def finish(a: Action, t: float) -> None:
        s, k, m = a.stage, a.kind, a.microbatch
        if m is None:
            return
        if k is Kind.F:
            _complete(key(s, m, F_DONE), t)
        elif k is Kind.B:
            _complete(key(s, m, GRAD_DONE), t)
        elif k is Kind.I:
            _complete(key(s, m, GRAD_DONE), t)
            _complete(key(s, m, I_DONE), t)
        elif k is Kind.RECV_F:
            _complete(key(s, m, RECV_F_DONE), t)
        elif k is Kind.RECV_B:
            _complete(key(s, m, RECV_B_DONE), t)

    work: deque[int] = deque(range(R))

    def _complete(k: int, t: float) -> None:
        if k not in done:
            done[k] = t
        for r in waiters.pop(k, ()):
            work.append(r)

    def data_ready(a: Action, rank: int) -> float | None:
        """The time a's data is available, or None after registering a wait."""
        t = ready[rank]
        for k, delay in needs(a, rank):
            d = done.get(k)
            if d is None:
                waiters.setdefault(k, []).append(rank)
                blocked_on[rank] = k
                return None
            if d + delay > t:
                t = d + delay
        return t

    def message_keys(a: Action) -> tuple[int, int, int]:
        """(my posted key, peer posted key, sent key) of a send or receive."""
        s, k, m = a.stage, a.kind, a.microbatch
        assert m is not None
        if k is Kind.SEND_F:
            return key(s, m, SEND_F_POSTED), key(s + 1, m, RECV_F_POSTED), key(s, m, MSG_F_SENT)
        if k is Kind.RECV_F:
            return key(s, m, RECV_F_POSTED), key(s - 1, m, SEND_F_POSTED), key(s - 1, m, MSG_F_SENT)
        if k is Kind.SEND_B:
            return key(s, m, SEND_B_POSTED), key(s - 1, m, RECV_B_POSTED), key(s, m, MSG_B_SENT)
        return key(s, m, RECV_B_POSTED), key(s + 1, m, SEND_B_POSTED), key(s + 1, m, MSG_B_SENT)

    def advance(rank: int, index: int, start: float, end: float, requeue: bool = False) -> None:
        if starts[rank][index] is None:
            starts[rank][index] = start
        ends[rank][index] = end
        ready[rank] = end
        pc[rank] += 1
        blocked_on[rank] = -1
        if requeue:  # a rank moved on by another one's progress must look at its next step
            work.append(rank)

    def comm_op(rank: int, index: int, a: Action) -> bool:
        """Try one standalone send/receive; True when it completed."""
        t = data_ready(a, rank)
        if t is None:
            return False
        mine, peer, sent = message_keys(a)
        cost = timing.message(a)
        if buffered:
            if a.kind.is_send:
                advance(rank, index, t, t + cost)
                _complete(sent, t + cost)
                return True
            d = done.get(sent)
            if d is None:
                waiters.setdefault(sent, []).append(rank)
                blocked_on[rank] = sent
                return False
            end = max(t, d)
            advance(rank, index, t, end)
            finish(a, end)
            return True
        other = posted.get(peer)
        if other is None:
            posted[mine] = (rank, t)
            waiters.setdefault(peer, []).append(rank)
            blocked_on[rank] = peer
            for r in waiters.pop(mine, ()):
                work.append(r)
            return False
        peer_rank, peer_t = other
        start = max(t, peer_t)
        end = start + cost
        posted.pop(peer)
        posted.pop(mine, None)
        advance(rank, index, start, end)
        finish(a, end)
        _complete(sent, end)
        if peer_rank != rank and not _in_batch[peer_rank]:
            peer_index = rows[peer_rank][pc[peer_rank]][0]
            peer_action = rows[peer_rank][pc[peer_rank]][1]
            assert isinstance(peer_action, Action)
            advance(peer_rank, peer_index, start, end, requeue=True)
            finish(peer_action, end)
        elif _in_batch[peer_rank]:
            _batch_matched[peer_rank].add(peer)
            work.append(peer_rank)
        return True

    _in_batch = [False] * R
    _batch_matched: list[set[int]] = [set() for _ in range(R)]

    def batch_op(rank: int, index: int, b: Batch) -> bool:
        """Grouped: post every member, complete when every member has met its peer."""
        t = ready[rank]
        for a in b.parts:
            at = data_ready(a, rank)
            if at is None:
                return False
            t = max(t, at)
        if not _in_batch[rank]:
            _in_batch[rank] = True
            for a in b.parts:
                mine, _, _ = message_keys(a)
                posted[mine] = (rank, t)
                for r in waiters.pop(mine, ()):
                    work.append(r)
        start = t
        for a in b.parts:
            mine, peer, _ = message_keys(a)
            other = posted.get(peer)
            if other is None and peer not in _batch_matched[rank] and mine not in _batch_matched[rank]:
                waiters.setdefault(peer, []).append(rank)
                blocked_on[rank] = peer
                return False
            if other is not None:
                start = max(start, other[1])
        cost = max((timing.message(a) for a in b.parts), default=0.0)
        end = start + cost
        _in_batch[rank] = False
        _batch_matched[rank].clear()
        for a in b.parts:
            mine, peer, sent = message_keys(a)
            posted.pop(mine, None)
            other = posted.get(peer)
            finish(a, end)
            _complete(sent, end)
            if other is not None:
                peer_rank = other[0]
                if _in_batch[peer_rank]:
                    _batch_matched[peer_rank].add(mine)
                    _batch_matched[peer_rank].add(peer)
                    work.append(peer_rank)
                else:
                    posted.pop(peer, None)
                    peer_index, peer_action = rows[peer_rank][pc[peer_rank]]
                    assert isinstance(peer_action, Action)
                    advance(peer_rank, peer_index, start, end, requeue=True)
                    finish(peer_action, end)
        advance(rank, index, start, end)
        return True

    while work:
        rank = work.popleft()
        row = rows[rank]
        while pc[rank] < len(row):
            index, step = row[pc[rank]]
            t_step = type(step)
            if t_step is Action:
                a = step
                assert isinstance(a, Action)
                if a.kind.is_comm:
                    if not comm_op(rank, index, a):
                        break
                    continue
                t = data_ready(a, rank)
                if t is None:
                    break
                end = t + (timing.compute(a) if a.kind.is_compute else 0.0)
                advance(rank, index, t, end)
                finish(a, end)
            elif t_step is Overlap:
                assert isinstance(step, Overlap)
                t = ready[rank]
                stuck = False
                for part in step.parts:
                    # Run the parts in the order their own dependencies allow: a part may
                    # need the other (never in a sound schedule, but do not hang on it).
                    pt = data_ready(part, rank)
                    if pt is None:
                        stuck = True
                        break
                    t = max(t, pt)
                if stuck:
                    break
                end = t + timing.overlap_time(step)
                advance(rank, index, t, end)
                for part in step.parts:
                    finish(part, end)
            else:
                assert isinstance(step, Batch)
                if not batch_op(rank, index, step):
                    break
    completed = all(pc[r] >= len(rows[r]) for r in range(R))
    waits: list[Wait] = []
    if not completed:
        producers = _producers(program)
        for r in range(R):
            if pc[r] >= len(rows[r]):
                continue
            index, step = rows[r][pc[r]]
            k = blocked_on[r]
            action = step.parts[0] if isinstance(step, (Overlap, Batch)) else step
            assert isinstance(action, Action)
            waits.append(_describe(r, index, action, k, M, placement, producers, program))
    makespan = max((e for row_ends in ends for e in row_ends if e is not None), default=0.0)
    return Execution(completed, tuple(map(tuple, starts)), tuple(map(tuple, ends)), tuple(waits), makespan)


def _producers(program: Program) -> dict[tuple[int, int, int], int]:
    """(stage, microbatch, slot) -> the rank whose row produces it."""
    out: dict[tuple[int, int, int], int] = {}
    for rank, _, a in program.actions():
        if a.microbatch is None:
            continue
        slots = {Kind.F: (F_DONE,), Kind.B: (GRAD_DONE,), Kind.I: (GRAD_DONE, I_DONE),
                 Kind.RECV_F: (RECV_F_DONE, RECV_F_POSTED), Kind.RECV_B: (RECV_B_DONE, RECV_B_POSTED),
                 Kind.SEND_F: (MSG_F_SENT, SEND_F_POSTED), Kind.SEND_B: (MSG_B_SENT, SEND_B_POSTED)}.get(a.kind, ())
        for slot in slots:
            out.setdefault((a.stage, a.microbatch, slot), rank)
    return out


def describe_key(k: int, microbatches: int) -> tuple[int, int, int, str]:
    """(stage, microbatch, slot, text such as `1RECV_F3`) of a dependency key."""
    base, slot = divmod(k, SLOTS)
    stage, mb = divmod(base, microbatches)
    return stage, mb, slot, f"{stage}{SLOT_NAMES[slot]}{mb}"


def _describe(rank: int, index: int, action: Action, k: int, microbatches: int, placement: tuple[int, ...],
              producers: dict[tuple[int, int, int], int], program: Program) -> Wait:
    if k < 0:  # pragma: no cover - every stuck rank registered what it waits on
        return Wait(rank, index, action, "?", None, "missing")
    stage, mb, slot, text = describe_key(k, microbatches)
    on = producers.get((stage, mb, slot))
    reason = "peer" if slot >= SEND_F_POSTED else "data"
    if on is None:
        reason = "missing"
    return Wait(rank, index, action, text, on, reason)


def wait_cycle(waits: tuple[Wait, ...]) -> list[Wait]:
    """A cycle in the wait-for graph between stuck ranks (each waits on at most one rank)."""
    by_rank = {w.rank: w for w in waits}
    for start in by_rank:
        seen: dict[int, int] = {}
        order: list[Wait] = []
        r: int | None = start
        while r is not None and r in by_rank and r not in seen:
            seen[r] = len(order)
            order.append(by_rank[r])
            r = by_rank[r].on_rank
        if r is not None and r in seen:
            return order[seen[r]:]
    return []
