"""`ir.Program` -> explicit `.pps` text (what `ppdsl expand` prints).

Every step is written out, or with `compact=True` runs are folded into ranges (`0F{0..3}`)
and zips (`[0F{4..7} 0B{0..3}]`); `parse(print_program(p)) == p` for every program either way.

A row its reader kept as integers (`ir.LazyRows`) is written from them, two lookups of cached
token text a step, without making its Action objects; where the reader kept the row's own
text because it is exactly what would be written (`ir.written_as_read`), that text is used.
Other rows are written through `ActionText`, which keeps the text of each `[stage][kind]`
prefix and each microbatch number it has made: a row of plain actions becomes text by C-level maps
over the row and two dictionary lookups per action, not `Action.__str__` and an enum lookup
per action (which cost as much as parsing the file). `formats/torch_csv.py` writes its cells
through the same class with its dialect's names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import compress, repeat
from operator import add, attrgetter, getitem, is_not

from .. import placement as placement_mod
from ..encoding import KIND_MASK, KIND_OF, read_rows
from ..gather import gather
from ..ir import KIND_BITS, Action, Batch, Idle, Kind, Program, RowCodes, Step, row_length, written_as_read

_STAGE = attrgetter("stage")
_KIND = attrgetter("kind")
_MICRO = attrgetter("microbatch")


class ActionText:
    """Token text for actions, with the pieces cached: `ActionText().action(a) == str(a)`."""

    def __init__(self, names: Mapping[Kind, str] | None = None, stages: int = 0, microbatches: int = 0):
        """`stages` and `microbatches` fill the tables up front (each row then needs no pass to
        find what is missing); give them when the program is at least that large."""
        self._names = {k: k.name for k in Kind} if names is None else dict(names)
        # kind -> stage -> "12SEND_F"; microbatch -> "3" (None -> "").
        self._prefix: dict[Kind, dict[int, str]] = {k: {s: f"{s}{n}" for s in range(stages)} for k, n in self._names.items()}
        self._micro: dict[int | None, str] = {m: str(m) for m in range(microbatches)}
        self._micro[None] = ""
        # `stage << KIND_BITS | kind` -> "12SEND_F", for rows printed from a reader's integers.
        self._by_sk: dict[int | None, str] = {}
        # separator -> microbatch -> "3" + separator, for `read_row`.
        self._micro_then: dict[str, dict[int | None, str]] = {}

    @classmethod
    def for_program(cls, program: Program, names: Mapping[Kind, str] | None = None) -> ActionText:
        """Tables filled up front where the program has more steps than they have entries."""
        steps = sum(row_length(program.rows, rank) for rank in range(len(program.rows)))
        return cls(names, program.stages if len(Kind) * program.stages <= steps else 0,
                   program.microbatches if program.microbatches <= steps else 0)

    def action(self, a: Action) -> str:
        by_stage = self._prefix[a.kind]
        prefix = by_stage.get(a.stage)
        if prefix is None:
            prefix = by_stage[a.stage] = f"{a.stage}{self._names[a.kind]}"
        micro = self._micro.get(a.microbatch)
        if micro is None:
            micro = self._micro[a.microbatch] = str(a.microbatch)
        return prefix + micro

    def actions(self, actions: Sequence[Action]) -> list[str]:
        """The text of each of a run of plain actions, in C-level passes over the run."""
        kinds = list(map(_KIND, actions))
        stages = list(map(_STAGE, actions))
        micros = list(map(_MICRO, actions))
        table, micro = self._prefix, self._micro
        try:
            return list(map(add, map(getitem, map(table.__getitem__, kinds), stages), map(micro.__getitem__, micros)))
        except KeyError:
            pass
        distinct_stages = set(stages)
        for kind in set(kinds):  # fill what the run needs: few kinds x its stages
            by_stage = table[kind]
            for stage in distinct_stages.difference(by_stage):
                by_stage[stage] = f"{stage}{self._names[kind]}"
        for mb in set(micros).difference(micro):
            micro[mb] = str(mb)
        prefixes = map(getitem, map(table.__getitem__, kinds), stages)
        return list(map(add, prefixes, map(micro.__getitem__, micros)))

    def read_row(self, row: RowCodes, idle: str, separator: str) -> str:
        """A row as its reader kept it (`ir.RowCodes`), its steps joined by `separator`:
        two lookups a step, in C-level passes, and no Action object. The prefixes and the
        microbatches (each with the separator after it) are laid side by side in one list
        and joined once: a third faster than making each token and then joining those
        (0.07 s against 0.11 s for the 782,336 steps of `benchmarks/bench_cli.py`'s lowered
        file)."""
        sks, mbs = row
        if not sks:
            return ""
        by_sk = self._by_sk
        micro = self._micro_then.get(separator)
        if micro is None:
            micro = self._micro_then[separator] = {mb: text + separator for mb, text in self._micro.items()}
        pieces: list[str] = [""] * (2 * len(sks))
        try:
            pieces[0::2] = gather(by_sk, sks)
            pieces[1::2] = gather(micro, mbs)
        except KeyError:
            for sk in set(sks).difference(by_sk):
                by_sk[sk] = idle if sk is None else f"{sk >> KIND_BITS}{self._names[KIND_OF[sk & KIND_MASK]]}"
            for mb in set(mbs).difference(micro):
                micro[mb] = ("" if mb is None else str(mb)) + separator
            pieces[0::2] = gather(by_sk, sks)
            pieces[1::2] = gather(micro, mbs)
        pieces[-1] = pieces[-1][:len(pieces[-1]) - len(separator)]
        return "".join(pieces)

    def steps(self, row: Sequence[Step], other: Callable[[Step, int], str]) -> list[str]:
        """The text of each step of a row: runs of plain actions here, any other step by `other(step, index)`."""
        odd = list(compress(range(len(row)), map(is_not, map(type, row), repeat(Action))))
        if not odd:
            return self.actions(row)  # type: ignore[arg-type]
        out: list[str] = []
        start = 0
        for i in odd:
            out.extend(self.actions(row[start:i]))  # type: ignore[arg-type]
            out.append(other(row[i], i))
            start = i + 1
        out.extend(self.actions(row[start:]))  # type: ignore[arg-type]
        return out

    def pps_step(self, step: Step, index: int = 0) -> str:
        """A step that is not a plain action, as `.pps` writes it."""
        if type(step) is Idle:
            return "_"
        if type(step) is Batch:
            return "<" + " ".join(map(self.action, step.parts)) + ">"
        if type(step) is Action:
            return self.action(step)
        return "(" + ";".join(map(self.action, step.parts)) + ")"  # type: ignore[union-attr]


# Periods of the repeating patterns `compact_row` folds into a zip: 1 is a plain range.
_PERIODS = (1, 2, 3, 4)


def _number(value: float) -> str:
    value = float(value)
    # Whole numbers print as such, but not 1e300 as three hundred digits.
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def header_line(program: Program) -> str:
    parts = [f"pipeline ranks={program.ranks} microbatches={program.microbatches} stages={program.stages}"]
    name = placement_mod.name_of(program.placement, program.ranks)
    parts.append(f"placement={name}" if name else "placement=[" + ", ".join(map(str, program.placement)) + "]")
    if program.memory_limit is not None:
        parts.append(f"memory={_number(program.memory_limit)}")
    if program.mode != "train":
        parts.append(f"mode={program.mode}")
    return " ".join(parts)


def _repeats(row: Sequence[Step], i: int, k: int) -> int:
    """How many times the k steps from i repeat, each member's microbatch one higher each time."""
    head: list[Action] = []
    for a in row[i:i + k]:
        if type(a) is not Action or a.microbatch is None:
            return 0
        head.append(a)
    if len(head) < k:
        return 0
    n = 1
    while True:
        base = i + n * k
        if base + k > len(row):
            return n
        for q, a in enumerate(head):
            b = row[base + q]
            if type(b) is not Action or b.stage != a.stage or b.kind != a.kind or b.microbatch != a.microbatch + n:  # type: ignore[operator]
                return n
        n += 1


