"""The integer encoding of a program: the one statement of what each action waits for and which
operation each send or receive meets. The engine (`semantics`, whose one loop answers both
`execute` and `completes`), the critical path (`sim/critical.py`), the checker (`check/`),
lowering and memory read it.

The layout of codes (one per action) and keys (one per thing that completes) is in
`ppdsl/layout.py`, the peer and matching rules of sends and receives in `ppdsl/links.py`; this
module reads them. An action with a stage or microbatch out of range has INVALID_CODE. The
bulk forms of `code` here: the reader's tables in `codes_from_reader`, and `row_codes` the
other way (lowering's rows).

- the rule itself is data, stated once below: `LOCAL_NEEDS` (B and I need their F, W its I),
  `INPUT_FROM_STAGE` (F needs stage s-1's F, B and I stage s+1's gradient), `INPUT_FROM_RECEIVE`
  (across ranks, the receive that carries it), `SEND_NEEDS`/`COMPLETES` (sends and receives),
  `PRODUCERS` (what completes each slot), `PEER_OF_KIND` (whom a send or receive names);
- what each code waits for: `Needs`, one per encoding and model (`Encoded.needs`), the tables
  built from that data which every consumer reads: per compute kind `local_slot`, `input_off`
  (`input_tables`: on the same rank or in a compute-only program the producer's key, else the
  receive's), `input_hop`, `out_slots`; per send/receive kind `comm_tables`. NOTHING, a slot no
  action completes and every engine starts as done, is what "waits for nothing" points to, so
  the hot loops read one entry per need and test no None. `Needs.of(code)` reads the same
  tables per code (stuck-run explanations, critical path, cycle search);
- which code a send or receive names and which it meets: `ppdsl/links.py` (`links.Links`;
  where the order on a link differs from the names, `Links.meets` holds the exceptions);
- where each code stands: `Encoded.pos` (`rank << SHIFT | i` of its first occurrence), and
  how many distinct codes there are (`Encoded.distinct`: fewer than the actions when one is
  repeated; completeness, the link-order test and the timeline proof ask `Encoded.unrepeated`).

Rows a reader kept as integers (`ir.LazyRows`: per step the stage-kind and the microbatch) are
encoded with two list lookups a step and no Action object; their distinct stage-kinds answer
which kinds the program uses (`kinds`) and which stages a rank holds (`stages_of`) without a
pass over the codes. Lowering keeps the rows it makes the same way (`row_codes`). Other rows
are encoded from their actions.

`encode(program)` builds the encoding once and keeps it on the program (`Program.derived`),
never in a module-level cache keyed by `id()`. The engine's hot loops bind the shifts, masks and
bounds to locals once (a global costs a lookup per action) and read every rule from the
`Needs` tables: they name no kind but to tell compute (`k <= COMPUTE_MAX`), send/receive and
stage-only actions apart. The rule tables below, the bounds and the layout are all derived
from the table of kinds (`ppdsl/kinds.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import compress, repeat
from operator import add, and_, attrgetter, floordiv, gt, is_, is_not, or_, rshift
from typing import TypeVar, cast

from .gather import gather
from .ir import KIND_BITS, Action, Batch, Idle, LazyRows, Program, RowCodes, Step, actions_of, require_program
# The layout of codes and keys, and the peer and matching rules, live in their own modules;
# they are named here too, where the rest of the encoding is read from.
from .layout import (kind_of as kind_of, sm_of as sm_of, key_of as key_of, key_sm as key_sm, key_slot as key_slot,
    code_key as code_key, KIND_MASK as KIND_MASK, KIND_SPACE as KIND_SPACE, SLOT_BITS as SLOT_BITS, SLOT_MASK as SLOT_MASK,
    INVALID_CODE as INVALID_CODE, SHIFT as SHIFT, LOW as LOW, F as F, I as I, W as W, B as B, SEND_F as SEND_F,
    RECV_F as RECV_F, SEND_B as SEND_B, RECV_B as RECV_B, KIND_OF as KIND_OF, F_DONE as F_DONE,
    GRAD_DONE as GRAD_DONE, I_DONE as I_DONE, RECV_F_DONE as RECV_F_DONE, RECV_B_DONE as RECV_B_DONE,
    MSG_F_SENT as MSG_F_SENT, MSG_B_SENT as MSG_B_SENT, NO_KEY as NO_KEY, COMM_KINDS as COMM_KINDS,
    _COMM_KINDS as _COMM_KINDS, SLOT_NAMES as SLOT_NAMES, NOTHING as NOTHING, COMPUTE_KINDS as COMPUTE_KINDS,
    COMPUTE_MAX as COMPUTE_MAX, COMM_MAX as COMM_MAX, SLOT_SPACE as SLOT_SPACE,
    code as code, sm_code as sm_code, code_space as code_space, kind_slice as kind_slice, MB_STRIDE as MB_STRIDE,
    codes_of_kind as codes_of_kind, stage_kind as stage_kind)
from .kinds import RECEIVE_BIT as RECEIVE_BIT, TABLE
from .links import (NO_PEER as NO_PEER, PEER_OF_KIND as PEER_OF_KIND, named_deltas as named_deltas,
    peer_stage as peer_stage, Links as Links, in_label_order as in_label_order, peer_code as peer_code)


# The dependency rule, as data (stage s, microbatch m), read by `Needs`, `comm_tables`,
# `input_tables` and the checker's order rules; derived from the table of kinds
# (`ppdsl/kinds.py`: each row's `local`, `input`, `received`, `sends`, `completes`):
# - a compute needs from its own stage and microbatch: (the kind needed, the kind needing it),
#   through the slot the needed kind completes (B and I need the F; W needs the I);
LOCAL_NEEDS: tuple[tuple[int, int], ...] = TABLE.local_needs
OWN_SLOT: dict[int, int] = TABLE.own_slot
# - a forward needs the F of stage s-1, a backward (B or I) the gradient of stage s+1:
#   (the step to the producing stage, the slot its producer completes), per kind needing it;
INPUT_FROM_STAGE: dict[int, tuple[int, int]] = TABLE.input_from_stage
# - when that stage is on another rank and the program has sends and receives, it waits instead
#   for its own receive, which completes this slot:
INPUT_FROM_RECEIVE: dict[int, int] = TABLE.input_from_receive
# Sends are even Kind values, receives odd (SEND_F=4, RECV_F=5, SEND_B=6, RECV_B=7): the hot
# loops tell a receive by `k & RECEIVE_BIT` (`kinds.RECEIVE_BIT`, checked against the table).
# - a send needs what it sends: the slot of its own (stage, microbatch) its producer completes;
#   a receive completes its slot, and a send the MSG slot a buffered receive waits for.
SEND_NEEDS: dict[int, int] = TABLE.send_needs
COMPLETES: dict[int, int] = TABLE.completes


# What completes each slot of a key: the kinds whose action, of the key's stage and
# microbatch, does (a gradient by the B or the I).
PRODUCERS: dict[int, tuple[int, ...]] = TABLE.producers
# Per compute kind, the slots its action completes: PRODUCERS read the other way.
_OUTPUT_SLOTS: tuple[tuple[int, ...], ...] = tuple(
    tuple(slot for slot, kinds in PRODUCERS.items() if k in kinds) for k in COMPUTE_KINDS)


# --------------------------------------------------------------------------------------------
# Encoding


def row_codes(rows: list[list[int]], stages: int, microbatches: int) -> list[RowCodes]:
    """Rows of codes as a reader keeps its rows (`ir.RowCodes`: per step `stage_kind` and the
    microbatch), `codes_from_reader` the other way: lowering keeps its rows so (the printer
    then writes them without Action objects). Per `sm`, `stage_kind(stage, 0)` and the
    microbatch are looked up in two tables (no arithmetic on each)."""
    stage_bits: list[int] = []
    for s in range(stages):
        stage_bits += [stage_kind(s, 0)] * microbatches
    micro: list[int | None] = [*range(microbatches)] * stages
    out: list[RowCodes] = []
    for codes in rows:
        sms = list(map(rshift, codes, repeat(KIND_BITS)))
        kinds = list(map(and_, codes, repeat(KIND_MASK)))
        sks: list[int | None] = list(map(or_, gather(stage_bits, sms), kinds))
        mbs = gather(micro, sms)
        if kinds and max(kinds) > COMM_MAX:  # a stage-only action names no microbatch (its code has 0)
            for i in compress(range(len(kinds)), map(gt, kinds, repeat(COMM_MAX))):
                mbs[i] = None
        out.append((sks, mbs))
    return out


Value = TypeVar("Value")  # what `at_places` reads


def at_places(where: list[int], rank: int, per_rank: Callable[[int], Sequence[Value] | None],
              absent: Value) -> list[Value | int]:
    """`per_rank(r)[i]` for each place `r << SHIFT | i` in `where` (the index i itself where
    `per_rank(r)` is None), `absent` for -1. The places of one stage's actions are usually all
    on its own rank, `rank`: then one C-level lookup each."""
    low = rank << SHIFT
    if where and low <= min(where) and max(where) <= low | LOW:
        values = per_rank(rank)
        at = map(and_, where, repeat(LOW))
        return list(at) if values is None else gather(values, at)
    out: list[Value | int] = []
    for w in where:  # an absent action, or one on another rank
        values = per_rank(w >> SHIFT) if w >= 0 else None
        out.append(absent if w < 0 else w & LOW if values is None else values[w & LOW])
    return out


_PLAIN_OR_IDLE = frozenset((Action, Idle))

def read_rows(program: Program) -> list[RowCodes | None] | None:
    """Per rank, the row as its reader kept it (`ir.LazyRows`): None for a row built as steps,
    and None in all when no reader kept any (a generated or lowered program)."""
    rows = program.rows
    return rows.codes if isinstance(rows, LazyRows) else None


def codes_from_reader(rows: list[RowCodes | None], stages: int, microbatches: int
                      ) -> list[tuple[list[int], list[int] | None, set[int | None]] | None]:
    """Per rank, (codes, step index of each code or None when every step is an action, the
    row's distinct stage-kinds), as `Encoded` keeps them, from a reader's integers (a stage-only
    action, with no microbatch, coded at microbatch 0 as `Encoded` codes it); None for a row to
    encode from its actions (one built as steps, one with no action, and one with a stage or
    microbatch out of range, which the careful encoder reports)."""
    # `code` is linear: code(stage, mb, kind) = code(stage, 0, kind) + code(0, mb, 0), so
    # prefix[sk] + micro[mb]: two list lookups a step (a stage-kind `sk` is below
    # `stage_kind(stages, 0)`, a microbatch below `microbatches`, or the row is out of range).
    prefix = [code(sk >> KIND_BITS, 0, sk & KIND_MASK, microbatches) for sk in range(stage_kind(stages, 0))]
    micro = [code(0, mb, 0, microbatches) for mb in range(microbatches)]
    # For a row with a stage-only action, whose microbatch is None: its code has microbatch 0.
    micro_or_none: dict[int | None, int] | None = None
    out: list[tuple[list[int], list[int] | None, set[int | None]] | None] = []
    for row in rows:
        if row is None or not row[0]:
            out.append(None)
            continue
        sk_row, mb_row = row
        # The distinct stage-kinds: a few hundred values, which say whether the row has idle
        # steps (None) without a scan of the row for it.
        seen = set(sk_row)
        steps: list[int] | None = None
        sks: Iterable[int | None] = sk_row
        mbs: Iterable[int | None] = mb_row
        if None in seen:  # idle steps carry no code; keep the step index of the others
            kept = list(map(is_not, sk_row, repeat(None)))
            steps = list(compress(range(len(sk_row)), kept))
            if not steps:
                out.append(None)
                continue
            # `compress` by the one mask, not a lookup per kept step: no call per element.
            sks, mbs = compress(sk_row, kept), compress(mb_row, kept)
        try:
            table: Sequence[int] | dict[int | None, int] = micro
            if any(sk is not None and sk & KIND_MASK > COMM_MAX for sk in seen):
                if micro_or_none is None:
                    micro_or_none = {None: 0, **dict(enumerate(micro))}
                table = micro_or_none
            out.append((list(map(add, gather(prefix, sks), gather(table, mbs))), steps, seen))
        except (IndexError, KeyError, TypeError):
            # Out of range (a reader gives no negative number), or no microbatch where one is
            # needed: the careful encoder says where.
            out.append(None)
    return out


class Encoded:
    """A program as integer codes, one list per rank, one code per action in written order.

    `steps[r][i]` is the step index of action i of rank r (None when every step of the row is
    one plain action, so i is the step). `groups[r]` maps the index of the first action of an
    overlapped pair or a batch to (is_batch, member count). `invalid` lists actions whose
    stage or microbatch is out of range (they get no code).
    """

    __slots__ = ("stages", "microbatches", "placement", "codes", "steps", "groups", "invalid", "rows", "_actions",
                 "_kinds", "_links", "_needs", "_pos", "_columns", "_row_kinds", "_distinct")

    def __init__(self, program: Program, read: list[RowCodes | None] | None = None, links: Links | None = None):
        """`read`: what the reader learned, for the rows it read plainly. `links`: the links as
        the program's maker knows them to be (lowering's, in label order), taken unscanned."""
        S, M = program.stages, program.microbatches
        self.stages, self.microbatches = S, M
        self.placement = program.placement
        self.rows = program.rows
        self._links: Links | None = links
        self._needs: dict[bool, Needs] = {}
        self._pos: list[int] | None = None
        self._columns: dict[int, list[int]] = {}
        self.codes: list[list[int]] = []
        self.steps: list[list[int] | None] = []
        self.groups: list[dict[int, tuple[bool, int]]] = []
        self.invalid: list[tuple[int, int, Action]] = []
        self._actions: list[list[Action]] | None = None
        self._kinds: frozenset[int] | None = None
        # Per rank, the distinct stage-kinds (`stage_kind`) the reader saw in a row encoded
        # from its integers (None for other rows): a few values, which `kinds` and
        # `stages_of` read instead of scanning the row's codes.
        self._row_kinds: list[set[int | None] | None] = []
        self._distinct: int | None = None
        get_stage, get_mb = attrgetter("stage"), attrgetter("microbatch")
        from_reader = codes_from_reader(read, S, M) if read is not None and len(read) == len(program.rows) else None
        for rank in range(len(program.rows)):
            known = from_reader[rank] if from_reader is not None else None
            if known is not None:  # from the reader's integers: the row's actions are not made
                self._row_kinds.append(known[2])
                self.codes.append(known[0])
                self.steps.append(known[1])
                self.groups.append({})
                continue
            row = program.rows[rank]
            types = set(map(type, row))
            if Action in types and types <= _PLAIN_OR_IDLE:
                # Idle steps (a CSV's empty cells) carry no code: drop them, keep the step indices.
                steps = None if len(types) == 1 else list(compress(range(len(row)), map(is_, map(type, row), repeat(Action))))
                plain = cast("Sequence[Action]", row if steps is None else [row[i] for i in steps])
                try:
                    stages_ok = 0 <= min(map(get_stage, plain)) and max(map(get_stage, plain)) < S
                    mbs_ok = 0 <= min(map(get_mb, plain)) and max(map(get_mb, plain)) < M
                except TypeError:  # a stage-only action (no microbatch): take the careful path
                    stages_ok = mbs_ok = False
                if stages_ok and mbs_ok:
                    shift = KIND_BITS  # `code`, inline (see there why)
                    self.codes.append([((a.stage * M + a.microbatch) << shift) | a.kind for a in plain])  # type: ignore[operator]
                    self.steps.append(steps)
                    self.groups.append({})
                    self._row_kinds.append(None)
                    continue
            self._encode_steps(rank, row, S, M)
            self._row_kinds.append(None)

    def _encode_steps(self, rank: int, row: tuple[Step, ...], S: int, M: int) -> None:
        """The careful encoder: a row step by step, each action bounded (an out-of-range one is
        noted in `invalid` and gets INVALID_CODE), overlapped pairs and batches in `groups`."""
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
                if not (0 <= a.stage < S and 0 <= m < M and 0 <= a.kind < KIND_SPACE):
                    self.invalid.append((rank, index, a))
                    codes.append(INVALID_CODE)
                else:
                    codes.append(code(a.stage, m, a.kind, M))
                steps.append(index)
        self.codes.append(codes)
        # Every step one action (a row the fast paths did not take, as one with a stage-only
        # action may be): no step table, as they keep none.
        self.steps.append(None if not groups and len(steps) == len(row) else steps)
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
            for rank, codes in enumerate(self.codes):
                seen = self._row_kinds[rank]
                if seen is None:
                    found.update(map(and_, codes, repeat(KIND_MASK)))
                else:
                    found.update(sk & KIND_MASK for sk in seen if sk is not None)
            found.discard(kind_of(INVALID_CODE))  # an out-of-range action
            self._kinds = frozenset(found)
        return self._kinds

    @property
    def has_comms(self) -> bool:
        """Whether the program sends or receives: the one answer, from `kinds` (no Action made)."""
        return not self.kinds.isdisjoint(_COMM_KINDS)

    @property
    def pos(self) -> list[int]:
        """code -> place of its first occurrence (`rank << SHIFT | i`), -1 where the program
        lacks it.

        A list over the whole code space rather than a dict: a reader takes every (stage,
        microbatch) of one kind as one slice of it, in C. Filled by scattering each row
        backwards, so the first occurrence is the one that stays (by a plain loop:
        `map(table.__setitem__, ...)` calls a method wrapper per code, 1.4x slower)."""
        if self._pos is None:
            table = [-1] * code_space(self.stages, self.microbatches)
            for rank in range(len(self.codes) - 1, -1, -1):
                codes = self.codes[rank]
                for c, place in zip(reversed(codes), range((rank << SHIFT) + len(codes) - 1, (rank << SHIFT) - 1, -1)):
                    table[c] = place
            if table:
                table[-1] = -1  # an INVALID_CODE landed here; no real code does (its kind would be KIND_MASK)
            self._pos = table
        return self._pos

    def stages_of(self, rank: int) -> set[int]:
        """The stages whose actions a rank's row holds (-1 for an out-of-range action)."""
        seen = self._row_kinds[rank]
        if seen is not None:
            return {sk >> KIND_BITS for sk in seen if sk is not None}
        return set(map(floordiv, self.codes[rank], repeat(code(1, 0, 0, self.microbatches))))

    @property
    def distinct(self) -> int:
        """How many distinct codes the program has (`pos` entries that are not -1): fewer than
        its valid actions when one appears twice (`unrepeated`)."""
        if self._distinct is None:
            # Every code is of a kind the program uses: their columns (which the checker reads
            # anyway) hold every entry that is not -1, in a third of the table or less.
            self._distinct = sum(len(col) - col.count(-1) for col in map(self.column, self.kinds))
        return self._distinct

    def step_column(self, kind: int) -> list[int]:
        """The step index, in its rank's row, of every (stage, microbatch) of one kind, indexed
        as `column`; -1 where the program lacks it."""
        col, M = self.column(kind), self.microbatches
        out: list[int] = []
        for s, rank in enumerate(self.placement):
            out += at_places(col[s * M:s * M + M], rank, self.steps.__getitem__, -1)
        return out

    @property
    def unrepeated(self) -> bool:
        """Whether no action appears twice (`distinct` against the valid actions): what the
        position tables hold of a repeated one is only its first place."""
        return self.distinct == sum(map(len, self.codes)) - len(self.invalid)

    def column(self, kind: int) -> list[int]:
        """`pos` of every (stage, microbatch) of one kind, indexed by `stage * M + mb`."""
        col = self._columns.get(kind)
        if col is None:
            col = self._columns[kind] = self.pos[kind::MB_STRIDE]
        return col

    @property
    def links(self) -> Links:
        """Which operation each send and receive meets on its link (see `Links`)."""
        if self._links is None:
            self._links = Links(self)
        return self._links

    def needs(self, buffered: bool) -> Needs:
        """What each code waits for, under `buffered` or a model where sends block (see `Needs`)."""
        table = self._needs.get(buffered)
        if table is None:
            table = self._needs[buffered] = Needs(self, buffered)
        return table

    def meets(self, code: int) -> int:
        """The code of the operation a send or receive `code` meets on its link (NO_PEER: none)."""
        exceptions = self.links.meets
        named = peer_code(code, self.microbatches)
        return named if exceptions is None else exceptions.get(code, named)

    def describe(self, code: int) -> str:
        """`0SEND_F3`-style text of a code."""
        sm, k = sm_of(code), kind_of(code)
        stage, mb = divmod(sm, self.microbatches)
        kind = KIND_OF[k]
        return f"{stage}{kind.name}" if kind.stage_only else f"{stage}{kind.name}{mb}"


