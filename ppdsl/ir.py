"""The intermediate representation: the one currency between every part of ppdsl.

A `Program` holds one tuple of steps per rank. A step is an `Action` (one
`[stage][kind][microbatch]` token), an `Overlap` (a forward and a backward that run
overlapped, PyTorch's OVERLAP_F_B), a `Batch` (sends and receives fused into one
`batch_isend_irecv`), or `IDLE` (an explicit `_` that carries no work).

Source positions live in a `SourceMap` beside the rows and take no part in equality,
so `parse(format(p)) == p` compares meaning, not layout.

The readers keep a row of plain tokens as integers (`RowCodes`: `stage << KIND_BITS | kind`
and the microbatch per step) in a `LazyRows`, which makes the row's Action objects only when
a pass asks for them; the encoding, the printers and the checker's row-length questions read
the integers (`row_length`, `trailing_idle`, `kept_as_codes`, `encoding.read_rows`).
"""

from __future__ import annotations

import functools

import bisect
import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, repeat
from operator import is_, is_not
from typing import Final, Literal, Union, cast, overload

import attrs
from attrs import field, frozen

from .kinds import KIND_BITS as KIND_BITS, KIND_BY_NAME as KIND_BY_NAME, KIND_MASK as KIND_MASK, Kind as Kind


@frozen
class Action:
    """One `[stage][kind][microbatch]` token, e.g. `0F3` or `2SEND_B1` or `1UNSHARD`."""

    stage: int
    kind: Kind
    microbatch: int | None = None

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.kind.name}{mb}"


# Building an Action through attrs' frozen __init__ costs a Python-level setattr per field;
# the parser makes hundreds of thousands, so it fills the slots directly.
_new = object.__new__
_set_stage = Action.__dict__["stage"].__set__
_set_kind = Action.__dict__["kind"].__set__
_set_mb = Action.__dict__["microbatch"].__set__
_sink: deque[object] = deque(maxlen=0)
_consume = _sink.extend  # runs an iterator to its end at C speed, keeping nothing


def make_action(stage: int, kind: Kind, microbatch: int | None) -> Action:
    """Same result as `Action(stage, kind, microbatch)`, about twice as fast."""
    a: Action = _new(Action)
    _set_stage(a, stage)
    _set_kind(a, kind)
    _set_mb(a, microbatch)
    return a


def make_actions(n: int, stages: Iterable[int], kinds: Iterable[Kind], microbatches: Iterable[int | None]) -> list[Action]:
    """n Actions from three columns, made and filled by C-level passes: the readers of large
    files and lowering build rows this way (a Python call per Action, as `make_action` takes,
    costs more than the three slot writes: 0.07 s against 0.11 s for 274k actions)."""
    made: list[Action] = list(map(_new, repeat(Action, n)))
    _consume(map(_set_stage, made, stages))
    _consume(map(_set_kind, made, kinds))
    _consume(map(_set_mb, made, microbatches))
    return made


# A code's low bits hold the Kind value (`encoding` builds on this layout): KIND_BITS and
# KIND_MASK, sized from the table of kinds (`ppdsl/kinds.py`).

# One row as a reader saw it, without Action objects: per step `stage << KIND_BITS | kind`
# and the microbatch (both None for an idle step; the microbatch None for a stage-only kind).
RowCodes = tuple[list[Union[int, None]], list[Union[int, None]]]


def _two_parts(_: object, __: attrs.Attribute[tuple[Action, ...]], value: tuple[Action, ...]) -> None:
    if len(value) != 2:
        raise ValueError("an overlapped pair has exactly two actions")


@frozen
class Overlap:
    """A forward and a backward of two stages run overlapped: `(0F7;7B3)`."""

    parts: tuple[Action, ...] = field(validator=_two_parts)

    def __str__(self) -> str:
        return "(" + ";".join(str(p) for p in self.parts) + ")"


