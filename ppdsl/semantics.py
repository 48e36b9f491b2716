"""What a schedule means when it runs: one definition for the checker, simulator and runtime.

Every rank executes its row in order. A compute action waits for the data it needs; a send or
receive waits according to the communication model:

- `rendezvous`: an operation completes only when its peer operation is posted too (gloo in
  Paddle; NCCL for large messages). A batch's members run one after another, as written.
- `grouped`: a batch's members are posted together and the batch completes once every member
  has met its peer (NCCL's group calls). Operations outside batches behave as in rendezvous.
- `buffered`: a send completes at once; a receive waits for its send (PyTorch's simulator).

Which send a receive meets is the same in every model, as on the transports: on each directed
link (sender rank, receiver rank) the k-th receive posted takes the k-th message sent, batch
members counted in written order (`links.Links`). When that is not the send the receive's
label names, the run goes on with the data in the wrong place (the checker's PPS212).

Data dependencies (stage s of microbatch m; the tables are `encoding.Needs`):
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

One engine is the whole of it: one loop (`_Engine._loop`) gives the checker's verdict
(`completes`, the loop with its statements about time skipped), its explanation of a hang,
lowering's placement of exchanges, the simulator's timeline and the critical path's; the one
place where a send or receive meets its peer, or waits posted for it, is the send/receive
branch of that loop (a grouped batch's members go through it too). The unit-time run of a
program under a model is kept on the program, so lint, then lowering, ask for it once.

The loop works on the program's integer encoding (`ppdsl/encoding.py`) with one flat list of
completion times per key, and wakes a rank only when the one thing it waits for happens, so a
run is linear in the number of actions (figures: benchmarks/RESULTS.md); the loop binds the
shifts, masks and kind bounds of the layout to locals (a global costs a lookup per action) and each row
it runs ends in `END_OF_ROW`, so it tests no index per action. A compute-only program
written as a timeline (PyTorch's CSV: one cell per time step) is asked of its steps first
(`steps_are_an_order`): when every action's inputs are done at earlier steps, the program runs
to the end under every model and the loop is not needed. A program with sends and receives whose
rows carry their own inputs (a lowered one) is asked of its pairs the same way
(`rows_carry_their_inputs`). Both proofs (`ppdsl/proofs.py`) read the same `Needs` tables, so
they state no rule of their own, and only their yes is taken.
"""

from __future__ import annotations

import enum
from functools import cached_property
from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import compress, repeat
from operator import add, lt, ne
from typing import cast

from attrs import field, frozen

from .layout import KIND_BITS, KIND_SPACE, SLOT_SPACE, key_of, kind_of
from .encoding import (_COMM_KINDS, COMM_KINDS, COMM_MAX, COMPUTE_KINDS, COMPUTE_MAX, KIND_MASK, MB_STRIDE,
                       NO_PEER, NOTHING, RECEIVE_BIT, SLOT_BITS, Encoded, Needs, SHIFT, code_space, encode,
                       kind_slice, peer_code, producers, received_key, sent_key)
from .gcpause import no_gc
from .ir import Action, Kind, Overlap, Program, row_length
from .kinds import TABLE
from .proofs import rows_carry_their_inputs, steps_are_an_order


class CommModel(str, enum.Enum):
    RENDEZVOUS = "rendezvous"
    GROUPED = "grouped"
    BUFFERED = "buffered"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> CommModel:
        raise ValueError(f"comm_model must be one of {', '.join(m.value for m in cls)}, not {value!r}")


