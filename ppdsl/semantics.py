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
so a step costs a few list lookups. Each rank is woken only when the one thing it waits for
happens, so the run is linear in the number of actions. Times are kept per action (a step's
are derived at the end); durations come from a table read by code (`Timing.from_table`) or,
for callbacks, are looked up once per action before the run. `completes` answers "does it run
to the end?" by the same rules without any times.
"""

from __future__ import annotations

import enum
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import add, and_, attrgetter, eq, floordiv, lshift, or_, rshift
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
    one implicit hand-off between ranks). The default is unit compute and free messages.

    When the durations are that simple, `table` (per stage, indexed by Kind value: the compute
    times) and `fixed_message` hold them as plain numbers, and the engine reads those instead
    of calling `compute` and `message` once per action (`Timing.from_table` fills both forms,
    so they agree)."""

    compute: Callable[[Action], float] = _unit_compute
    overlap: Callable[[Overlap], float] | None = None
    message: Callable[[Action], float] = _no_message
    table: tuple[tuple[float, ...], ...] | None = None
    fixed_message: float | None = None

    @classmethod
    def from_table(cls, table: Sequence[Sequence[float]], message: float = 0.0,
                   overlap: Callable[[Overlap], float] | None = None) -> Timing:
        """Compute times per stage and Kind value (`table[stage][kind]`), one message time."""
        rows = tuple(tuple(float(x) for x in row) for row in table)
        msg = float(message)

        def compute(a: Action) -> float:
            row = rows[a.stage] if 0 <= a.stage < len(rows) else ()
            return row[a.kind] if a.kind < len(row) else 0.0

        def fixed(a: Action) -> float:
            return msg

        return cls(compute, overlap, fixed, rows, msg)

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

    __slots__ = ("stages", "microbatches", "placement", "codes", "steps", "groups", "invalid", "rows", "_actions",
                 "_kinds", "_links")

    def __init__(self, program: Program, codes: list[list[int]] | None = None, kinds: frozenset[int] | None = None):
        S, M = program.stages, program.microbatches
        self.stages, self.microbatches = S, M
        self.placement = program.placement
        self.rows = program.rows
        self._links: Links | None = None
        self.codes: list[list[int]] = []
        self.steps: list[list[int] | None] = []
        self.groups: list[dict[int, tuple[bool, int]]] = []
        self.invalid: list[tuple[int, int, Action]] = []
        self._actions: list[list[Action]] | None = None
        self._kinds: frozenset[int] | None = None
        if codes is not None:  # made by someone who built the rows from codes (lowering), with their kinds
            self._kinds = kinds
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
        return self.actions_of_rank(rank)[i]

    def actions_of_rank(self, rank: int) -> list[Action]:
        """The Action objects of a rank, one per code."""
        if self._actions is None:
            self._actions = [[a for s in row for a in actions_of(s)] for row in self.rows]
        return self._actions[rank]

    @property
    def kinds(self) -> frozenset[int]:
        """The kinds of action (Kind values) the program uses."""
        if self._kinds is None:
            found: set[int] = set()
            for codes in self.codes:
                found.update(map(and_, codes, repeat(15)))
            found.discard(15)  # the -1 of an out-of-range action
            self._kinds = frozenset(found)
        return self._kinds

    @property
    def links(self) -> Links:
        """Which operation each send and receive meets on its link (see `Links`)."""
        if self._links is None:
            self._links = Links(self)
        return self._links

    def meets(self, code: int) -> int:
        """The code of the operation a send or receive `code` meets on its link (NO_PEER: none)."""
        exceptions = self.links.meets
        named = peer_code(code, self.microbatches)
        return named if exceptions is None else exceptions.get(code, named)

    def describe(self, code: int) -> str:
        """`0SEND_F3`-style text of a code."""
        sm, k = code >> 4, code & 15
        stage, mb = divmod(sm, self.microbatches)
        kind = KIND_OF[k]
        return f"{stage}{kind.name}" if kind.stage_only else f"{stage}{kind.name}{mb}"


# A send or receive with nothing to meet on its link (more sends than receives on it): its
# peer is a code no rank ever posts, so it waits forever.
NO_PEER = -1
_IS_COMM = tuple(SEND_F <= k <= RECV_B for k in range(16))
_IS_SEND = tuple(k in (SEND_F, SEND_B) for k in range(16))
_IS_RECV = tuple(k in (RECV_F, RECV_B) for k in range(16))


