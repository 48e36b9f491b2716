"""`ir.Program` -> explicit `.pps` text (what `ppdsl expand` prints).

Every step is written out; `parse(print_program(p)) == p` for every program.
"""

from __future__ import annotations

from .. import placement as placement_mod
from ..ir import Program


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


def print_program(program: Program, comment: str | None = None) -> str:
    lines: list[str] = []
    if comment:
        lines.extend("# " + c if c else "#" for c in comment.splitlines())
    lines.append(header_line(program))
    if program.costs:
        lines.append("costs " + " ".join(f"{k}={_number(v)}" for k, v in program.costs))
    lines.append("")
    for rank, row in enumerate(program.rows):
        lines.append(f"rank {rank}: " + " ".join(map(str, row)) if row else f"rank {rank}:")
    return "\n".join(lines) + "\n"