MODELS: tuple[str, ...] = tuple(m.value for m in CommModel)


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
    # Offloads and reloads on a copy lane beside the computes (a side stream); False: the rank
    # runs each itself, in row order, as a compute.
    copy_lane: bool = True

    @classmethod
    def from_table(cls, table: Sequence[Sequence[float] | Mapping[Kind, float]], message: float = 0.0,
                   overlap: Callable[[Overlap], float] | None = None, copy_lane: bool = True) -> Timing:
        """Compute times per stage and Kind value (`table[stage][kind]`), one message time.

        A row is a sequence indexed by Kind value (`row[Kind.F]`), or a mapping from Kind to
        its time; a kind it lacks, or a stage past the table, takes 0."""
        rows = tuple(tuple(float(row.get(k, 0.0)) for k in range(max(Kind) + 1))  # type: ignore[call-overload]
                     if isinstance(row, Mapping) else tuple(float(x) for x in row) for row in table)
        msg = float(message)

        def compute(a: Action) -> float:
            row = rows[a.stage] if 0 <= a.stage < len(rows) else ()
            return row[a.kind] if a.kind < len(row) else 0.0

        def fixed(a: Action) -> float:
            return msg

        return cls(compute, overlap, fixed, rows, msg, copy_lane)

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
    """A run of the engine. Its times are kept as the engine makes them, per action (one per
    code of the program's encoding, in row order; None where the run did not get to it), which
    is what lowering reads. `starts` and `ends`, per step, are made from them when first asked:
    a check that asks only whether the run ends does not pay for them."""

    completed: bool
    waits: tuple[Wait, ...]
    makespan: float
    action_starts: tuple[list[float | None], ...] = field(hash=False, repr=False)
    action_ends: tuple[list[float | None], ...] = field(hash=False, repr=False)
    # Per rank: the step of each action (None: action i is step i), its overlapped pairs and
    # batches (`Encoded.groups`), its number of steps.
    _steps: tuple[list[int] | None, ...] = field(eq=False, hash=False, repr=False)
    _groups: tuple[dict[int, tuple[bool, int]], ...] = field(eq=False, hash=False, repr=False)
    _lengths: tuple[int, ...] = field(eq=False, hash=False, repr=False)
    # Each backward that waited for the reload of its activations: (rank, its action index, the
    # reload's action index, how long it waited), in the order they ran.
    reload_waits: tuple[tuple[int, int, int, float], ...] = field(default=(), eq=False, hash=False, repr=False)

    @property
    def starts(self) -> tuple[tuple[float | None, ...], ...]:
        """Per rank, per step: when it starts (idle steps and steps not reached: None)."""
        return self._per_step[0]

    @property
    def ends(self) -> tuple[tuple[float | None, ...], ...]:
        """Per rank, per step: when it ends (idle steps and steps not reached: None)."""
        return self._per_step[1]

    @cached_property
    def _per_step(self) -> tuple[tuple[tuple[float | None, ...], ...], tuple[tuple[float | None, ...], ...]]:
        """Per-action times -> per-step times: a step starts when its first action does and
        ends when its last one does; idle steps have neither."""
        out_s: list[tuple[float | None, ...]] = []
        out_e: list[tuple[float | None, ...]] = []
        for st, en, steps, groups, n in zip(self.action_starts, self.action_ends, self._steps, self._groups,
                                            self._lengths):
            if steps is None:
                out_s.append(tuple(st))
                out_e.append(tuple(en))
                continue
            s_out: list[float | None] = [None] * n
            e_out: list[float | None] = [None] * n
            if not groups:
                # One action per step (plain actions and idle steps, as a CSV's rows): a run of
                # consecutive steps is one slice of the actions, copied at once.
                for a, b in _runs(steps):
                    first = steps[a]
                    s_out[first:first + b - a] = st[a:b]
                    e_out[first:first + b - a] = en[a:b]
            else:
                for i, step in enumerate(steps):
                    if s_out[step] is None:
                        s_out[step] = st[i]
                    e_out[step] = en[i]
            out_s.append(tuple(s_out))
            out_e.append(tuple(e_out))
        return tuple(out_s), tuple(out_e)


# --------------------------------------------------------------------------------------------
# The engine