def _named_deltas(M: int) -> list[int]:
    """Per kind: `code + delta[kind]` is the operation a send or receive names as its peer."""
    delta = [0] * 16
    delta[SEND_F], delta[RECV_F] = (M << 4) + 1, -(M << 4) - 1
    delta[SEND_B], delta[RECV_B] = -(M << 4) + 1, (M << 4) - 1
    return delta


class Links:
    """The matching rule of every transport and model: on each directed link (sender rank,
    receiver rank) the k-th receive posted takes the k-th message sent, whatever its label.
    Paddle's send/recv and `batch_isend_irecv` on gloo and NCCL carry no tag. A rank posts its
    operations in row order and a batch its members as written, so the k-th of each is fixed
    by the text: forward activations and backward gradients that go the same way on a link
    (a V placement) share its order.

    `order[(src, dst)]` holds (the link's send codes in src's row order, its receive codes in
    dst's row order). `meets` is None when on every link the k-th send is the peer the k-th
    receive names (`peer_code`): matching by position and by name agree, and the engine's
    arithmetic stands. Otherwise `meets` maps each code whose partner on the link differs from
    the named one to that partner (NO_PEER: none), and `mismatches` gives, per such link, the
    first position where they differ: (src, dst, k, send code, receive code), NO_PEER for the
    side that has run out.
    """

    __slots__ = ("order", "meets", "mismatches")

    def __init__(self, enc: Encoded):
        S, M = enc.stages, enc.microbatches
        placement = enc.placement
        # Per `stage << 4 | kind` of a send or receive: the rank at the other end (-1: none).
        other = [-1] * (S << 4)
        for s in range(S):
            if s + 1 < S:
                other[s << 4 | SEND_F] = other[s << 4 | RECV_B] = placement[s + 1]
            if s > 0:
                other[s << 4 | RECV_F] = other[s << 4 | SEND_B] = placement[s - 1]
        self.order: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        for r, codes in enumerate(enc.codes):
            comm = list(compress(codes, map(_IS_COMM.__getitem__, map(and_, codes, repeat(15)))))
            if not comm:
                continue
            kinds = list(map(and_, comm, repeat(15)))
            stages = map(floordiv, map(rshift, comm, repeat(4)), repeat(M))
            ends = list(map(other.__getitem__, map(or_, map(lshift, stages, repeat(4)), kinds)))
            sending = list(map(_IS_SEND.__getitem__, kinds))
            receiving = list(map(_IS_RECV.__getitem__, kinds))
            for o in set(ends):
                if o < 0:
                    continue  # to or from a stage outside the pipeline: PPS207
                here = list(map(eq, ends, repeat(o)))
                sent = list(compress(comm, map(and_, here, sending)))
                got = list(compress(comm, map(and_, here, receiving)))
                if sent:
                    self.order.setdefault((r, o), ([], []))[0].extend(sent)
                if got:
                    self.order.setdefault((o, r), ([], []))[1].extend(got)
        delta = _named_deltas(M)
        self.meets: dict[int, int] | None = None
        self.mismatches: list[tuple[int, int, int, int, int]] = []
        for (src, dst), (sent, got) in sorted(self.order.items()):
            named = list(map(add, sent, map(delta.__getitem__, map(and_, sent, repeat(15)))))
            if named == got:
                continue
            meets: dict[int, int] = self.meets if self.meets is not None else {}
            self.meets = meets
            n = max(len(sent), len(got))
            first = next((k for k in range(n) if k >= len(sent) or k >= len(got) or named[k] != got[k]), n)
            self.mismatches.append((src, dst, first, sent[first] if first < len(sent) else NO_PEER,
                                    got[first] if first < len(got) else NO_PEER))
            for k in range(first, n):
                sc = sent[k] if k < len(sent) else NO_PEER
                rc = got[k] if k < len(got) else NO_PEER
                if sc != NO_PEER and rc != sc + delta[sc & 15]:
                    meets[sc] = rc
                if rc != NO_PEER and sc != rc + delta[rc & 15]:
                    meets[rc] = sc


