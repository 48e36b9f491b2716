"""PPS401-PPS403: warnings. They never fail `ppdsl lint` (exit 0).

PPS401 - the microbatches of a stage run out of order (e.g. `0F1` before `0F0`), neither
    increasing nor wholly reversed. Legal, but usually a typo.
PPS402 - a rank has no work at all: its row is empty or idle.
PPS403 - idle steps at the end of a row (`_` in a .pps file, empty cells in a CSV): they do nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from operator import lt

from ..diagnostics import Diagnostic
from ..wording import plural
from ..ir import row_length, trailing_idle
from ..encoding import B, F, I, W, sm_code
from .context import Context

FAMILY = "warnings"
CODES = ("PPS401", "PPS402", "PPS403")
REQUIRES: tuple[str, ...] = ("structure",)  # families that must have found no error

_NAMES = {F: "forwards", B: "backwards", I: "input gradients (I)", W: "weight gradients (W)"}


def check(ctx: Context) -> Iterator[Diagnostic]:
    S, M = ctx.S, ctx.M
    kinds = [k for k in (F, B, I, W) if k in ctx.kinds]
    for k in kinds:
        column = ctx.column(k)
        for stage in range(S):
            base = stage * M
            at = column[base:base + M]
            if -1 not in at and all(map(lt, at, at[1:])):
                continue  # the common case, decided without a Python-level loop
            present = [(x, m) for m, x in enumerate(at) if x >= 0]
            if len(present) < 2:
                continue
            ordered = [x for x, _ in present]
            if all(a < b for a, b in zip(ordered, ordered[1:])) or all(a > b for a, b in zip(ordered, ordered[1:])):
                continue  # in order, or deliberately reversed (LIFO backwards, as looped BFS)
            j = next(j for j in range(1, len(present)) if present[j][0] < present[j - 1][0])
            late, early = present[j - 1], present[j]  # `late` is the smaller microbatch, run later
            rank, step = ctx.locate(late[0])
            yield ctx.diag("PPS401", f"stage {stage} runs its {_NAMES[k]} out of order: "
                           f"{ctx.text(sm_code(base + late[1], k))} comes after {ctx.text(sm_code(base + early[1], k))}",
                           rank, step, warning=True, help="run microbatches in increasing order unless you mean it")
    rows = ctx.program.rows
    for rank in range(len(rows)):  # by index: a row kept as integers is not made into actions
        if not ctx.enc.codes[rank] if rank < len(ctx.enc.codes) else True:
            yield ctx.diag("PPS402", f"rank {rank} has no work", rank, None, warning=True,
                           help="give it a stage, or use fewer ranks")
            continue
        trailing = trailing_idle(rows, rank)
        if trailing:
            step = row_length(rows, rank) - trailing
            in_csv = ctx.program.source is not None and ctx.program.source.format == "csv"
            yield ctx.diag("PPS403", f"rank {rank} ends with {plural(trailing, 'idle step')}", rank, step, warning=True,
                           help="delete the empty cells at the end of the row (its trailing commas): they do nothing"
                           if in_csv else "delete the trailing `_`: they do nothing")