# Per kind value, its lane as the timed loop reads it (`KindRow.lane`): a copy (offload,
# reload), a backward that waits for its reload, or anything else.
_ON_COPY_LANE, _AFTER_RELOAD = 1, 2
_LANES: list[int] = [_ON_COPY_LANE if k in TABLE.copy else _AFTER_RELOAD if k in TABLE.after_reload else 0
                     for k in range(KIND_SPACE)]
# The stage-only kinds that take time (`KindRow.cost`): the sharding collectives.
_TIMED_STAGE_KINDS: tuple[int, ...] = tuple(r.value for r in TABLE.rows if r.category == "stage" and r.cost)
_UNSHARD = int(Kind.UNSHARD)


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
    if timing is not UNIT or enc is not encode(program):
        return _Engine(program, enc, model, timing).run()
    # The unit-time run is what the checker explains a hang with and lowering places
    # exchanges by: made once per program and model, kept on the program.
    key = _run_key(model)
    run = program.derived.get(key)
    if not isinstance(run, Execution):
        run = program.derived[key] = _Engine(program, enc, model, timing).run()
    return run


def _run_key(model: CommModel) -> str:
    """The entry of a program's unit-time run under `model` in `Program.derived`."""
    return f"execution:{model.value}"


def completes(program: Program, model: CommModel | str = CommModel.RENDEZVOUS, encoded: Encoded | None = None) -> bool:
    """Whether `program` runs to the end under `model`: `execute(...).completed` (whether a
    run finishes does not depend on durations), by the same loop of the one engine with the
    statements about time skipped. The checker asks this of every program, and `execute`
    only when the answer is no (to explain where it stops); a unit-time run kept on the
    program already (lowering makes it first) answers at once."""
    model = CommModel(model)
    enc = encoded if encoded is not None else encode(program)
    if enc.invalid:
        raise ValueError("the program has out-of-range actions; check() reports them")
    run = program.derived.get(_run_key(model)) if enc is encode(program) else None
    if isinstance(run, Execution):
        return run.completed
    return _Engine(program, enc, model, UNIT).completes()


# How the engine reads a duration: `dur[code & dur_mask]`. DUR_PER_KIND: a table of KIND_SPACE,
# one per Kind value (every stage has the same times); DUR_PER_CODE (all bits set): one per code.
DUR_PER_KIND = KIND_MASK
DUR_PER_CODE = -1
# What every row the loop runs ends in: a code no action has (kind bits KIND_MASK, sm 0; an
# out-of-range action's code is -1, and such a program never runs).
END_OF_ROW = KIND_MASK
_END = [END_OF_ROW]
# A rank's position while a grouped batch waits for peers to meet its members: not a step;
# `finish_peer` moves the rank past the batch when the last member is met.
PARKED = -1