def sent_key(send: int) -> int:
    """The key a send completes (in `buffered`, what the receive it meets waits for)."""
    if send < 0:
        return -1  # NO_PEER: the last padding key, which nothing completes
    return ((send >> 4) << 3) | (MSG_F_SENT if send & 15 == SEND_F else MSG_B_SENT)


def received_key(recv: int) -> int:
    """The key a receive completes when it meets its send."""
    return ((recv >> 4) << 3) | (RECV_F_DONE if recv & 15 == RECV_F else RECV_B_DONE)


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
    """The code of the operation a send or receive names as its peer: SEND_F(s,m) <->
    RECV_F(s+1,m), and SEND_B(s,m) <-> RECV_B(s-1,m). On a link whose order agrees with the
    labels it is also the one it meets (`Encoded.meets` answers in general)."""
    k = code & 15
    sm = code >> 4
    if k == SEND_F:
        return ((sm + microbatches) << 4) | RECV_F
    if k == RECV_F:
        return ((sm - microbatches) << 4) | SEND_F
    if k == SEND_B:
        return ((sm - microbatches) << 4) | RECV_B
    return ((sm + microbatches) << 4) | SEND_B


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


def completes(program: Program, model: CommModel | str = CommModel.RENDEZVOUS, encoded: Encoded | None = None) -> bool:
    """Whether `program` runs to the end under `model`: `execute(...).completed`, without the
    times (whether a run finishes does not depend on durations).

    The same rules as `execute`, tracking only which keys are done and which operations are
    posted; the checker asks this of every program with communication, and `execute` only
    when the answer is no (to explain where it stops). Rows with overlapped pairs or batches
    take `execute` itself."""
    model = CommModel(model)
    enc = encoded if encoded is not None else encode(program)
    if enc.invalid:
        raise ValueError("the program has out-of-range actions; check() reports them")
    if any(enc.groups) or any(steps is not None for steps in enc.steps):
        return _Engine(program, enc, model, UNIT).run().completed
    return _completes_plain(enc, program.placement, model is CommModel.BUFFERED)


def _completes_plain(enc: Encoded, placement: tuple[int, ...], buffered: bool) -> bool:  # noqa: C901 - one hot loop
    S, M = enc.stages, enc.microbatches
    R = len(enc.codes)
    with_comms = not enc.kinds.isdisjoint(_COMM_KINDS)
    f_off, b_off, _, _ = _offsets(S, M, placement, with_comms)
    peer_delta = _named_deltas(M)
    need_off: list[int | None] = [None] * 16
    need_off[SEND_F], need_off[SEND_B] = F_DONE, GRAD_DONE
    if buffered:
        need_off[RECV_F], need_off[RECV_B] = -(M << 3) + MSG_F_SENT, (M << 3) + MSG_B_SENT
    out_slot = [0] * 16
    out_slot[SEND_F], out_slot[RECV_F], out_slot[SEND_B], out_slot[RECV_B] = MSG_F_SENT, RECV_F_DONE, MSG_B_SENT, RECV_B_DONE
    recv_off = _recv_offsets(M)
    # Where a link's order differs from the labels: who meets whom (None: the labels say).
    meets = enc.links.meets if with_comms else None
    done = bytearray((S * M + M) << 3)  # 1 once a key is complete; padded as in the engine
    posted: dict[int, int] = {}  # code of a posted send/receive -> its rank
    waiters: dict[int, list[int]] = {}
    codes_of = enc.codes
    pc = [0] * R
    work: deque[int] = deque(range(R))
    popleft, push, extend = work.popleft, work.append, work.extend
    while work:
        r = popleft()
        i = pc[r]
        codes = codes_of[r]
        n = len(codes)
        while i < n:
            c = codes[i]
            k = c & 15
            if k <= B:
                sm = c >> 4
                base = sm << 3
                if k == F:
                    off = f_off[sm]
                    if off is not None and not done[base + off]:
                        waiters.setdefault(base + off, []).append(r)
                        break
                elif not done[base + I_DONE if k == W else base]:  # W needs its I; B and I their F
                    key = base + I_DONE if k == W else base
                    waiters.setdefault(key, []).append(r)
                    break
                elif k != W:
                    off = b_off[sm]
                    if off is not None and not done[base + off]:
                        waiters.setdefault(base + off, []).append(r)
                        break
                    base += GRAD_DONE
                if k != W:
                    done[base] = 1
                    if waiters and base in waiters:
                        extend(waiters.pop(base))
                    if k == I:
                        done[base + 1] = 1  # I_DONE
                        if waiters and base + 1 in waiters:
                            extend(waiters.pop(base + 1))
                i += 1
                continue
            if k > RECV_B:  # UNSHARD, RESHARD, REDUCE_GRAD
                i += 1
                continue
            base = (c >> 4) << 3
            off = need_off[k]
            if off is not None:
                key = base + off
                if meets is not None and k & 1:  # a buffered receive waits for the send it meets
                    key = sent_key(meets.get(c, c + peer_delta[k]))
                if not done[key]:
                    waiters.setdefault(key, []).append(r)
                    break
            if buffered:
                base |= out_slot[k]
            else:
                pcode = c + peer_delta[k]
                if meets is not None:
                    pcode = meets.get(c, pcode)
                pr = posted.pop(pcode, None)
                if pr is None:
                    posted[c] = r
                    break
                pc[pr] += 1  # the peer was parked on this very operation
                push(pr)
                # The pair's receive completes (a send's key matters only when buffered).
                base = base + recv_off[k] if meets is None else received_key(c if k & 1 else pcode)
            done[base] = 1
            if waiters and base in waiters:
                extend(waiters.pop(base))
            i += 1
        pc[r] = i
    return all(pc[r] >= len(codes_of[r]) for r in range(R))