@frozen
class Batch:
    """Sends and receives of one rank fused into one call: `<0SEND_F3 0RECV_B0>`."""

    parts: tuple[Action, ...]

    def __str__(self) -> str:
        return "<" + " ".join(str(p) for p in self.parts) + ">"


@frozen
class Idle:
    """An explicit idle step `_`: kept so a written timeline survives a round trip."""

    def __str__(self) -> str:
        return "_"


IDLE: Final = Idle()


Step = Union[Action, Overlap, Batch, Idle]


def actions_of(step: Step) -> tuple[Action, ...]:
    """The actions a step performs, in written order (none for an idle step)."""
    if type(step) is Action:
        return (step,)
    if type(step) is Idle:
        return ()
    return step.parts  # type: ignore[union-attr]


def steps_from_codes(row: RowCodes, idle: object) -> list[object]:
    """The steps a reader's `RowCodes` stand for (`idle` for an idle step), made in bulk."""
    sks, mbs = row
    distinct = set(sks)
    stage: dict[int | None, int] = {sk: sk >> KIND_BITS for sk in distinct if sk is not None}
    kind: dict[int | None, Kind] = {sk: Kind(sk & KIND_MASK) for sk in distinct if sk is not None}
    if None in distinct:  # a placeholder action, replaced below
        stage[None], kind[None] = 0, Kind.F
    made: list[object] = list(make_actions(len(sks), map(stage.__getitem__, sks), map(kind.__getitem__, sks), mbs))
    if None in distinct:
        for i in compress(range(len(sks)), map(is_, sks, repeat(None))):
            made[i] = idle
    return made


class LazyRows(Sequence[tuple["Step", ...]]):
    """A program's rows where a reader kept them as integers (`codes[rank]`, a `RowCodes`):
    each such row's Action objects are made the first time the row is asked for, so a pass
    that reads only the integers (the encoding, the printer, `action_count`) makes none.
    Rows the reader built as steps are in `made`. Compares, hashes and prints as the tuple
    of rows it stands for.

    `texts[rank]`, where the reader gives it, is the row's own `.pps` text when that text is
    what the printer would write for the row's codes (canonical tokens and `_`, one blank
    between them, nothing else): `written_as_read` hands it to the printer, which then makes
    no text."""

    __slots__ = ("made", "codes", "texts")

    def __init__(self, made: list[tuple[Step, ...] | None], codes: list[RowCodes | None],
                 texts: list[str | None] | None = None):
        self.made = made
        self.codes = codes
        self.texts: list[str | None] = texts if texts is not None else [None] * len(made)

    def __len__(self) -> int:
        return len(self.made)

    @overload
    def __getitem__(self, index: int) -> tuple[Step, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[tuple[Step, ...], ...]: ...

    def __getitem__(self, index: int | slice) -> tuple[Step, ...] | tuple[tuple[Step, ...], ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self.made))[index])
        row = self.made[index]
        if row is None:
            codes = self.codes[index]
            assert codes is not None
            row = self.made[index] = cast("tuple[Step, ...]", tuple(steps_from_codes(codes, IDLE)))
        return row

    def __iter__(self) -> Iterator[tuple[Step, ...]]:
        return map(self.__getitem__, range(len(self.made)))

    def rows(self) -> tuple[tuple[Step, ...], ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyRows):  # row by row; two rows kept as integers compare as such, in C
            if len(self) != len(other):
                return False
            for mine, theirs, rank in zip(self.codes, other.codes, range(len(self))):
                if mine is not None and theirs is not None:
                    if mine != theirs:
                        return False
                elif self[rank] != other[rank]:
                    return False
            return True
        if isinstance(other, tuple):
            return self.rows() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.rows())

    def __repr__(self) -> str:
        return repr(self.rows())

    def __reduce__(self) -> tuple[type, tuple[tuple[tuple[Step, ...], ...]]]:
        return tuple, (self.rows(),)

    def step_count(self, rank: int) -> int:
        """len(self[rank]), without making the row."""
        codes = self.codes[rank]
        return len(codes[0]) if codes is not None and self.made[rank] is None else len(self[rank])


