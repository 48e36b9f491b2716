"""The action kinds, one row each: everything ppdsl knows of a kind is read from `KINDS`.

A row (`KindRow`) says how the kind is spelled (in `.pps`, in each dialect of PyTorch's CSV),
its category (`compute`, `comm` or `stage`: a stage-only kind names a stage and no
microbatch), what it waits for and what it completes (as slots of its stage and microbatch,
`SLOTS`), whom a send or receive names as its peer, its effect on live activations, its key
in a cost model, its category in pictures (`PICTURES`) and which runtimes run it.

Everything else is derived from the table, here or where it is read: `Kind` (checked against
the table when this module loads), the category tests (`Kind.is_compute` ...) and the sets and
bounds the hot loops test (`COMPUTE_MAX`, `COMM_MAX`, `RECEIVE_BIT`, `EXCHANGE_BIT`), the bit
layout (`KIND_BITS`, `SLOT_BITS`, as wide as the table needs: a row or slot more widens them), the
dependency rule (`encoding.LOCAL_NEEDS` ... `encoding.PRODUCERS`, `links.PEER_OF_KIND`), the
readers' names (`KIND_BY_NAME`, `formats.torch_csv`'s dialects), the memory signs
(`memory.signs`), the cost keys (`costs.COMPUTE_KINDS`) and the pictures' legend and colours
(`render.timeline.CATEGORIES`, `render.timeline.COLOURS`). `tests/test_kinds_table.py` holds
every consumer to the table, and `derive(rows)` builds the derived tables of any table, so a
test can add a row without touching this one.

The hot loops (`semantics._Engine._loop`, `proofs.pairs_meet`) bind the derived constants to
locals once; a test holds them to the table and finds no kind or slot number spelled as a
literal in them.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Final, Literal, NamedTuple

Category = Literal["compute", "comm", "stage"]
# What an action does to its (stage, microbatch)'s activations (`memory.signs`): makes them
# live; frees them (a full backward); frees them when the backward is split (the weight
# gradient, which still needs the saved inputs); nothing.
# makes them live again after a forward that kept only its input (a recompute: that forward
# then counts nothing); moves them to host memory; brings them back.
Memory = Literal["live", "frees", "frees_split", "remakes", "moves_out", "moves_in", ""]
RUNTIMES: Final = frozenset(("torch", "paddle"))


class SlotRow(NamedTuple):
    """One thing that completes for a (stage, microbatch): the low bits of a dependency key."""

    name: str  # its constant in `layout` (`F_DONE`)
    value: int
    label: str  # how a key of it reads in a message: `1RECV_F3`


class Picture(NamedTuple):
    """A category of step in the pictures: its legend entry, colour, glyph in the overview and
    label in the terminal's legend. A kind names one (`KindRow.picture`); `step` marks those of
    a step of several actions (an overlapped pair, a batch), which no kind names."""

    key: str
    legend: str
    colour: str
    glyph: str
    label: str
    step: bool = False


class KindRow(NamedTuple):
    """One action kind. The slots are `SlotRow.name`s; a kind name in `peer` is another row's.

    The rows are named tuples, not attrs classes: ppdsl makes them whenever it loads, where an
    attrs class costs a millisecond or more to build (its methods are generated code)."""

    name: str  # the spelling in `.pps` and in PyTorch's current CSV: `0SEND_F3`, `1UNSHARD`
    value: int  # `Kind` value, a code's low bits
    category: Category
    legacy_csv: str = ""  # the spelling in PyTorch's legacy CSV (empty: as `name`)
    # A compute's needs: the slot of its own (stage, microbatch) it waits for; its input from a
    # neighbouring stage, (the stage step, the slot there); the slot of its own receive that
    # carries that input instead when the neighbour is on another rank.
    local: str | None = None
    input: tuple[int, str] | None = None
    received: str | None = None
    # A send's need: the slot of its own (stage, microbatch) holding what it sends.
    sends: str | None = None
    completes: tuple[str, ...] = ()
    peer: tuple[int, str] | None = None  # a send's or receive's: (stage step, the peer's kind)
    backward: bool = False
    memory: Memory = ""
    cost: str | None = None  # its key in a cost model (None: it takes no time of its own)
    picture: str = "OTHER"
    short: str = ""  # its label in a narrow cell (`SF3`); empty: its name
    runtimes: frozenset[str] = RUNTIMES
    in_csv: bool = True  # whether PyTorch's CSV has it (`convert` refuses to write one that is not)
    # Whether the whole-run reader cuts its words at its name's last letter. The reader cuts a
    # run at every such letter at once; a letter that also stands inside other names (R in
    # RECV_F, D in SEND_F) would cut those too, and every row of sends would need mending. A
    # kind that does not is read word by word in the rows that hold it.
    read_whole: bool = True
    # Where its time is spent: on the rank's compute lane, or on its copy lane beside it (a
    # move of activations to host memory and back, which the rank does not wait for; the
    # backward that reads what a reload brings back does).
    lane: Literal["compute", "copy"] = "compute"

    @property
    def csv(self) -> dict[str, str]:
        """Its spelling per CSV dialect."""
        return {"current": self.name, "legacy": self.legacy_csv or self.name}


# The slots of a key, in value order. NOTHING (`layout.NOTHING`, the top slot value) is not a
# row: no action completes it, every engine starts it as done.
SLOTS: Final[tuple[SlotRow, ...]] = (
    SlotRow("F_DONE", 0, "F"),
    SlotRow("GRAD_DONE", 1, "B"),  # the input gradient of a stage, by its B or its I
    SlotRow("I_DONE", 2, "I"),
    SlotRow("RECV_F_DONE", 3, "RECV_F"),
    SlotRow("RECV_B_DONE", 4, "RECV_B"),
    SlotRow("MSG_F_SENT", 5, "SEND_F"),
    SlotRow("MSG_B_SENT", 6, "SEND_B"),
)

# The categories of the pictures, in legend order.
PICTURES: Final[tuple[Picture, ...]] = (
    Picture("F", "forward", "#4c78a8", "F", "F"),
    Picture("B", "backward", "#54a24b", "B", "B"),
    Picture("I", "backward (input)", "#f58518", "I", "I"),
    Picture("W", "backward (weight)", "#b279a2", "W", "W"),
    Picture("R", "recompute", "#9ecae9", "R", "R"),
    Picture("MOVE", "offload / reload", "#ff9da6", "m", "OF/RL"),
    Picture("OVERLAP", "overlapped F+B", "#72b7b2", "+", "F+B", step=True),
    Picture("SEND", "send", "#8c8c8c", "s", "S"),
    Picture("RECV", "receive", "#bab0ac", "r", "R"),
    Picture("BATCH", "fused send/recv batch", "#9d755d", "<", "<n>", step=True),
    Picture("OTHER", "unshard / reshard / reduce", "#eeca3b", "u", "U/RS/RG"),
)

# The kinds. Rows are in listing order (a full backward before its halves: cost keys, the
# producers of a slot, the rule tables list them so); values place the compute kinds first,
# then the sends and receives, then the stage-only kinds (the hot loops tell them apart by
# `k <= COMPUTE_MAX` and `k > COMM_MAX`).
KINDS: Final[tuple[KindRow, ...]] = (
    KindRow("F", 0, "compute", input=(-1, "F_DONE"), received="RECV_F_DONE", completes=("F_DONE",),
            memory="live", cost="F", picture="F"),
    KindRow("B", 3, "compute", legacy_csv="BW", local="F_DONE", input=(1, "GRAD_DONE"), received="RECV_B_DONE",
            completes=("GRAD_DONE",), backward=True, memory="frees", cost="B", picture="B"),
    KindRow("I", 1, "compute", legacy_csv="B", local="F_DONE", input=(1, "GRAD_DONE"), received="RECV_B_DONE",
            completes=("GRAD_DONE", "I_DONE"), backward=True, cost="I", picture="I"),
    KindRow("W", 2, "compute", local="I_DONE", backward=True, memory="frees_split", cost="W", picture="W"),
    # The forward again, with autograd, from the input its `F` kept; after that `F` and before
    # the first backward, which its stage's row order makes wait for it (one rank runs both).
    KindRow("R", 4, "compute", local="F_DONE", memory="remakes", cost="R", picture="R", in_csv=False,
            read_whole=False),
    # The activations of a (stage, microbatch) to host memory and back, on the copy lane.
    KindRow("OFFLOAD", 5, "compute", local="F_DONE", memory="moves_out", cost="OFFLOAD", picture="MOVE",
            short="OF", in_csv=False, read_whole=False, lane="copy"),
    KindRow("RELOAD", 6, "compute", local="F_DONE", memory="moves_in", cost="RELOAD", picture="MOVE",
            short="RL", in_csv=False, read_whole=False, lane="copy"),
    KindRow("SEND_F", 8, "comm", sends="F_DONE", completes=("MSG_F_SENT",), peer=(1, "RECV_F"), cost="comm",
            picture="SEND", short="SF"),
    KindRow("RECV_F", 9, "comm", completes=("RECV_F_DONE",), peer=(-1, "SEND_F"), cost="comm", picture="RECV",
            short="RF"),
    KindRow("SEND_B", 10, "comm", sends="GRAD_DONE", completes=("MSG_B_SENT",), peer=(-1, "RECV_B"), cost="comm",
            picture="SEND", short="SB"),
    KindRow("RECV_B", 11, "comm", completes=("RECV_B_DONE",), peer=(1, "SEND_B"), cost="comm", picture="RECV",
            short="RB"),
    # A sharded stage's collectives, on the side lane with the copies: the all-gather of its
    # weights (the stage's next compute waits for it) and the reduction of its gradients.
    KindRow("UNSHARD", 12, "stage", short="U", cost="UNSHARD", lane="copy"),
    KindRow("RESHARD", 13, "stage", short="RS"),
    KindRow("REDUCE_GRAD", 14, "stage", short="RG", cost="REDUCE_GRAD", lane="copy"),
)

# Values the bit layout keeps free beyond what the tables use, for kinds and for slots. None:
# the layout is as wide as the tables need, and a row or slot that needs more widens it (every
# table over codes or keys doubles with a bit, so spare bits cost time on every program).
SPARE: Final = 0


_NAME = re.compile(r"[A-Z_]+\Z")


class TableError(ValueError):
    """A table of kinds that the layout or the hot loops cannot take, and why."""


class Derived(NamedTuple):
    """What the rest of ppdsl reads of a table of kinds, made by `derive` (a named tuple, as the
    rows are)."""

    rows: tuple[KindRow, ...]
    by_value: dict[int, KindRow]
    kind_bits: int
    kind_mask: int
    slot_bits: int
    slot_mask: int
    nothing: int  # the slot no action completes (the top slot value)
    slot_value: dict[str, int]
    compute: tuple[int, ...]  # values, ascending
    comm: tuple[int, ...]
    stage: tuple[int, ...]
    sends: tuple[int, ...]
    receives: tuple[int, ...]
    backward: tuple[int, ...]
    copy: tuple[int, ...]  # the kinds on the copy lane
    reloads: tuple[int, ...]  # the copy kinds that bring activations back (`memory` "moves_in")
    # The backwards that read their forward's activations (a local need of `F_DONE`): they
    # wait for a reload of their (stage, microbatch) to end.
    after_reload: tuple[int, ...]
    compute_max: int  # `k <= compute_max`: a compute
    comm_max: int  # `k > comm_max`: stage-only, or the end of a row (`kind_mask`)
    receive_bit: int  # among sends and receives, `k & receive_bit` is a receive
    exchange_bit: int  # in a row with no stage-only action, `k & exchange_bit` is a send or receive (0: none)
    names: dict[str, int]  # `.pps` and current CSV spelling -> value
    legacy_names: dict[str, int]
    cost_keys: tuple[str, ...]  # the cost keys of the computes and stage-only kinds, in listing order
    local_needs: tuple[tuple[int, int], ...]  # (the kind needed, the kind needing it)
    own_slot: dict[int, int]  # a kind needed locally -> the slot it completes
    input_from_stage: dict[int, tuple[int, int]]
    input_from_receive: dict[int, int]
    send_needs: dict[int, int]
    completes: dict[int, int]  # per send or receive: the slot it completes
    producers: dict[int, tuple[int, ...]]  # per slot: the kinds completing it
    peer_of_kind: dict[int, tuple[int, int]]
    slot_names: dict[int, str]  # per slot: its label in messages

    def signs(self, split: bool) -> list[int]:
        """Per kind value (a list of `kind_mask + 1`): +1 for the kind that makes its
        activations live, -1 for the one that frees them (`split`: the backward is split)."""
        sign = [0] * (self.kind_mask + 1)
        for row in self.rows:
            if row.memory in ("live", "remakes", "moves_in"):
                sign[row.value] = 1
            elif row.memory == "moves_out" or row.memory == ("frees_split" if split else "frees"):
                sign[row.value] = -1
        return sign


def derive(rows: Sequence[KindRow], slots: Sequence[SlotRow] = SLOTS, spare: int = SPARE) -> Derived:
    """The derived tables of a table of kinds (raises `TableError` for one the layout or the
    hot loops cannot take), with `spare` values left free in the layout's kind and slot bits."""
    rows = tuple(rows)
    by_value = {r.value: r for r in rows}
    by_name = {r.name: r for r in rows}
    if len(by_value) != len(rows) or len(by_name) != len(rows):
        raise TableError("two kinds share a value or a name")
    slot_value = {s.name: s.value for s in slots}
    if sorted(slot_value.values()) != list(range(len(slots))):
        raise TableError("slot values must be 0, 1, 2, ... with no gap")

    def values(category: str) -> tuple[int, ...]:
        return tuple(sorted(r.value for r in rows if r.category == category))

    compute, comm, stage = values("compute"), values("comm"), values("stage")
    # The sends and receives start at the first multiple of their block's size (a power of two)
    # at or after the compute kinds: one bit then marks them all (`EXCHANGE_BIT`), which the
    # hot loops test, and the values below them left free take more compute kinds.
    block = 1 << max(len(comm) - 1, 0).bit_length()
    comm_start = -(-len(compute) // block) * block
    expected = [*range(len(compute)), *range(comm_start, comm_start + len(comm) + len(stage))]
    if list(compute + comm + stage) != sorted(by_value):
        raise TableError("kind values must run compute, then send/receive, then stage-only")
    if sorted(by_value) != expected:
        raise TableError(f"kind values must be 0, 1, 2, ... with no gap, but for the sends and receives, which "
                         f"start at {comm_start} (the first multiple of {block} after the compute kinds)")
    sends = tuple(sorted(r.value for r in rows if r.category == "comm" and r.sends is not None))
    receives = tuple(sorted(set(comm) - set(sends)))
    receive_bit = 1
    if any(k & receive_bit for k in sends) or not all(k & receive_bit for k in receives):
        raise TableError("sends must have even values, receives odd")
    exchange_bit = next((b for b in (1 << i for i in range(8)) if all(k & b for k in comm)
                         and not any(k & b for k in compute)), 0)
    # Bits for every value, the spare ones and the top one: the row's end past every kind, and
    # NOTHING past every slot.
    kind_bits = (max(by_value, default=-1) + 1 + spare).bit_length()
    slot_bits = (len(slots) + spare).bit_length()
    compute_max = compute[-1] if compute else -1
    comm_max = comm[-1] if comm else compute_max
    for r in rows:
        for slot in (r.local, r.received, r.sends, *r.completes, r.input[1] if r.input else None):
            if slot is not None and slot not in slot_value:
                raise TableError(f"{r.name} names no slot `{slot}`")
        if (r.category == "comm") != (r.peer is not None) or (r.peer is not None and r.peer[1] not in by_name):
            raise TableError(f"{r.name}: a send or receive, and only one, names a peer kind")
        if r.category != "compute" and (r.local or r.input or r.received):
            raise TableError(f"{r.name}: only a compute waits for its own work or a neighbour's")
    # The readers cut a word between its kind's letters and its microbatch's digits.
    for r in rows:
        if not all(_NAME.match(name) for name in r.csv.values()):
            raise TableError(f"{r.name}: a kind's name is upper-case letters and `_`")
    producers: dict[int, tuple[int, ...]] = {}
    for s in slots:
        producers[s.value] = tuple(r.value for r in rows if s.name in r.completes)
    # A compute needs locally the kind that completes its `local` slot (one kind each).
    local_needs: list[tuple[int, int]] = []
    own_slot: dict[int, int] = {}
    for r in rows:
        if r.lane == "copy" and r.category == "comm":
            raise TableError(f"{r.name}: a send or receive meets its peer: it runs on no copy lane")
    for r in rows:
        if r.local is not None:
            made_by = [p for p in rows if r.local in p.completes and p.category == "compute" and p.value != r.value]
            if len(made_by) != 1:
                raise TableError(f"{r.name} waits for `{r.local}`, which one compute, and only one, must complete")
            needed = made_by[0]
            local_needs.append((needed.value, r.value))
            own_slot[needed.value] = slot_value[r.local]
    return Derived(
        rows=rows, by_value=by_value, kind_bits=kind_bits, kind_mask=(1 << kind_bits) - 1, slot_bits=slot_bits,
        slot_mask=(1 << slot_bits) - 1, nothing=(1 << slot_bits) - 1, slot_value=slot_value,
        compute=compute, comm=comm, stage=stage, sends=sends, receives=receives,
        backward=tuple(sorted(r.value for r in rows if r.backward)),
        copy=tuple(sorted(r.value for r in rows if r.lane == "copy")),
        reloads=tuple(sorted(r.value for r in rows if r.lane == "copy" and r.memory == "moves_in")),
        after_reload=tuple(sorted(r.value for r in rows if r.backward and r.local == "F_DONE")),
        compute_max=compute_max, comm_max=comm_max, receive_bit=receive_bit, exchange_bit=exchange_bit,
        names={r.name: r.value for r in sorted(rows, key=lambda r: r.value)},
        legacy_names={r.legacy_csv or r.name: r.value for r in sorted(rows, key=lambda r: r.value)},
        cost_keys=tuple(r.cost for r in rows if r.category != "comm" and r.cost is not None),
        local_needs=tuple(local_needs), own_slot=own_slot,
        input_from_stage={r.value: (r.input[0], slot_value[r.input[1]]) for r in rows if r.input is not None},
        input_from_receive={r.value: slot_value[r.received] for r in rows if r.received is not None},
        send_needs={r.value: slot_value[r.sends] for r in rows if r.sends is not None},
        completes={r.value: slot_value[r.completes[0]] for r in rows if r.category == "comm"},
        producers=producers,
        peer_of_kind={r.value: (r.peer[0], by_name[r.peer[1]].value) for r in rows if r.peer is not None},
        slot_names={s.value: s.label for s in slots},
    )


TABLE: Final = derive(KINDS)

KIND_BITS: Final = TABLE.kind_bits  # a code's low bits: the Kind value
KIND_MASK: Final = TABLE.kind_mask  # a code's or stage-kind's low bits: its kind (all set: no kind, a row's end)
SLOT_BITS: Final = TABLE.slot_bits  # a key's low bits: which thing of its (stage, microbatch) completed
SLOT_MASK: Final = TABLE.slot_mask
COMPUTE_MAX: Final = TABLE.compute_max
COMM_MAX: Final = TABLE.comm_max
RECEIVE_BIT: Final = TABLE.receive_bit
EXCHANGE_BIT: Final = TABLE.exchange_bit


class Kind(enum.IntEnum):
    """What an action does. Integer-valued so hashing stays in C on the hot paths. Its members
    are the rows of `KINDS` (checked below); its tests read the table's categories."""

    F = 0
    I = 1  # noqa: E741 - PyTorch's name for backward-input
    W = 2
    B = 3
    R = 4
    OFFLOAD = 5
    RELOAD = 6
    SEND_F = 8
    RECV_F = 9
    SEND_B = 10
    RECV_B = 11
    UNSHARD = 12
    RESHARD = 13
    REDUCE_GRAD = 14

    @property
    def is_compute(self) -> bool:
        return _IS_COMPUTE[self]

    @property
    def is_backward(self) -> bool:
        return _IS_BACKWARD[self]

    @property
    def is_comm(self) -> bool:
        return _IS_COMM[self]

    @property
    def on_copy_lane(self) -> bool:
        """Its time is spent on the rank's copy lane, beside its computes (OFFLOAD, RELOAD)."""
        return _IS_COPY[self]

    @property
    def is_send(self) -> bool:
        return _IS_SEND[self]

    @property
    def is_recv(self) -> bool:
        return _IS_RECV[self]

    @property
    def stage_only(self) -> bool:
        """A stage-only kind (UNSHARD, RESHARD, REDUCE_GRAD) names a stage but no microbatch."""
        return _IS_STAGE[self]

    @property
    def row(self) -> KindRow:
        """Its row of `KINDS`."""
        return TABLE.by_value[self]


if [(k.name, k.value) for k in Kind] != sorted(((r.name, r.value) for r in KINDS), key=lambda p: p[1]):
    raise TableError("`Kind`'s members must be the rows of `KINDS`, in value order: add the member beside the row")


def _flags(values: tuple[int, ...]) -> tuple[bool, ...]:
    return tuple(k in values for k in range(TABLE.kind_mask + 1))


_IS_COMPUTE, _IS_COMM, _IS_STAGE = _flags(TABLE.compute), _flags(TABLE.comm), _flags(TABLE.stage)
_IS_SEND, _IS_RECV, _IS_BACKWARD = _flags(TABLE.sends), _flags(TABLE.receives), _flags(TABLE.backward)
_IS_COPY = _flags(TABLE.copy)

KIND_BY_NAME: Final[dict[str, Kind]] = {name: Kind(v) for name, v in TABLE.names.items()}