def comm_tables(M: int, buffered: bool) -> tuple[list[int], list[int | None], list[int]]:
    """Per kind of send or receive, as the engines read them: `code + peer_delta[kind]` is the
    peer its label names; it waits for the key `(sm << SLOT_BITS) + need_off[kind]` (None:
    nothing; a send waits for its producer, and a buffered receive for its send); it completes
    the key of slot `out_slot[kind]` of its own sm."""
    peer_delta = named_deltas(M)
    need_off: list[int | None] = [None] * KIND_SPACE
    out_slot = [0] * KIND_SPACE
    for k in COMM_KINDS:
        out_slot[k] = COMPLETES[k]
        if k in SEND_NEEDS:
            need_off[k] = SEND_NEEDS[k]
        elif buffered:  # a receive waits for the MSG slot of the send its label names
            step, send = PEER_OF_KIND[k]
            need_off[k] = (step * M << SLOT_BITS) + COMPLETES[send]
    return peer_delta, need_off, out_slot


def sent_key(send: int) -> int:
    """The key a send completes (in `buffered`, what the receive it meets waits for)."""
    if send < 0:
        return NO_KEY  # NO_PEER: nothing on the link to wait for
    return code_key(send, MSG_F_SENT if kind_of(send) == SEND_F else MSG_B_SENT)