# A program's rows: a tuple of rows, or the rows a reader or lowering keeps as integers.
Rows = Union[tuple[tuple[Step, ...], ...], LazyRows]


def kept_as_codes(rows: Sequence[Sequence[Step]], rank: int) -> bool:
    """Whether a reader kept this row as integers: its steps are then plain actions and idle ones."""
    return isinstance(rows, LazyRows) and rows.codes[rank] is not None


def written_as_read(rows: Sequence[Sequence[Step]], rank: int) -> str | None:
    """A row as the `.pps` printer writes it, taken from the text the reader read it from
    (`LazyRows.texts`); None where the reader kept no such text."""
    return rows.texts[rank] if isinstance(rows, LazyRows) else None


def row_length(rows: Sequence[Sequence[Step]], rank: int) -> int:
    """len(rows[rank]), without making a row kept as integers into actions."""
    return rows.step_count(rank) if isinstance(rows, LazyRows) else len(rows[rank])


def trailing_idle(rows: Sequence[Sequence[Step]], rank: int) -> int:
    """How many idle steps end a rank's row (a row kept as integers is read as such)."""
    if isinstance(rows, LazyRows) and rows.made[rank] is None:
        codes = rows.codes[rank]
        assert codes is not None
        sks = codes[0]
        return next(compress(range(len(sks)), map(is_not, reversed(sks), repeat(None))), len(sks))
    row = rows[rank]
    trailing = 0
    while trailing < len(row) and type(row[len(row) - 1 - trailing]) is Idle:
        trailing += 1
    return trailing


Mode = Literal["train", "inference"]


@frozen
class Span:
    """A 1-based position in a source file; `end_column` is exclusive."""

    line: int
    column: int
    end_column: int | None = None


@frozen
class Segment:
    """Steps `first`, `first+1`, ... of a row were written from (line, column) on.

    For a run of plain tokens `run` holds its text, so the column of each token is found
    only when a diagnostic needs it rather than stored for every action.
    """

    first: int
    line: int
    column: int
    run: str | None = None
    # None: `run` is blank-separated tokens (.pps); ",": it is a CSV row, one step per cell.
    delimiter: str | None = None

    def offsets(self) -> list[tuple[int, int]]:
        """(start, end) of each step's text in `run`; end == start for an empty CSV cell."""
        if self.run is None:
            return []
        if self.delimiter is None:
            return [(m.start(), m.end()) for m in _WORD_RE.finditer(self.run)]
        out = []
        start = 0
        for cell in self.run.split(self.delimiter):
            lead = len(cell) - len(cell.lstrip())
            out.append((start + lead, start + max(lead, len(cell.rstrip()))))
            start += len(cell) + len(self.delimiter)
        return out

    def span(self, k: int, offsets: list[tuple[int, int]]) -> Span:
        """Where the k-th step of this segment was written, given `offsets()`."""
        if 0 <= k < len(offsets):
            a, b = offsets[k]
            return Span(self.line, self.column + a, self.column + b if b > a else None)
        return Span(self.line, self.column)


_WORD_RE = re.compile(r"\S+")


@frozen(eq=False)
class SourceMap:
    """Where each step of a program was written.

    Kept outside equality: two programs that mean the same are equal however they were laid
    out. Rows a generator made have no segments; their steps point at the `use` line.
    """

    path: str
    text: str = field(repr=False)
    header: Span
    rows: tuple[Span | None, ...]
    steps: tuple[tuple[Segment, ...] | None, ...] = ()
    options: dict[str, Span] = field(factory=dict, repr=False)
    format: str = "pps"  # or "csv": advice on fixing the input is worded for what it is
    costs_line: Span | None = None  # where the `costs` line starts, when there is one
    cost_spans: dict[str, Span] = field(factory=dict, repr=False)  # where that line writes each key

    def step_span(self, rank: int, index: int) -> Span:
        segments = self.steps[rank] if 0 <= rank < len(self.steps) else None
        if segments:
            i = bisect.bisect_right([s.first for s in segments], index) - 1
            if i >= 0:
                seg = segments[i]
                return seg.span(index - seg.first, seg.offsets())
        if 0 <= rank < len(self.rows):
            span = self.rows[rank]
            if span is not None:
                return span
        return self.header