class _Engine:
    def __init__(self, program: Program, enc: Encoded, model: CommModel, timing: Timing):
        self.program = program
        self.enc = enc
        self.model = model
        self.timing = timing
        self.needs = enc.needs(model is CommModel.BUFFERED)

    def _durations(self, with_comms: bool, input_hop: list[list[bool]]
                   ) -> tuple[list[float], int, list[float] | None]:
        """Durations as the loop reads them, `dur[code & mask]`: per Kind value (mask KIND_MASK) when
        every stage has the same, else per action code (mask -1): a compute's time, a send's
        or receive's message time. And per code, the message time an implicit hand-off adds
        to a compute's input in a compute-only program (`Needs.input_hop`; None: none)."""
        enc, timing = self.enc, self.timing
        S, M = enc.stages, enc.microbatches
        SM = S * M
        needs_hops = not with_comms and any(map(any, input_hop))
        computes = len(COMPUTE_KINDS)  # Kind values: the computes first, 0 .. computes - 1
        if timing.is_unit:
            return [1.0] * computes + [0.0] * (KIND_SPACE - computes), DUR_PER_KIND, None
        hop_time: list[float] | None = None
        if timing.table is not None and timing.fixed_message is not None:
            msg = timing.fixed_message
            # Per stage, a time per Kind value: the computes', and the stage-only kinds' that
            # take time (the sharding collectives); the sends' and receives' are the message's.
            width = max(Kind) + 1
            rows = [tuple(float(x) for x in (timing.table[s] if s < len(timing.table) else ()))[:width]
                    for s in range(S)]
            rows = [row + (0.0,) * (width - len(row)) for row in rows]
            if needs_hops and msg:
                hop_time = [0.0] * code_space(S, M)
                for k, hops in enumerate(input_hop):
                    for s in range(S):
                        if hops[s]:
                            hop_time[kind_slice(s, k, M)] = [msg] * M
            if len(set(rows)) <= 1:  # the same on every stage: a table of KIND_SPACE
                per_kind = list(rows[0] if rows else (0.0,) * width) + [0.0] * (KIND_SPACE - width)
                for k in COMM_KINDS:
                    per_kind[k] = msg
                return per_kind, DUR_PER_KIND, hop_time
            dur = [0.0] * code_space(S, M)
            for s, row in enumerate(rows):
                for k in (*COMPUTE_KINDS, *_TIMED_STAGE_KINDS):
                    if row[k]:
                        dur[kind_slice(s, k, M)] = [row[k]] * M
            if msg:
                every = [msg] * SM
                for k in COMM_KINDS:
                    dur[k::MB_STRIDE] = every
            return dur, DUR_PER_CODE, hop_time
        # The callback form: one call per action, made here rather than in the run.
        compute, message = timing.compute, timing.message
        dur = [0.0] * code_space(S, M)
        if needs_hops:
            hop_time = [0.0] * code_space(S, M)
        for r, codes in enumerate(enc.codes):
            for c, a in zip(codes, enc.actions_of_rank(r)):
                k = c & KIND_MASK
                if k <= COMPUTE_MAX:
                    dur[c] = compute(a)
                    if hop_time is not None and input_hop[k][a.stage]:
                        hop_time[c] = message(a)
                elif k <= COMM_MAX:
                    dur[c] = message(a)
                elif k in _TIMED_STAGE_KINDS:
                    dur[c] = compute(a)
        return dur, DUR_PER_CODE, hop_time

    def run(self) -> Execution:
        """The run with its times. The collector is paused around it: the run's lists of times
        and of waiting ranks are young objects that a collection would scan again and again."""
        with no_gc():
            ex = self._loop(True)
        assert isinstance(ex, Execution)
        return ex

    def completes(self) -> bool:
        """Whether the run ends, by the same loop without keeping any time, or by a proof
        that reads the same tables (`ppdsl/proofs.py`): for a compute-only timeline, its
        steps (`steps_are_an_order`); for a program with sends and receives, its rows
        (`rows_carry_their_inputs`)."""
        enc = self.enc
        # A compute-only program's steps are asked first when its rows have idle steps (a
        # written timeline) and no overlapped pair or batch.
        compute_only = not enc.has_comms
        timeline = compute_only and not any(enc.groups) and any(steps is not None for steps in enc.steps)
        if timeline and steps_are_an_order(enc, self.needs):
            return True
        # A program with sends and receives whose rows carry their own inputs (a lowered
        # one): its pairs are walked, one step each, instead of a block and a wake each.
        if not compute_only and self.model is not CommModel.BUFFERED and rows_carry_their_inputs(enc, self.needs):
            return True
        return self._loop(False) is True

    def _loop(self, timed: bool) -> Execution | bool:  # noqa: C901 - one hot loop, kept flat on purpose
        """The engine. `timed`: keep every action's start and end and return the Execution;
        else only whether every rank reaches its end (what `completes` asks), with the
        statements about time skipped (`end` stays 0, which reads as done)."""
        program, enc, timing = self.program, self.enc, self.timing
        S, M = enc.stages, enc.microbatches
        R = len(enc.codes)
        grouped = self.model is CommModel.GROUPED
        buffered = self.model is CommModel.BUFFERED
        with_comms = enc.has_comms
        unit = timing.is_unit
        needs = self.needs = enc.needs(buffered)  # the tables of what each code waits for (encoding.Needs)
        local_slot, input_off, out_slots = needs.local_slot, needs.input_off, needs.out_slots
        dur, dur_mask, hop_time = self._durations(with_comms, needs.input_hop) if timed else ([0.0] * KIND_SPACE, DUR_PER_KIND, None)
        peer_delta, need_off, recv_off = needs.peer_delta, needs.need_off, needs.recv_off
        out_slot = needs.out_slot
        # The layout and the kinds' bounds, from the table of kinds (`ppdsl/kinds.py`), as locals:
        # a global costs a lookup per action.
        kb, km, sb = KIND_BITS, KIND_MASK, SLOT_BITS
        cmax, xmax, rbit, end_row = COMPUTE_MAX, COMM_MAX, RECEIVE_BIT, END_OF_ROW
        meets = needs.meets  # where a link's order differs from the labels: who meets whom

        # Completion time per key (-1: not yet). M microbatches' worth of keys past the end
        # that nothing writes: the input of a send or receive to a stage outside the pipeline
        # lands there (a negative key wraps around to them) and never completes.
        size = key_of(S * M + M, 0)
        if timed:
            done = [-1.0] * size
            done[NOTHING::SLOT_SPACE] = [0.0] * (S * M + M)  # what waits for nothing waits for a key done at 0
        else:
            # Without times a key is -1 or 0: one signed byte each, eight times less memory
            # for the loop to touch than a list (the same loop, twice as fast on 262,144
            # actions once the cache is shared).
            done = cast("list[float]", array("b", b"\xff") * size)
            done[NOTHING::SLOT_SPACE] = cast("list[float]", array("b", bytes(S * M + M)))
        # Code of a posted send/receive -> its rank; it was posted at that rank's start of it.
        posted: dict[int, int] = {}
        waiters: dict[int, list[int]] = {}  # dependency key -> ranks waiting for it
        # Each row ends in END_OF_ROW, which the stage-only branch stops at: the loop tests no
        # index against the row's length per action.
        codes_of = [codes + _END for codes in enc.codes]
        groups_of = enc.groups
        pc = [0] * R
        ready = [0.0] * R
        # Per rank, per action (not per step: no step lookup in the loop): start and end.
        starts: list[list[float | None]] = [[None] * len(codes) if timed else [] for codes in enc.codes]
        ends: list[list[float | None]] = [[None] * len(codes) if timed else [] for codes in enc.codes]
        pending = [0] * R  # grouped: members of the current batch still waiting for their peer
        batch_end = [0.0] * R
        work: deque[int] = deque(range(R))
        popleft, push, extend = work.popleft, work.append, work.extend
        # A program with offloads or reloads: per kind, its lane (`_lanes`); per rank, when
        # its copy lane is free; per (stage, microbatch), the reload in flight (its index and
        # end); and each backward a reload made wait (rank, index, the reload's index, for how long).
        lane_of = _LANES if timed and timing.copy_lane and not enc.kinds.isdisjoint(TABLE.copy) else None
        copy_free = [0.0] * R
        reload_kinds = frozenset(TABLE.reloads)
        reloaded: dict[int, tuple[int, float]] = {}
        reload_waits: list[tuple[int, int, int, float]] = []
        gathered: dict[int, float] = {}  # per stage, when its last UNSHARD's all-gather ends

        def wake(key: int) -> None:
            ws = waiters.pop(key, None)
            if ws:
                extend(ws)

        def close_batch(r: int) -> None:
            """Every member of rank r's grouped batch has met its peer: the batch ends when its
            last member does, and the rank goes on past it."""
            i0 = pc[r]
            count = groups_of[r][i0][1]
            if timed:
                ends[r][i0:i0 + count] = [batch_end[r]] * count
            ready[r] = batch_end[r]
            pc[r] = i0 + count
            push(r)

        def deps_here(c: int) -> list[tuple[int, float]]:
            """(key, the implicit message time before it is usable) of what code c waits for."""
            return [(key, hop_time[c] if crosses and hop_time is not None else 0.0) for key, crosses in needs.of(c)]

        end: float = 0  # untimed, every completion is at 0
        while work:
            r = popleft()
            i = pc[r]
            codes = codes_of[r]
            if grouped and pending[r]:
                continue  # a batch waiting for its members' peers: close_batch moves it on
            groups = groups_of[r]
            if timed:
                st, en = starts[r], ends[r]
            t = ready[r]
            batch_stop = 0  # while a grouped batch is being posted: the index past its last member
            while True:
                c = codes[i]
                if groups and i in groups:
                    is_batch, count = groups[i]
                    if not is_batch or grouped:
                        # An overlapped pair, or a batch under `grouped`: every member's data
                        # first, then the members together.
                        t0 = t
                        stuck = False
                        for j in range(i, i + count):
                            cj = codes[j]
                            kj = cj & km
                            if kj <= cmax:  # a compute member (every member of a pair): as the hot path below reads it
                                smj = cj >> kb
                                key = (smj << sb) + local_slot[kj]
                                d = done[key]
                                if d >= 0:
                                    if d > t0:
                                        t0 = d
                                    key = (smj << sb) + input_off[kj][smj]
                                    d = done[key]
                                    if d >= 0:
                                        if hop_time is not None:
                                            d += hop_time[cj]
                                        if d > t0:
                                            t0 = d
                                        continue
                                waiters.setdefault(key, []).append(r)
                                stuck = True
                                break
                            for key, delay in deps_here(cj):
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
                            if timed:
                                if unit:
                                    end = t0 + 1.0
                                else:
                                    pair = program.rows[r][enc.step_of(r, i)]
                                    assert isinstance(pair, Overlap)
                                    end = t0 + timing.overlap_time(pair)
                                st[i:i + count] = [t0] * count
                                en[i:i + count] = [end] * count
                                t = end
                            for j in range(i, i + count):
                                cj = codes[j]
                                kj = cj & km
                                base = (cj >> kb) << sb
                                for key in out_slots[kj] if kj <= cmax else ():
                                    key += base
                                    if done[key] < 0:
                                        done[key] = end
                                    if waiters and key in waiters:
                                        extend(waiters.pop(key))
                            i += count
                            continue
                        # A grouped batch: its members are posted at t0 by the send/receive
                        # code below, one after another without waiting; the rank waits at
                        # the batch until the last of them has met its peer.
                        if not _COMM_KINDS.issuperset([cj & km for cj in codes[i:i + count]]):
                            break  # a compute has no peer to meet in a batch: it waits forever (PPS208)
                        pc[r] = i
                        pending[r] = count
                        batch_end[r] = t = t0
                        if timed:
                            st[i:i + count] = [t0] * count
                        batch_stop = i + count
                k = c & km
                if k <= cmax:  # compute, COMPUTE_MAX and below (the hot path): its own earlier work, then its input from the next or previous stage
                    sm = c >> kb
                    base = sm << sb
                    key = base + local_slot[k]
                    d = done[key]
                    if d < 0:
                        waiters.setdefault(key, []).append(r)
                        break
                    key = base + input_off[k][sm]
                    e = done[key]
                    if e < 0:
                        waiters.setdefault(key, []).append(r)
                        break
                    if timed:
                        t0 = d if d > t else t
                        if hop_time is not None:
                            e += hop_time[c]
                        if e > t0:
                            t0 = e
                        if lane_of is not None:  # the program moves activations or gathers weights: a copy lane
                            if gathered:  # the stage's weights, gathered on the lane
                                g = gathered.get(sm // M, 0.0)
                                if g > t0:
                                    t0 = g
                            lane = lane_of[k]
                            if lane == _ON_COPY_LANE:  # the rank posts it and goes on; its copies run in order
                                f = copy_free[r]
                                if f > t0:
                                    t0 = f
                                copy_free[r] = end = t0 + dur[c & dur_mask]
                                st[i] = t0
                                en[i] = end
                                if k in reload_kinds:
                                    reloaded[sm] = (i, end)
                                i += 1
                                continue
                            if lane == _AFTER_RELOAD and reloaded:
                                back = reloaded.pop(sm, None)
                                if back is not None and back[1] > t0:
                                    reload_waits.append((r, i, back[0], back[1] - t0))
                                    t0 = back[1]
                        t = end = t0 + dur[c & dur_mask]
                        st[i] = t0
                        en[i] = end
                    for key in out_slots[k]:
                        key += base
                        done[key] = end
                        if waiters and key in waiters:
                            extend(waiters.pop(key))
                    i += 1
                    continue
                if k > xmax:  # past the sends and receives: a stage-only kind (no data flow), or the row's end
                    if c == end_row:
                        break
                    if timed:
                        d = dur[c & dur_mask]
                        if lane_of is not None and lane_of[k] == _ON_COPY_LANE:  # a sharding collective, posted
                            f = copy_free[r]
                            t0 = f if f > t else t
                            copy_free[r] = e = t0 + d
                            st[i], en[i] = t0, e
                            if k == _UNSHARD:
                                gathered[(c >> kb) // M] = e
                        else:  # on the rank itself (copy_lane=0), or free
                            st[i] = t
                            t = en[i] = t + d
                    i += 1
                    continue
                # A send or receive: the one place where an operation meets its peer, or
                # waits posted until the peer comes.
                base = (c >> kb) << sb
                t0 = t
                off = need_off[k]
                if off is not None and not batch_stop:  # a grouped batch had its members' data checked above
                    key = base + off
                    if meets is not None and k & rbit:  # a buffered receive waits for the send it meets
                        key = sent_key(meets.get(c, c + peer_delta[k]))
                    d = done[key]
                    if d < 0:
                        waiters.setdefault(key, []).append(r)
                        break
                    if d > t0:
                        t0 = d
                if buffered:
                    if timed:
                        t = end = t0 if k & rbit else t0 + dur[c & dur_mask]  # a receive takes no time once its send is done
                        st[i] = t0
                        en[i] = end
                    base |= out_slot[k]
                    done[base] = end
                    if waiters and base in waiters:
                        extend(waiters.pop(base))
                    i += 1
                    continue
                pcode = c + peer_delta[k]
                if meets is not None:
                    pcode = meets.get(c, pcode)
                pr = posted.pop(pcode, -1)
                if pr < 0:  # the peer is not there yet: wait posted
                    posted[c] = r
                    if timed:
                        st[i] = t0
                    if not batch_stop:
                        break
                    i += 1  # a batch member: post the next one too
                else:
                    i0 = pc[pr]
                    if timed:
                        pt = starts[pr][i0]  # the peer was posted when its rank started it (a batch's members together)
                        end = (t0 if t0 > pt else pt) + dur[c & dur_mask]  # type: ignore[operator]
                        if not batch_stop:
                            st[i] = t0
                            en[i] = t = end
                        if not pending[pr]:
                            ends[pr][i0] = ready[pr] = end
                    # The pair's receive completes (a send's key matters only when buffered).
                    base = base + recv_off[k] if meets is None else received_key(c if k & rbit else pcode)
                    done[base] = end
                    if waiters and base in waiters:
                        extend(waiters.pop(base))
                    if grouped and pending[pr]:  # the peer is a member of a grouped batch waiting on its rank
                        pending[pr] -= 1
                        if end > batch_end[pr]:
                            batch_end[pr] = end
                        if not pending[pr] and pr != r:
                            close_batch(pr)
                    else:  # the peer was waiting at this very operation: it completes too
                        pc[pr] = i0 + 1
                        push(pr)
                    i += 1
                    if not batch_stop:
                        continue
                    # a member of our own batch met its peer
                    pending[r] -= 1
                    if end > batch_end[r]:
                        batch_end[r] = end
                if i < batch_stop:
                    continue
                # The whole batch is posted: go on past it if every member has met its peer.
                batch_stop = 0
                if pending[r]:
                    i = PARKED  # the peer that meets the last member moves the rank on (close_batch)
                    break
                i0 = pc[r]
                t = batch_end[r]
                if timed:
                    en[i0:i] = [t] * (i - i0)
            if i != PARKED:
                pc[r] = i
                ready[r] = t

        completed = all(pc[r] >= len(enc.codes[r]) for r in range(R))
        if not timed:
            return completed
        waits = () if completed else tuple(self._waits(pc, pending, posted, done))
        makespan = max(map(_last_end, ends), default=0.0)  # a step ends when its last action does
        if lane_of is not None:  # or when a rank's copy lane does (a gradient reduction after its last compute)
            makespan = max(makespan, *copy_free)
        rows = program.rows
        return Execution(completed, waits, makespan, tuple(starts), tuple(ends), tuple(enc.steps), tuple(enc.groups),
                         tuple(row_length(rows, r) for r in range(R)), tuple(reload_waits))

    def _waits(self, pc: list[int], pending: list[int], posted: dict[int, int],
               done: list[float]) -> list[Wait]:
        """Where each unfinished rank waits, and for what: worked out after the run from where
        it stopped (the loop keeps no record of it)."""
        enc = self.enc
        M = enc.microbatches
        grouped = self.model is CommModel.GROUPED
        pos = enc.pos  # where each code first stands (`rank << SHIFT | i`), -1 where no row holds it

        def rank_of(c: int) -> int | None:
            return pos[c] >> SHIFT if 0 <= c < len(pos) and pos[c] >= 0 else None
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
                    waiting = [key for key, _ in self.needs.of(codes[j]) if done[key] < 0]
                    if waiting:
                        reason, key, index = "data", waiting[0], j
                        break
                else:
                    j = next((j for j in members if kind_of(codes[j]) in _COMM_KINDS), i)
                    reason, key, index = "peer", enc.meets(codes[j]), j
            action = enc.action(r, index)
            step = enc.step_of(r, i)
            if reason == "peer":
                if key == NO_PEER:  # nothing left on the link to meet: name the labelled peer
                    key = peer_code(codes[index], M)
                on = rank_of(key)
                out.append(Wait(r, step, action, enc.describe(key), on, "peer" if on is not None else "missing"))
                continue
            if key < 0:  # a buffered receive with no send left on its link (NO_PEER)
                out.append(Wait(r, step, action, enc.describe(peer_code(codes[index], M)), None, "missing"))
                continue
            # A data key: the action that completes it.
            made_by = producers(key)
            found = next((c for c in made_by if rank_of(c) is not None), None)
            on = None if found is None else rank_of(found)
            text = enc.describe(made_by[0] if found is None else found)
            out.append(Wait(r, step, action, text, on, "data" if on is not None else "missing"))
        return out



def _runs(steps: list[int]) -> zip[tuple[int, int]]:
    """[a, b) of each run of consecutive step indices in `steps` (increasing)."""
    if not steps:
        return zip((), ())
    cuts = compress(range(1, len(steps)), map(ne, steps[1:], map(add, steps, repeat(1))))
    bounds = [0, *cuts, len(steps)]
    return zip(bounds, bounds[1:])


def _last_end(row_ends: Sequence[float | None]) -> float:
    # Ends on the compute lane never decrease along a row, so the last one reached is the row's
    # latest there (a copy lane's are counted apart).
    for e in reversed(row_ends):
        if e is not None:
            return e
    return 0.0



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