def received_key(recv: int) -> int:
    """The key a receive completes when it meets its send."""
    return code_key(recv, RECV_F_DONE if kind_of(recv) == RECV_F else RECV_B_DONE)


def encode(program: Program) -> Encoded:
    """The encoding of `program`, made once and kept on the program itself (`Program.derived`):
    the checker, the engine, lowering and the simulator all ask for it, and a program is
    immutable, so the first answer stays right for the program's whole life."""
    if type(program) is not Program:
        require_program(program)
    enc = program.derived.get(_KEY)
    if enc is None:
        links = program.derived.get(_LINKS_KEY)
        assert links is None or isinstance(links, Links)
        enc = program.derived[_KEY] = Encoded(program, read=read_rows(program), links=links)
    assert isinstance(enc, Encoded)
    return enc


def links_in_label_order(program: Program) -> None:
    """Say of `program` that on every link the k-th send is the one the k-th receive names,
    as its maker built it (lowering): its encoding then takes `Links.by_construction()`."""
    program.derived[_LINKS_KEY] = Links.by_construction()


_KEY, _LINKS_KEY = "encoding", "links"  # their entries in Program.derived


def code_of(action: Action, microbatches: int) -> int:
    """The code of one action with a microbatch (`code`)."""
    assert action.microbatch is not None
    return code(action.stage, action.microbatch, action.kind, microbatches)


