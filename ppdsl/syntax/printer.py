"""`ir.Program` -> explicit `.pps` text (what `ppdsl expand` prints).

Every step is written out, or with `compact=True` runs are folded into ranges (`0F{0..3}`)
and zips (`[0F{4..7} 0B{0..3}]`); `parse(print_program(p)) == p` for every program either way.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import placement as placement_mod
from ..ir import Action, Program, Step

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
    for rank, row in enumerate(program.rows):
        text = compact_row(row) if compact else " ".join(map(str, row))
        lines.append(f"rank {rank}: {text}" if row else f"rank {rank}:")
    return "\n".join(lines) + "\n"
