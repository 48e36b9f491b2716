"""PPS107: does each rank run a microbatch's work of a stage in a possible order?

PPS107 - a backward runs before its forward, or a `W` before its `I`, on the same rank.
    A backward needs the activations its forward saved; a weight gradient needs the input
    gradient's intermediate results. FAIL: `rank 0: 0B0 0F0`. Fix: swap them.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import repeat
from operator import lt

from ..diagnostics import Diagnostic
from ..semantics import B, F, I, W
from .context import Context

FAMILY = "order"
CODES = ("PPS107",)
REQUIRES: tuple[str, ...] = ("structure",)  # families that must have found no error

_NEVER = 1 << 62


def check(ctx: Context) -> Iterator[Diagnostic]:
    pos = ctx.pos
    get = pos.get
    SM = ctx.S * ctx.M
    # One pass per pair of kinds; a missing action is PPS103's business, so compare only
    # when both are there (a missing later action maps to _NEVER, a missing earlier one to -1).
    kinds = ctx.kinds
    for before, after in ((F, B), (F, I), (I, W)):
        if before not in kinds or after not in kinds:
            continue
        first = list(map(get, range(before, SM << 4, 16), repeat(-1)))
        then = list(map(get, range(after, SM << 4, 16), repeat(_NEVER)))
        late = list(map(lt, then, first))
        if not any(late):
            continue
        wrong = [sm for sm, x in enumerate(late) if x]
        for sm in wrong:
            a, b = sm << 4 | before, sm << 4 | after
            rank, step = ctx.locate(pos[b])
            _, step_a = ctx.locate(pos[a])
            yield ctx.diag("PPS107", f"{ctx.text(b)} at step {step} runs before {ctx.text(a)} at step {step_a} on rank {rank}",
                           rank, step, help=f"move {ctx.text(b)} after {ctx.text(a)}: it needs what {ctx.text(a)} computes")