def _recv_offsets(M: int) -> list[int]:
    """Per kind of send/receive: the offset from `(code >> 4) << 3` to the key the receive of
    its pair completes (its own for a receive; its peer's for a send)."""
    off = [0] * 16
    off[RECV_F], off[RECV_B] = RECV_F_DONE, RECV_B_DONE
    off[SEND_F], off[SEND_B] = (M << 3) + RECV_F_DONE, -(M << 3) + RECV_B_DONE
    return off


def _offsets(S: int, M: int, placement: tuple[int, ...], with_comms: bool
             ) -> tuple[list[int | None], list[int | None], list[bool], list[bool]]:
    """Per (stage, microbatch) `sm`: the offset from `sm << 3` to the key a forward waits for,
    and to the gradient key a backward waits for (None: no such dependency); per stage,
    whether that input crosses ranks with no receive (compute-only programs: the hand-off
    costs a message time). Lists of shared small objects: the loop reads them in order."""
    f_off: list[int | None] = []
    b_off: list[int | None] = []
    f_hop = [False] * S
    b_hop = [False] * S
    for s in range(S):
        fo: int | None = None
        bo: int | None = None
        if s > 0:
            if placement[s - 1] == placement[s] or not with_comms:
                fo, f_hop[s] = -(M << 3) | F_DONE, placement[s - 1] != placement[s]
            else:
                fo = RECV_F_DONE
        if s < S - 1:
            if placement[s + 1] == placement[s] or not with_comms:
                bo, b_hop[s] = (M << 3) | GRAD_DONE, placement[s + 1] != placement[s]
            else:
                bo = RECV_B_DONE
        f_off += [fo] * M
        b_off += [bo] * M
    return f_off, b_off, f_hop, b_hop


