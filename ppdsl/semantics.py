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

`execute` runs a program under a model and a timing, rank by rank as far as each can go, and
returns either the full timeline or, when it gets stuck, where every unfinished rank waits and
on whom: the raw material of the checker's deadlock and cycle reports.

Speed: the engine works on integer codes, `code = (stage * microbatches + mb) << 4 | kind`
(see `encode`), with dependency keys `sm << 3 | slot` into one flat list of completion times,
so a step costs a few list lookups and no allocation. Each rank is woken only when the one
thing it waits for happens, so the run is linear in the number of actions.
"""

from __future__ import annotations

import enum
import weakref
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import cast

from attrs import frozen

from .ir import Action, Batch, Idle, Kind, Overlap, Program, Step, actions_of


class CommModel(str, enum.Enum):
    RENDEZVOUS = "rendezvous"
    GROUPED = "grouped"
    BUFFERED = "buffered"

    def __str__(self) -> str:
        return self.value


MODELS: tuple[str, ...] = tuple(m.value for m in CommModel)

# Kind numbers as plain ints (IntEnum arithmetic is slower on the hot paths).
F, I, W, B = int(Kind.F), int(Kind.I), int(Kind.W), int(Kind.B)
SEND_F, RECV_F, SEND_B, RECV_B = int(Kind.SEND_F), int(Kind.RECV_F), int(Kind.SEND_B), int(Kind.RECV_B)
KIND_OF: tuple[Kind, ...] = tuple(Kind(k) if k < len(Kind) else Kind.F for k in range(16))

# Slots of a dependency key: key = sm << 3 | slot, where sm = stage * microbatches + mb.
F_DONE, GRAD_DONE, I_DONE, RECV_F_DONE, RECV_B_DONE, MSG_F_SENT, MSG_B_SENT = range(7)
_COMM_KINDS = frozenset((SEND_F, RECV_F, SEND_B, RECV_B))
SLOT_NAMES = {F_DONE: "F", GRAD_DONE: "B", I_DONE: "I", RECV_F_DONE: "RECV_F", RECV_B_DONE: "RECV_B",
              MSG_F_SENT: "SEND_F", MSG_B_SENT: "SEND_B"}


def _unit_compute(a: Action) -> float:
    return 1.0


def _no_message(a: Action) -> float:
    return 0.0


@frozen
class Timing:
    """Durations. `compute(action)`, `overlap(step)` and `message(action)` (one send/receive or
    one implicit hand-off between ranks). The default is unit compute and free messages."""

    compute: Callable[[Action], float] = _unit_compute
    overlap: Callable[[Overlap], float] | None = None
    message: Callable[[Action], float] = _no_message

    def overlap_time(self, step: Overlap) -> float:
        if self.overlap is not None:
            return self.overlap(step)
        return max(self.compute(p) for p in step.parts)

    @property
    def is_unit(self) -> bool:
        return self.compute is _unit_compute and self.message is _no_message and self.overlap is None


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


# --------------------------------------------------------------------------------------------
# Encoding


class Encoded:
    """A program as integer codes, one list per rank, one code per action in written order.

    `steps[r][i]` is the step index of action i of rank r (None when every step of the row is
    one plain action, so i is the step). `groups[r]` maps the index of the first action of an
    overlapped pair or a batch to (is_batch, member count). `invalid` lists actions whose
    stage or microbatch is out of range (they get no code).
    """

    __slots__ = ("stages", "microbatches", "codes", "steps", "groups", "invalid", "rows", "_actions")

    def __init__(self, program: Program, codes: list[list[int]] | None = None):
        S, M = program.stages, program.microbatches
        self.stages, self.microbatches = S, M
        self.rows = program.rows
        self.codes: list[list[int]] = []
        self.steps: list[list[int] | None] = []
        self.groups: list[dict[int, tuple[bool, int]]] = []
        self.invalid: list[tuple[int, int, Action]] = []
        self._actions: list[list[Action]] | None = None
        if codes is not None:  # made by someone who built the rows from codes (lowering)
            self.codes = codes
            self.steps = [None] * len(codes)
            self.groups = [{} for _ in codes]
            return
        get_stage, get_mb = attrgetter("stage"), attrgetter("microbatch")
        for rank, row in enumerate(program.rows):
            if row and set(map(type, row)) == {Action}:
                try:
                    stages_ok = 0 <= min(map(get_stage, row)) and max(map(get_stage, row)) < S
                    mbs_ok = 0 <= min(map(get_mb, row)) and max(map(get_mb, row)) < M
                except TypeError:  # a stage-only action (no microbatch): take the careful path
                    stages_ok = mbs_ok = False
                if stages_ok and mbs_ok:
                    plain = cast("tuple[Action, ...]", row)
                    self.codes.append([((a.stage * M + a.microbatch) << 4) + a.kind for a in plain])  # type: ignore[operator]
                    self.steps.append(None)
                    self.groups.append({})
                    continue
            self._careful(rank, row, S, M)

    def _careful(self, rank: int, row: tuple[Step, ...], S: int, M: int) -> None:
        codes: list[int] = []
        steps: list[int] = []
        groups: dict[int, tuple[bool, int]] = {}
        for index, step in enumerate(row):
            t = type(step)
            if t is Idle:
                continue
            parts = actions_of(step)
            if t is not Action:
                groups[len(codes)] = (t is Batch, len(parts))
            for a in parts:
                m = 0 if a.microbatch is None else a.microbatch
                if not (0 <= a.stage < S and 0 <= m < M and 0 <= a.kind < 16):
                    self.invalid.append((rank, index, a))
                    codes.append(-1)
                else:
                    codes.append(((a.stage * M + m) << 4) + a.kind)
                steps.append(index)
        self.codes.append(codes)
        self.steps.append(steps)
        self.groups.append(groups)

    def step_of(self, rank: int, i: int) -> int:
        steps = self.steps[rank]
        return i if steps is None else steps[i]

    def action(self, rank: int, i: int) -> Action:
        """The Action object behind code i of a rank (for messages and timing callbacks)."""
        if self._actions is None:
            self._actions = [[a for s in row for a in actions_of(s)] for row in self.rows]
        return self._actions[rank][i]

    def describe(self, code: int) -> str:
        """`0SEND_F3`-style text of a code."""
        sm, k = code >> 4, code & 15
        stage, mb = divmod(sm, self.microbatches)
        kind = KIND_OF[k]
        return f"{stage}{kind.name}" if kind.stage_only else f"{stage}{kind.name}{mb}"


# The last few encodings made, by program identity: check() then lower() then check() of the
# lowered program (the CLI's and the benchmark's path) encode each program once. A weak
# reference guards against a recycled id().
_REMEMBERED: dict[int, tuple[weakref.ref[Program], Encoded]] = {}


def remember(program: Program, enc: Encoded) -> None:
    """Record the encoding of `program` (lowering builds it alongside the rows)."""
    while len(_REMEMBERED) >= 4:
        _REMEMBERED.pop(next(iter(_REMEMBERED)))
    _REMEMBERED[id(program)] = (weakref.ref(program), enc)


def encode(program: Program) -> Encoded:
    hit = _REMEMBERED.get(id(program))
    if hit is not None and hit[0]() is program:
        return hit[1]
    enc = Encoded(program)
    remember(program, enc)
    return enc


def peer_code(code: int, microbatches: int) -> int:
    """The code of the operation a send or receive meets: SEND_F(s,m) <-> RECV_F(s+1,m), and
    SEND_B(s,m) <-> RECV_B(s-1,m)."""
    k = code & 15
    sm = code >> 4
    if k == SEND_F:
        return ((sm + microbatches) << 4) | RECV_F
    if k == RECV_F:
        return ((sm - microbatches) << 4) | SEND_F
    if k == SEND_B:
        return ((sm - microbatches) << 4) | RECV_B
    return ((sm + microbatches) << 4) | SEND_B


def _out_key(code: int) -> int:
    """The dependency key a send or receive completes."""
    k = code & 15
    sm = code >> 4
    if k == RECV_F:
        return (sm << 3) | RECV_F_DONE
    if k == RECV_B:
        return (sm << 3) | RECV_B_DONE
    if k == SEND_F:
        return (sm << 3) | MSG_F_SENT
    return (sm << 3) | MSG_B_SENT


# --------------------------------------------------------------------------------------------
# The engine


def execute(program: Program, model: CommModel | str = CommModel.RENDEZVOUS, timing: Timing = UNIT,
            encoded: Encoded | None = None) -> Execution:
    """Run `program` under `model` with durations from `timing`.

    Pass `encoded` when the caller already has `encode(program)` (the checker does). Programs
    with out-of-range actions are not runnable: check them first.
    """
    model = CommModel(model)
    enc = encoded if encoded is not None else encode(program)
    if enc.invalid:
        raise ValueError("the program has out-of-range actions; check() reports them")
    return _Engine(program, enc, model, timing).run()


class _Engine:
    def __init__(self, program: Program, enc: Encoded, model: CommModel, timing: Timing):
        self.program = program
        self.enc = enc
        self.model = model
        self.timing = timing

    def run(self) -> Execution:  # noqa: C901 - one hot loop, kept flat on purpose
        program, enc, timing = self.program, self.enc, self.timing
        S, M = program.stages, program.microbatches
        placement = program.placement
        R = len(enc.codes)
        grouped = self.model is CommModel.GROUPED
        buffered = self.model is CommModel.BUFFERED
        with_comms = any(not _COMM_KINDS.isdisjoint({c & 15 for c in row}) for row in enc.codes)
        unit = timing.is_unit
        compute_time = timing.compute
        message_time = timing.message
        action_of = enc.action

        # Per stage: does its neighbour live on the same rank (a local hand-off)?
        local_prev = [s > 0 and placement[s - 1] == placement[s] for s in range(S)]
        local_next = [s < S - 1 and placement[s + 1] == placement[s] for s in range(S)]
        last = S - 1
        # Per (stage, microbatch): offset from `sm << 3` to the key a forward waits for, and to
        # the gradient key a backward waits for (None: no such dependency); *_implicit marks
        # a hand-off between ranks with no receive (compute-only programs: a message time).
        f_off: list[int | None] = []
        f_implicit: list[bool] = []
        b_off: list[int | None] = []
        b_implicit: list[bool] = []
        for s in range(S):
            if s == 0:
                fo: int | None = None
                fi = False
            elif local_prev[s] or not with_comms:
                fo, fi = -(M << 3) | F_DONE, not local_prev[s]
            else:
                fo, fi = RECV_F_DONE, False
            if s == last:
                bo: int | None = None
                bi = False
            elif local_next[s] or not with_comms:
                bo, bi = (M << 3) | GRAD_DONE, not local_next[s]
            else:
                bo, bi = RECV_B_DONE, False
            f_off += [fo] * M
            f_implicit += [fi] * M
            b_off += [bo] * M
            b_implicit += [bi] * M

        # Per kind of send/receive: the code of its peer is `code + peer_delta[kind]`; it waits
        # for the key `(sm << 3) + need_off[kind]` (None: nothing) and completes `out_slot`.
        peer_delta = [0] * 16
        peer_delta[SEND_F], peer_delta[RECV_F] = (M << 4) + 1, -(M << 4) - 1
        peer_delta[SEND_B], peer_delta[RECV_B] = -(M << 4) + 1, (M << 4) - 1
        need_off: list[int | None] = [None] * 16
        need_off[SEND_F], need_off[SEND_B] = F_DONE, GRAD_DONE
        if buffered:
            need_off[RECV_F], need_off[RECV_B] = -(M << 3) + MSG_F_SENT, (M << 3) + MSG_B_SENT
        out_slot = [0] * 16
        out_slot[SEND_F], out_slot[RECV_F], out_slot[SEND_B], out_slot[RECV_B] = MSG_F_SENT, RECV_F_DONE, MSG_B_SENT, RECV_B_DONE

        done = [-1.0] * (S * M * 8)
        posted: dict[int, tuple[int, float]] = {}  # code of a posted send/receive -> (rank, time)
        waiters: dict[int, list[int]] = {}  # dependency key -> ranks waiting for it
        pc = [0] * R
        ready = [0.0] * R
        starts: list[list[float | None]] = [[None] * len(row) for row in program.rows]
        ends: list[list[float | None]] = [[None] * len(row) for row in program.rows]
        blocked: list[tuple[str, int, int]] = [("", -1, -1)] * R  # (reason, key or code, action index)
        pending = [0] * R  # grouped: members of the current batch still waiting for their peer
        batch_end = [0.0] * R
        work: deque[int] = deque(range(R))
        codes_of, steps_of, groups_of = enc.codes, enc.steps, enc.groups

        def wake(key: int) -> None:
            ws = waiters.pop(key, None)
            if ws:
                work.extend(ws)

        def finish_peer(pr: int, pcode: int, start: float, end: float) -> None:
            """The peer of a just-matched pair completes too (it was posted and blocked)."""
            ok = _out_key(pcode)
            if done[ok] < 0:
                done[ok] = end
            if pending[pr]:
                pending[pr] -= 1
                if end > batch_end[pr]:
                    batch_end[pr] = end
                if pending[pr] == 0:
                    i0 = pc[pr]
                    count = groups_of[pr][i0][1]
                    st = steps_of[pr]
                    step = i0 if st is None else st[i0]
                    if starts[pr][step] is None:
                        starts[pr][step] = ready[pr]
                    ends[pr][step] = batch_end[pr]
                    ready[pr] = batch_end[pr]
                    pc[pr] = i0 + count
                    work.append(pr)
                if waiters:
                    wake(ok)
                return
            i0 = pc[pr]
            st = steps_of[pr]
            step = i0 if st is None else st[i0]
            if starts[pr][step] is None:
                starts[pr][step] = start
            ends[pr][step] = end
            ready[pr] = end
            pc[pr] = i0 + 1
            work.append(pr)
            if waiters:
                wake(ok)

        def needs(code: int) -> tuple[int, float, int, float]:
            """The (up to two) dependency keys of a compute action or send, with delays."""
            k = code & 15
            sm = code >> 4
            # A delay of -1.0 marks an implicit hand-off between ranks (compute-only programs):
            # it costs a message time.
            if k == F:
                s = sm // M
                if s == 0:
                    return -1, 0.0, -1, 0.0
                if local_prev[s]:
                    return ((sm - M) << 3) | F_DONE, 0.0, -1, 0.0
                if with_comms:
                    return (sm << 3) | RECV_F_DONE, 0.0, -1, 0.0
                return ((sm - M) << 3) | F_DONE, -1.0, -1, 0.0
            if k == B or k == I:
                s = sm // M
                if s == last:
                    return (sm << 3) | F_DONE, 0.0, -1, 0.0
                if local_next[s]:
                    return (sm << 3) | F_DONE, 0.0, ((sm + M) << 3) | GRAD_DONE, 0.0
                if with_comms:
                    return (sm << 3) | F_DONE, 0.0, (sm << 3) | RECV_B_DONE, 0.0
                return (sm << 3) | F_DONE, 0.0, ((sm + M) << 3) | GRAD_DONE, -1.0
            if k == W:
                return (sm << 3) | I_DONE, 0.0, -1, 0.0
            if k == SEND_F:
                return (sm << 3) | F_DONE, 0.0, -1, 0.0
            if k == SEND_B:
                return (sm << 3) | GRAD_DONE, 0.0, -1, 0.0
            if buffered and k == RECV_F:
                return ((sm - M) << 3) | MSG_F_SENT, 0.0, -1, 0.0
            if buffered and k == RECV_B:
                return ((sm + M) << 3) | MSG_B_SENT, 0.0, -1, 0.0
            return -1, 0.0, -1, 0.0

        while work:
            r = work.popleft()
            codes = codes_of[r]
            n = len(codes)
            i = pc[r]
            if i >= n or pending[r]:
                continue
            steps = steps_of[r]
            groups = groups_of[r]
            row_starts, row_ends = starts[r], ends[r]
            t = ready[r]
            while i < n:
                c = codes[i]
                if groups and i in groups:
                    is_batch, count = groups[i]
                    if is_batch and not grouped:
                        pass  # members run one after another: fall through to the plain path
                    else:
                        # An overlapped pair, or a batch under `grouped`: every member's data
                        # first, then the members together.
                        t0 = t
                        stuck = False
                        for j in range(i, i + count):
                            k1, d1, k2, d2 = needs(codes[j])
                            for key, delay in ((k1, d1), (k2, d2)):
                                if key < 0:
                                    continue
                                d = done[key]
                                if d < 0:
                                    waiters.setdefault(key, []).append(r)
                                    blocked[r] = ("data", key, j)
                                    stuck = True
                                    break
                                if delay < 0:
                                    delay = 0.0 if unit else message_time(action_of(r, j))
                                if d + delay > t0:
                                    t0 = d + delay
                            if stuck:
                                break
                        if stuck:
                            break
                        step = i if steps is None else steps[i]
                        if not is_batch:
                            st = program.rows[r][step]
                            assert isinstance(st, Overlap)
                            end = t0 + (1.0 if unit else timing.overlap_time(st))
                            for j in range(i, i + count):
                                cj = codes[j]
                                self._finish(cj, end, done)
                                if waiters:
                                    for key in _compute_outputs(cj):
                                        wake(key)
                            row_starts[step] = t0
                            row_ends[step] = end
                            t = end
                            i += count
                            continue
                        # A grouped batch: post every member; match those whose peer waits.
                        pending[r] = count
                        batch_end[r] = t0
                        for j in range(i, i + count):
                            cj = codes[j]
                            pcode = peer_code(cj, M)
                            other = posted.pop(pcode, None)
                            if other is None:
                                posted[cj] = (r, t0)
                                if blocked[r][0] != "peer":
                                    blocked[r] = ("peer", pcode, j)
                                continue
                            pr, pt = other
                            start = t0 if t0 > pt else pt
                            end = start + (0.0 if unit else message_time(action_of(r, j)))
                            ok = _out_key(cj)
                            if done[ok] < 0:
                                done[ok] = end
                            if end > batch_end[r]:
                                batch_end[r] = end
                            pending[r] -= 1
                            if waiters:
                                wake(ok)
                            finish_peer(pr, pcode, start, end)
                        if pending[r]:
                            pc[r] = i
                            ready[r] = t
                            row_starts[step] = t0
                            i = -1  # parked: finish_peer completes the batch
                            break
                        row_starts[step] = t0
                        row_ends[step] = batch_end[r]
                        t = batch_end[r]
                        blocked[r] = ("", -1, -1)
                        i += count
                        continue
                k = c & 15
                if k <= B:  # compute: F, I, W, B (inlined: this is the hot path)
                    base = (c >> 4) << 3
                    sm = c >> 4
                    t0 = t
                    if k == F:
                        off = f_off[sm]
                        if off is not None:
                            d = done[base + off]
                            if d < 0:
                                waiters.setdefault(base + off, []).append(r)
                                blocked[r] = ("data", base + off, i)
                                break
                            if not unit and f_implicit[sm]:
                                d += message_time(action_of(r, i))
                            if d > t0:
                                t0 = d
                        end = t0 + (1.0 if unit else compute_time(action_of(r, i)))
                        done[base] = end
                        if waiters and base in waiters:
                            work.extend(waiters.pop(base))
                    elif k == W:
                        d = done[base | I_DONE]
                        if d < 0:
                            waiters.setdefault(base | I_DONE, []).append(r)
                            blocked[r] = ("data", base | I_DONE, i)
                            break
                        if d > t0:
                            t0 = d
                        end = t0 + (1.0 if unit else compute_time(action_of(r, i)))
                    else:  # B or I: its forward, and the gradient from the next stage
                        d = done[base]
                        if d < 0:
                            waiters.setdefault(base, []).append(r)
                            blocked[r] = ("data", base, i)
                            break
                        if d > t0:
                            t0 = d
                        off = b_off[sm]
                        if off is not None:
                            d = done[base + off]
                            if d < 0:
                                waiters.setdefault(base + off, []).append(r)
                                blocked[r] = ("data", base + off, i)
                                break
                            if not unit and b_implicit[sm]:
                                d += message_time(action_of(r, i))
                            if d > t0:
                                t0 = d
                        end = t0 + (1.0 if unit else compute_time(action_of(r, i)))
                        done[base | GRAD_DONE] = end
                        if waiters and (base | GRAD_DONE) in waiters:
                            work.extend(waiters.pop(base | GRAD_DONE))
                        if k == I:
                            done[base | I_DONE] = end
                            if waiters and (base | I_DONE) in waiters:
                                work.extend(waiters.pop(base | I_DONE))
                    step = i if steps is None else steps[i]
                    row_starts[step] = t0
                    row_ends[step] = end
                    t = end
                    i += 1
                    continue
                if k > RECV_B:  # UNSHARD, RESHARD, REDUCE_GRAD: no data flow, no time
                    step = i if steps is None else steps[i]
                    if row_starts[step] is None:
                        row_starts[step] = t
                    row_ends[step] = t
                    i += 1
                    continue
                # A send or receive on its own (or a batch member outside `grouped`).
                base = (c >> 4) << 3
                t0 = t
                off = need_off[k]
                if off is not None:
                    d = done[base + off]
                    if d < 0:
                        waiters.setdefault(base + off, []).append(r)
                        blocked[r] = ("data", base + off, i)
                        break
                    if d > t0:
                        t0 = d
                step = i if steps is None else steps[i]
                if buffered:
                    end = t0 + (0.0 if unit or k == RECV_F or k == RECV_B else message_time(action_of(r, i)))
                    ok = base | out_slot[k]
                    done[ok] = end
                    if waiters and ok in waiters:
                        work.extend(waiters.pop(ok))
                else:
                    pcode = c + peer_delta[k]
                    other = posted.pop(pcode, None)
                    if other is None:
                        posted[c] = (r, t0)
                        blocked[r] = ("peer", pcode, i)
                        if row_starts[step] is None:
                            row_starts[step] = t0
                        break
                    pr, pt = other
                    end = (t0 if t0 > pt else pt) + (0.0 if unit else message_time(action_of(r, i)))
                    ok = base | out_slot[k]
                    done[ok] = end
                    if waiters and ok in waiters:
                        work.extend(waiters.pop(ok))
                    if pending[pr]:
                        finish_peer(pr, pcode, t0, end)
                    else:  # the usual case, inlined: the peer was parked on this very operation
                        i0 = pc[pr]
                        st_p = steps_of[pr]
                        ends[pr][i0 if st_p is None else st_p[i0]] = end
                        ready[pr] = end
                        pc[pr] = i0 + 1
                        work.append(pr)
                        ok = ((pcode >> 4) << 3) | out_slot[pcode & 15]
                        done[ok] = end
                        if waiters and ok in waiters:
                            work.extend(waiters.pop(ok))
                if row_starts[step] is None:
                    row_starts[step] = t0
                row_ends[step] = end
                t = end
                i += 1
            if i >= 0:
                pc[r] = i
                ready[r] = t
                if i >= n:
                    blocked[r] = ("", -1, -1)

        completed = all(pc[r] >= len(codes_of[r]) for r in range(R))
        waits = () if completed else tuple(self._waits(pc, blocked, pending, posted))
        makespan = max((_last_end(row_ends) for row_ends in ends), default=0.0)
        return Execution(completed, tuple(map(tuple, starts)), tuple(map(tuple, ends)), waits, makespan)

    @staticmethod
    def _finish(code: int, end: float, done: list[float]) -> None:
        for key in _compute_outputs(code):
            if done[key] < 0:
                done[key] = end

    def _waits(self, pc: list[int], blocked: list[tuple[str, int, int]], pending: list[int],
               posted: dict[int, tuple[int, float]]) -> list[Wait]:
        enc = self.enc
        where: dict[int, int] = {}  # code -> rank whose row holds it
        for rank, codes in enumerate(enc.codes):
            for c in codes:
                where.setdefault(c, rank)
        out = []
        for r, codes in enumerate(enc.codes):
            if pc[r] >= len(codes):
                continue
            reason, key, index = blocked[r]
            index = pc[r] if index < 0 else index
            action = enc.action(r, index)
            step = enc.step_of(r, pc[r])
            if reason == "peer" and pending[r]:
                # A parked batch: name a member that has not met its peer yet.
                base = pc[r]
                for j in range(base, base + enc.groups[r][base][1]):
                    if codes[j] in posted:
                        key, action = peer_code(codes[j], enc.microbatches), enc.action(r, j)
                        break
            if reason == "peer":
                on = where.get(key)
                out.append(Wait(r, step, action, enc.describe(key), on, "peer" if on is not None else "missing"))
                continue
            # A data key: the action that completes it.
            sm, slot = key >> 3, key & 7
            producer_kinds = {F_DONE: (F,), GRAD_DONE: (B, I), I_DONE: (I,), RECV_F_DONE: (RECV_F,),
                              RECV_B_DONE: (RECV_B,), MSG_F_SENT: (SEND_F,), MSG_B_SENT: (SEND_B,)}[slot]
            on = None
            text = enc.describe((sm << 4) | producer_kinds[0])
            for k in producer_kinds:
                if ((sm << 4) | k) in where:
                    on = where[(sm << 4) | k]
                    text = enc.describe((sm << 4) | k)
                    break
            out.append(Wait(r, step, action, text, on, "data" if on is not None else "missing"))
        return out


def _last_end(row_ends: list[float | None]) -> float:
    # Ends never decrease along a row, so the last one reached is the row's latest.
    for e in reversed(row_ends):
        if e is not None:
            return e
    return 0.0


def _compute_outputs(code: int) -> tuple[int, ...]:
    k = code & 15
    sm3 = (code >> 4) << 3
    if k == F:
        return (sm3 | F_DONE,)
    if k == B:
        return (sm3 | GRAD_DONE,)
    if k == I:
        return (sm3 | GRAD_DONE, sm3 | I_DONE)
    return ()


def describe_key(key: int, microbatches: int) -> tuple[int, int, int, str]:
    """(stage, microbatch, slot, text such as `1RECV_F3`) of a dependency key."""
    sm, slot = key >> 3, key & 7
    stage, mb = divmod(sm, microbatches)
    return stage, mb, slot, f"{stage}{SLOT_NAMES[slot]}{mb}"


def wait_cycle(waits: tuple[Wait, ...] | list[Wait]) -> list[Wait]:
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