def compact_row(row: Sequence[Step]) -> str:
    """A row's steps with runs as ranges and repeating patterns as zips (greedy, longest first)."""
    out: list[str] = []
    i = 0
    while i < len(row):
        best: tuple[int, str] | None = None  # (steps covered, text), kept only when shorter than plain
        for k in _PERIODS:
            n = _repeats(row, i, k)
            if n < 2:
                continue
            members = []
            for a in row[i:i + k]:
                assert type(a) is Action and a.microbatch is not None
                members.append(f"{a.stage}{a.kind.name}{{{a.microbatch}..{a.microbatch + n - 1}}}")
            text = members[0] if k == 1 else "[" + " ".join(members) + "]"
            plain = sum(len(str(x)) + 1 for x in row[i:i + n * k]) - 1
            if len(text) < plain and (best is None or n * k > best[0]):
                best = (n * k, text)
        if best is None:
            out.append(str(row[i]))
            i += 1
        else:
            out.append(best[1])
            i += best[0]
    return " ".join(out)


def print_program(program: Program, comment: str | None = None, compact: bool = False) -> str:
    lines: list[str] = []
    if comment:
        lines.extend("# " + c if c else "#" for c in comment.splitlines())
    lines.append(header_line(program))
    if program.costs:
        lines.append("costs " + " ".join(f"{k}={_number(v)}" for k, v in program.costs))
    lines.append("")
    text = ActionText.for_program(program)
    read = read_rows(program)
    known = read if read is not None and not compact else [None] * len(program.rows)
    for rank in range(len(program.rows)):
        as_read = known[rank]
        if as_read is not None:  # as its reader kept it: no Action object is made
            written = written_as_read(program.rows, rank) or text.read_row(as_read, "_", " ")
        else:
            row = program.rows[rank]
            written = compact_row(row) if compact else " ".join(text.steps(row, text.pps_step))
        lines.append(f"rank {rank}: {written}" if written else f"rank {rank}:")
    return "\n".join(lines) + "\n"