class _Engine:
    def __init__(self, program: Program, enc: Encoded, model: CommModel, timing: Timing):
        self.program = program
        self.enc = enc
        self.model = model
        self.timing = timing
        self.meets: dict[int, int] | None = None  # set by run(): the link partners it used

    def _durations(self, with_comms: bool, f_hop: list[bool], b_hop: list[bool]
                   ) -> tuple[list[float], int, list[float] | None, list[float] | None]:
        """Durations as the loop reads them, `dur[code & mask]`: per Kind value (mask 15) when
        every stage has the same, else per action code (mask -1): a compute's time, a send's
        or receive's message time. And per code, the message time an implicit hand-off adds
        before a forward (hop1) or a backward (hop2) in a compute-only program (None: none)."""
        enc, timing = self.enc, self.timing
        S, M = enc.stages, enc.microbatches
        SM = S * M
        needs_hops = not with_comms and (any(f_hop) or any(b_hop))
        hop1: list[float] | None = None
        hop2: list[float] | None = None
        if timing.is_unit:
            return [1.0] * 4 + [0.0] * 12, 15, None, None
        if timing.table is not None and timing.fixed_message is not None:
            msg = timing.fixed_message
            rows = [tuple(float(x) for x in (timing.table[s] if s < len(timing.table) else ()))[:4] for s in range(S)]
            rows = [row + (0.0,) * (4 - len(row)) for row in rows]
            if needs_hops and msg:
                hop1, hop2 = [0.0] * (SM << 4), [0.0] * (SM << 4)
                for s in range(S):
                    c0, c1 = (s * M) << 4, ((s + 1) * M) << 4
                    if f_hop[s]:
                        hop1[c0 + F:c1:16] = [msg] * M
                    if b_hop[s]:
                        hop2[c0 + B:c1:16] = hop2[c0 + I:c1:16] = [msg] * M
            if len(set(rows)) <= 1:  # the same on every stage: a table of 16
                return list(rows[0] if rows else (0.0,) * 4) + [msg] * 4 + [0.0] * 8, 15, hop1, hop2
            dur = [0.0] * (SM << 4)
            for s, row in enumerate(rows):
                c0, c1 = (s * M) << 4, ((s + 1) * M) << 4
                for k in (F, I, W, B):
                    if row[k]:
                        dur[c0 + k:c1:16] = [row[k]] * M
            if msg:
                every = [msg] * SM
                for k in (SEND_F, RECV_F, SEND_B, RECV_B):
                    dur[k::16] = every
            return dur, -1, hop1, hop2
        # The callback form: one call per action, made here rather than in the run.
        compute, message = timing.compute, timing.message
        dur = [0.0] * (SM << 4)
        if needs_hops:
            hop1, hop2 = [0.0] * (SM << 4), [0.0] * (SM << 4)
        for r, codes in enumerate(enc.codes):
            for c, a in zip(codes, enc.actions_of_rank(r)):
                k = c & 15
                if k <= B:
                    dur[c] = compute(a)
                    if hop1 is not None and hop2 is not None:
                        s = a.stage
                        if k == F and f_hop[s]:
                            hop1[c] = message(a)
                        elif k != F and k != W and b_hop[s]:
                            hop2[c] = message(a)
                elif k <= RECV_B:
                    dur[c] = message(a)
        return dur, -1, hop1, hop2

    def run(self) -> Execution:  # noqa: C901 - one hot loop, kept flat on purpose
        program, enc, timing = self.program, self.enc, self.timing
        S, M = enc.stages, enc.microbatches
        R = len(enc.codes)
        grouped = self.model is CommModel.GROUPED
        buffered = self.model is CommModel.BUFFERED
        with_comms = not enc.kinds.isdisjoint(_COMM_KINDS)
        unit = timing.is_unit
        f_off, b_off, f_hop, b_hop = _offsets(S, M, program.placement, with_comms)
        dur, dmask, hop1, hop2 = self._durations(with_comms, f_hop, b_hop)

        # Per kind of send/receive: the code of its peer is `code + peer_delta[kind]`; it waits
        # for the key `(sm << 3) + need_off[kind]` (None: nothing) and completes `out_slot`.
        peer_delta = _named_deltas(M)
        need_off: list[int | None] = [None] * 16
        need_off[SEND_F], need_off[SEND_B] = F_DONE, GRAD_DONE
        if buffered:
            need_off[RECV_F], need_off[RECV_B] = -(M << 3) + MSG_F_SENT, (M << 3) + MSG_B_SENT
        out_slot = [0] * 16
        out_slot[SEND_F], out_slot[RECV_F], out_slot[SEND_B], out_slot[RECV_B] = MSG_F_SENT, RECV_F_DONE, MSG_B_SENT, RECV_B_DONE
        recv_off = _recv_offsets(M)
        # Where a link's order differs from the labels: who meets whom (None: the labels say).
        meets = enc.links.meets if with_comms else None
        self.meets = meets

        # Completion time per key (-1: not yet). M microbatches' worth of keys past the end
        # that nothing writes: the input of a send or receive to a stage outside the pipeline
        # lands there (a negative key wraps around to them) and never completes.
        done = [-1.0] * ((S * M + M) << 3)
        posted: dict[int, tuple[int, float]] = {}  # code of a posted send/receive -> (rank, time)
        waiters: dict[int, list[int]] = {}  # dependency key -> ranks waiting for it
        codes_of, groups_of = enc.codes, enc.groups
        pc = [0] * R
        ready = [0.0] * R
        # Per rank, per action (not per step: no step lookup in the loop): start and end.
        starts: list[list[float | None]] = [[None] * len(codes) for codes in codes_of]
        ends: list[list[float | None]] = [[None] * len(codes) for codes in codes_of]
        pending = [0] * R  # grouped: members of the current batch still waiting for their peer
        batch_end = [0.0] * R
        work: deque[int] = deque(range(R))
        popleft, push, extend = work.popleft, work.append, work.extend

        def wake(key: int) -> None:
            ws = waiters.pop(key, None)
            if ws:
                extend(ws)

        def finish_peer(pr: int, pcode: int, start: float, end: float) -> None:
            """The peer of a just-matched pair completes too (it was posted and blocked)."""
            ok = ((pcode >> 4) << 3) | out_slot[pcode & 15]
            if done[ok] < 0:
                done[ok] = end
            if pending[pr]:
                pending[pr] -= 1
                if end > batch_end[pr]:
                    batch_end[pr] = end
                if pending[pr] == 0:  # the whole batch is done: it ends when its last member does
                    i0 = pc[pr]
                    count = groups_of[pr][i0][1]
                    ends[pr][i0:i0 + count] = [batch_end[pr]] * count
                    ready[pr] = batch_end[pr]
                    pc[pr] = i0 + count
                    push(pr)
            else:
                i0 = pc[pr]
                if starts[pr][i0] is None:
                    starts[pr][i0] = start
                ends[pr][i0] = end
                ready[pr] = end
                pc[pr] = i0 + 1
                push(pr)
            if waiters:
                wake(ok)

        def deps_of(c: int) -> list[tuple[int, float]]:
            return _deps_of(c, f_off, b_off, need_off, hop1, hop2, meets)

        while work:
            r = popleft()
            i = pc[r]
            codes = codes_of[r]
            n = len(codes)
            if i >= n or pending[r]:
                continue
            groups = groups_of[r]
            st, en = starts[r], ends[r]
            t = ready[r]
            while i < n:
                c = codes[i]
                if groups and i in groups:
                    is_batch, count = groups[i]
                    if not is_batch or grouped:
                        # An overlapped pair, or a batch under `grouped`: every member's data
                        # first, then the members together.
                        t0 = t
                        stuck = False
                        for j in range(i, i + count):
                            for key, delay in deps_of(codes[j]):
                                d = done[key]
                                if d < 0:
                                    waiters.setdefault(key, []).append(r)
                                    stuck = True
                                    break
                                if d + delay > t0:
                                    t0 = d + delay
                            if stuck:
                                break
                        if stuck:
                            break
                        if not is_batch:
                            pair = program.rows[r][enc.step_of(r, i)]
                            assert isinstance(pair, Overlap)
                            end = t0 + (1.0 if unit else timing.overlap_time(pair))
                            for j in range(i, i + count):
                                cj = codes[j]
                                for key in _compute_outputs(cj):
                                    if done[key] < 0:
                                        done[key] = end
                                    if waiters:
                                        wake(key)
                                st[j] = t0
                                en[j] = end
                            t = end
                            i += count
                            continue
                        # A grouped batch: post every member; match those whose peer waits.
                        pc[r] = i
                        pending[r] = count
                        batch_end[r] = t0
                        st[i:i + count] = [t0] * count
                        for j in range(i, i + count):
                            cj = codes[j]
                            kj = cj & 15
                            pcode = cj + peer_delta[kj]
                            if meets is not None:
                                pcode = meets.get(cj, pcode)
                            other = posted.pop(pcode, None)
                            if other is None:
                                posted[cj] = (r, t0)
                                continue
                            pr, pt = other
                            start = t0 if t0 > pt else pt
                            end = start + dur[cj & dmask]
                            ok = ((cj >> 4) << 3) | out_slot[kj]
                            if done[ok] < 0:
                                done[ok] = end
                            if end > batch_end[r]:
                                batch_end[r] = end
                            pending[r] -= 1
                            if waiters:
                                wake(ok)
                            finish_peer(pr, pcode, start, end)
                        if pending[r]:
                            ready[r] = t
                            i = -1  # parked: finish_peer completes the batch
                            break
                        t = batch_end[r]
                        en[i:i + count] = [t] * count
                        i += count
                        continue
                k = c & 15
                if k <= B:  # compute: F, I, W, B (inlined: this is the hot path)
                    sm = c >> 4
                    base = sm << 3
                    t0 = t
                    if k == F:
                        off = f_off[sm]
                        if off is not None:
                            d = done[base + off]
                            if d < 0:
                                waiters.setdefault(base + off, []).append(r)
                                break
                            if hop1 is not None:
                                d += hop1[c]
                            if d > t0:
                                t0 = d
                        end = t0 + dur[c & dmask]
                        done[base] = end
                        if waiters and base in waiters:
                            extend(waiters.pop(base))
                    elif k == W:
                        d = done[base | I_DONE]
                        if d < 0:
                            waiters.setdefault(base | I_DONE, []).append(r)
                            break
                        if d > t0:
                            t0 = d
                        end = t0 + dur[c & dmask]
                    else:  # B or I: its forward, and the gradient from the next stage
                        d = done[base]
                        if d < 0:
                            waiters.setdefault(base, []).append(r)
                            break
                        if d > t0:
                            t0 = d
                        off = b_off[sm]
                        if off is not None:
                            d = done[base + off]
                            if d < 0:
                                waiters.setdefault(base + off, []).append(r)
                                break
                            if hop2 is not None:
                                d += hop2[c]
                            if d > t0:
                                t0 = d
                        end = t0 + dur[c & dmask]
                        base |= GRAD_DONE
                        done[base] = end
                        if waiters and base in waiters:
                            extend(waiters.pop(base))
                        if k == I:
                            base += 1  # I_DONE
                            done[base] = end
                            if waiters and base in waiters:
                                extend(waiters.pop(base))
                    st[i] = t0
                    en[i] = end
                    t = end
                    i += 1
                    continue
                if k > RECV_B:  # UNSHARD, RESHARD, REDUCE_GRAD: no data flow, no time
                    st[i] = en[i] = t
                    i += 1
                    continue
                # A send or receive on its own (or a batch member outside `grouped`).
                base = (c >> 4) << 3
                t0 = t
                off = need_off[k]
                if off is not None:
                    key = base + off
                    if meets is not None and k & 1:  # a buffered receive waits for the send it meets
                        key = sent_key(meets.get(c, c + peer_delta[k]))
                    d = done[key]
                    if d < 0:
                        waiters.setdefault(key, []).append(r)
                        break
                    if d > t0:
                        t0 = d
                if buffered:
                    end = t0 if k & 1 else t0 + dur[c & dmask]  # a receive takes no time once its send is done
                    base |= out_slot[k]
                    done[base] = end
                    if waiters and base in waiters:
                        extend(waiters.pop(base))
                else:
                    pcode = c + peer_delta[k]
                    if meets is not None:
                        pcode = meets.get(c, pcode)
                    other = posted.pop(pcode, None)
                    if other is None:
                        posted[c] = (r, t0)
                        st[i] = t0
                        break
                    pr, pt = other
                    end = (t0 if t0 > pt else pt) + dur[c & dmask]
                    # The pair's receive completes (a send's key matters only when buffered).
                    base = base + recv_off[k] if meets is None else received_key(c if k & 1 else pcode)
                    done[base] = end
                    if waiters and base in waiters:
                        extend(waiters.pop(base))
                    if pending[pr]:
                        finish_peer(pr, pcode, t0, end)
                    else:  # the usual case, inlined: the peer was parked on this very operation
                        i0 = pc[pr]
                        ends[pr][i0] = end
                        ready[pr] = end
                        pc[pr] = i0 + 1
                        push(pr)
                st[i] = t0
                en[i] = end
                t = end
                i += 1
            if i >= 0:
                pc[r] = i
                ready[r] = t

        completed = all(pc[r] >= len(codes_of[r]) for r in range(R))
        waits = () if completed else tuple(self._waits(pc, pending, posted, f_off, b_off, need_off, done))
        step_starts, step_ends = self._per_step(starts, ends)
        makespan = max(map(_last_end, step_ends), default=0.0)
        return Execution(completed, step_starts, step_ends, waits, makespan)

    def _per_step(self, starts: list[list[float | None]], ends: list[list[float | None]]
                  ) -> tuple[tuple[tuple[float | None, ...], ...], tuple[tuple[float | None, ...], ...]]:
        """Per-action times -> per-step times: a step starts when its first action does and
        ends when its last one does; idle steps have neither."""
        enc = self.enc
        out_s: list[tuple[float | None, ...]] = []
        out_e: list[tuple[float | None, ...]] = []
        for r, (st, en) in enumerate(zip(starts, ends)):
            steps = enc.steps[r]
            if steps is None:
                out_s.append(tuple(st))
                out_e.append(tuple(en))
                continue
            n = len(self.program.rows[r])
            s_out: list[float | None] = [None] * n
            e_out: list[float | None] = [None] * n
            for i, step in enumerate(steps):
                if s_out[step] is None:
                    s_out[step] = st[i]
                e_out[step] = en[i]
            out_s.append(tuple(s_out))
            out_e.append(tuple(e_out))
        return tuple(out_s), tuple(out_e)

    def _waits(self, pc: list[int], pending: list[int], posted: dict[int, tuple[int, float]],
               f_off: list[int | None], b_off: list[int | None], need_off: list[int | None],
               done: list[float]) -> list[Wait]:
        """Where each unfinished rank waits, and for what: worked out after the run from where
        it stopped (the loop keeps no record of it)."""
        enc = self.enc
        M = enc.microbatches
        grouped = self.model is CommModel.GROUPED
        where: dict[int, int] = {}  # code -> rank whose row holds it
        for rank, codes in enumerate(enc.codes):
            for c in codes:
                where.setdefault(c, rank)
        out = []
        for r, codes in enumerate(enc.codes):
            i = pc[r]
            if i >= len(codes):
                continue
            group = enc.groups[r].get(i)
            members = range(i, i + group[1]) if group is not None and (not group[0] or grouped) else range(i, i + 1)
            reason, key, index = "", -1, i
            if pending[r]:
                # A parked batch: name a member that has not met its peer yet.
                j = next((j for j in members if codes[j] in posted), i)
                reason, key, index = "peer", enc.meets(codes[j]), j
            else:
                for j in members:
                    waiting = [key for key, _ in _deps_of(codes[j], f_off, b_off, need_off, None, None, self.meets)
                               if done[key] < 0]
                    if waiting:
                        reason, key, index = "data", waiting[0], j
                        break
                else:
                    j = next((j for j in members if (codes[j] & 15) in _COMM_KINDS), i)
                    reason, key, index = "peer", enc.meets(codes[j]), j
            action = enc.action(r, index)
            step = enc.step_of(r, i)
            if reason == "peer":
                if key == NO_PEER:  # nothing left on the link to meet: name the labelled peer
                    key = peer_code(codes[index], M)
                on = where.get(key)
                out.append(Wait(r, step, action, enc.describe(key), on, "peer" if on is not None else "missing"))
                continue
            if key < 0:  # a buffered receive with no send left on its link (NO_PEER)
                out.append(Wait(r, step, action, enc.describe(peer_code(codes[index], M)), None, "missing"))
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