def recv_offsets(M: int) -> list[int]:
    """Per kind of send/receive: the offset from `code_key(code, 0)` to the key the receive of
    its pair completes (its own for a receive; its peer's for a send)."""
    off = [0] * KIND_SPACE
    off[RECV_F], off[RECV_B] = RECV_F_DONE, RECV_B_DONE
    off[SEND_F], off[SEND_B] = key_of(M, RECV_F_DONE), key_of(-M, RECV_B_DONE)
    return off


def input_tables(S: int, M: int, placement: tuple[int, ...], with_comms: bool
                 ) -> tuple[list[list[int]], list[list[bool]]]:
    """Per compute kind (indexed by Kind value), per (stage, microbatch) `sm`: the offset from
    `key_of(sm, 0)` to the key of its input from a neighbouring stage (`INPUT_FROM_STAGE`; NOTHING:
    none, as at the ends of the pipeline and for W); per compute kind and stage, whether that
    input crosses ranks with no receive (compute-only programs: the hand-off costs a message
    time). Lists of shared small objects: the loops read them in order. An offset is the same
    for every microbatch of a stage (`semantics.steps_are_an_order` reads one per stage)."""
    SM = S * M
    none = [NOTHING] * SM
    offs: list[list[int]] = [none] * len(COMPUTE_KINDS)
    hops: list[list[bool]] = [[False] * S for _ in COMPUTE_KINDS]
    for k, (step, slot) in INPUT_FROM_STAGE.items():
        off = list(none)
        for s in range(S):
            t = s + step
            if not 0 <= t < S:
                continue
            if placement[t] == placement[s] or not with_comms:
                o, hops[k][s] = (step * M << SLOT_BITS) + slot, placement[t] != placement[s]
            else:
                o = INPUT_FROM_RECEIVE[k]
            off[s * M:(s + 1) * M] = [o] * M
        offs[k] = off
    return offs, hops