@frozen
class Generated:
    """How a program's rows were made when a `use NAME(...)` line made them."""

    name: str
    arguments: tuple[tuple[str, int | float | str], ...] = ()


@frozen
class Program:
    """A whole schedule: every rank's steps, in order, and the shape they run on."""

    ranks: int
    stages: int
    microbatches: int
    placement: tuple[int, ...]
    rows: Rows
    mode: Mode = "train"
    memory_limit: float | None = None
    costs: tuple[tuple[str, float], ...] = ()
    generated: Generated | None = field(default=None, eq=False)
    source: SourceMap | None = field(default=None, eq=False, repr=False)
    # Tables derived from the program once and kept with it (its integer encoding, the
    # checker's last analysis): a program is immutable, so they stay right for its life,
    # and they go when it goes (never a module-level cache keyed by id()). `evolve` starts
    # a new program with none.
    derived: dict[str, object] = field(factory=dict, init=False, eq=False, repr=False)

    def rank_of(self, stage: int) -> int:
        return self.placement[stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        by_rank = self._stages_by_rank
        if 0 <= rank < len(by_rank):
            return by_rank[rank]
        return tuple(s for s, r in enumerate(self.placement) if r == rank)  # a malformed program

    @functools.cached_property
    def _stages_by_rank(self) -> tuple[tuple[int, ...], ...]:
        # One pass, kept on the program: callers ask per rank, and a scan of the placement per
        # rank is ranks x stages (9e9 at 65,536 ranks in a V).
        found: list[list[int]] = [[] for _ in range(max(self.ranks, 0))]
        for s, r in enumerate(self.placement):
            if 0 <= r < len(found):
                found[r].append(s)
        return tuple(tuple(stages) for stages in found)

    def actions(self) -> Iterator[tuple[int, int, Action]]:
        """Every action with its rank and step index, rank by rank."""
        for rank, row in enumerate(self.rows):
            for index, step in enumerate(row):
                for action in actions_of(step):
                    yield rank, index, action

    @functools.cached_property
    def action_count(self) -> int:
        # Kept: reading bounds a file by it twice (`load.check_steps`, `load.check_slots`).
        total = 0
        rows = self.rows
        if isinstance(rows, LazyRows):  # the rows a reader kept as integers: count those
            for rank, codes in enumerate(rows.codes):
                if codes is not None:
                    total += len(codes[0]) - codes[0].count(None)
                else:
                    total += _actions_in(rows[rank])
            return total
        return sum(map(_actions_in, rows))

    def evolve(self, **changes: object) -> Program:
        return attrs.evolve(self, **changes)  # type: ignore[arg-type]


def _actions_in(row: Sequence[Step]) -> int:
    """The actions a row of steps performs, counted by the steps' types in C: one a plain step,
    none an idle one, and the members of each pair or batch."""
    types = list(map(type, row))
    total = len(types) - types.count(Idle)
    if types.count(Action) + types.count(Idle) < len(types):  # pairs or batches
        grouped = list(compress(row, map(_GROUPED.__contains__, types)))
        total += sum(map(len, map(actions_of, grouped))) - len(grouped)
    return total


_GROUPED = frozenset((Overlap, Batch))


def require_program(value: object) -> None:
    """TypeError for a public function given something other than a Program (a path, the text):
    said at the call, not as an AttributeError from deep inside."""
    if not isinstance(value, Program):
        raise TypeError(f"expected a ppdsl Program (from ppdsl.load_program(path) or ppdsl.parse(text)), "
                        f"not {type(value).__name__}")