def _deps_of(c: int, f_off: list[int | None], b_off: list[int | None], need_off: list[int | None],
             hop1: list[float] | None, hop2: list[float] | None, meets: dict[int, int] | None
             ) -> list[tuple[int, float]]:
    """(key, implicit message time) of each dependency of action code c, as the loop sees them
    (`meets`: the link partners that differ from the labelled ones, as in the loop)."""
    k, sm = c & 15, c >> 4
    base = sm << 3
    out: list[tuple[int, float]] = []
    if k == F:
        if f_off[sm] is not None:
            out.append((base + f_off[sm], 0.0 if hop1 is None else hop1[c]))  # type: ignore[operator]
    elif k == W:
        out.append((base | I_DONE, 0.0))
    elif k == B or k == I:
        out.append((base, 0.0))
        if b_off[sm] is not None:
            out.append((base + b_off[sm], 0.0 if hop2 is None else hop2[c]))  # type: ignore[operator]
    elif k < 16 and need_off[k] is not None:
        if meets is not None and k & 1 and c in meets:  # a buffered receive: the send it meets
            out.append((sent_key(meets[c]), 0.0))
        else:
            out.append((base + need_off[k], 0.0))  # type: ignore[operator]
    return out


def _last_end(row_ends: Sequence[float | None]) -> float:
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