def local_slots() -> list[int]:
    """Per compute kind (Kind value): the slot of its own (stage, microbatch) it waits for
    (`LOCAL_NEEDS`; NOTHING: none, the forward)."""
    slots = [NOTHING] * len(COMPUTE_KINDS)
    for needed, needer in LOCAL_NEEDS:
        assert slots[needer] == NOTHING, "one local need per kind: the loops read one slot"
        slots[needer] = OWN_SLOT[needed]
    return slots


class Needs:
    """What each code waits for under one model, built once per encoding and model
    (`Encoded.needs`): the tables the engines' hot loops read, and `of(code)`, the same tables
    read per code for everything that is not a hot loop (the engine's explanation of a stuck
    run, the critical path, the checker's cycle search).

    - per compute kind (Kind value): `local_slot[k]`, the slot of its own (stage, microbatch)
      it waits for; `input_off[k][sm]`, the offset from `sm << SLOT_BITS` to the key of its
      input from the next or previous stage (NOTHING in either: none); `input_hop[k][stage]`,
      whether that input crosses ranks with no receive (a compute-only program); `out_slots[k]`,
      the slots it completes (`PRODUCERS` read the other way);
    - `peer_delta`, `need_off`, `out_slot` per kind of send or receive (`comm_tables`), and
      `recv_off`: the key the receive of a matched pair completes, from a send or a receive;
    - `meets`: the link partners that differ from the labelled ones (`Links`; None: none).
    """

    __slots__ = ("M", "buffered", "local_slot", "input_off", "input_hop", "out_slots", "peer_delta", "need_off",
                 "out_slot", "recv_off", "meets")

    def __init__(self, enc: Encoded, buffered: bool):
        S, M = enc.stages, enc.microbatches
        with_comms = enc.has_comms
        self.M, self.buffered = M, buffered
        self.local_slot = local_slots()
        self.input_off, self.input_hop = input_tables(S, M, enc.placement, with_comms)
        self.out_slots = _OUTPUT_SLOTS
        self.peer_delta, self.need_off, self.out_slot = comm_tables(M, buffered)
        self.recv_off = recv_offsets(M)
        self.meets = enc.links.meets if with_comms else None

    def of(self, c: int) -> list[tuple[int, bool]]:
        """(key, crosses ranks with no receive) of each thing code c waits for, as the
        engines see them; a buffered receive waits for the send it meets on its link."""
        k, sm = c & KIND_MASK, c >> KIND_BITS
        base = sm << SLOT_BITS
        if k <= COMPUTE_MAX:
            out = []
            slot = self.local_slot[k]
            if slot != NOTHING:
                out.append((base + slot, False))
            off = self.input_off[k][sm]
            if off != NOTHING:
                out.append((base + off, self.input_hop[k][sm // self.M]))
            return out
        need = self.need_off[k]
        if need is None:
            return []
        if self.meets is not None and k & RECEIVE_BIT and c in self.meets:
            return [(sent_key(self.meets[c]), False)]
        return [(base + need, False)]


def producers(done: int) -> list[int]:
    """The codes that can complete the key `done`, in the order to look for them."""
    sm = key_sm(done)
    return [sm_code(sm, k) for k in PRODUCERS[key_slot(done)]]


def compute_outputs(code: int) -> tuple[int, ...]:
    """The keys a compute action completes (B and I: the gradient it sends back; I also
    what its W waits for)."""
    k = kind_of(code)
    if k > COMPUTE_MAX:
        return ()
    return tuple(code_key(code, slot) for slot in _OUTPUT_SLOTS[k])


def describe_key(done: int, microbatches: int) -> tuple[int, int, int, str]:
    """(stage, microbatch, slot, text such as `1RECV_F3`) of the dependency key `done`."""
    sm, slot = key_sm(done), key_slot(done)
    stage, mb = divmod(sm, microbatches)
    return stage, mb, slot, f"{stage}{SLOT_NAMES[slot]}{mb}"


