"""PPS107: does each rank run a microbatch's work of a stage in a possible order?

PPS107 - a backward runs before its forward, or a `W` before its `I`, on the same rank.
    A backward needs the activations its forward saved; a weight gradient needs the input
    gradient's intermediate results. FAIL: `rank 0: 0B0 0F0`. Fix: swap them.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import compress, repeat
from operator import and_, lt

from ..diagnostics import Diagnostic
from ..encoding import LOCAL_NEEDS, sm_code
from .context import ABSENT_LAST, Context

FAMILY = "order"
CODES = ("PPS107",)
REQUIRES: tuple[str, ...] = ("structure",)  # families that must have found no error


def check(ctx: Context) -> Iterator[Diagnostic]:
    pos = ctx.pos
    # One pass per pair of kinds; a missing action is PPS103's business, so compare only
    # when both are there (a missing later action counts as past everything, a missing
    # earlier one as -1).
    kinds = ctx.kinds
    for before, after in LOCAL_NEEDS:  # the dependency rule within one stage and microbatch
        if before not in kinds or after not in kinds:
            continue
        first = ctx.column(before)
        then = ctx.column(after)
        if -1 in then:  # mask only when some are absent: the usual column is compared as it is
            then = list(map(and_, then, repeat(ABSENT_LAST)))
        if not any(map(lt, then, first)):
            continue
        wrong = list(compress(range(len(then)), map(lt, then, first)))
        for sm in wrong:
            a, b = sm_code(sm, before), sm_code(sm, after)
            rank, step = ctx.locate(pos[b])
            _, step_a = ctx.locate(pos[a])
            yield ctx.diag("PPS107", f"{ctx.text(b)} at step {step} runs before {ctx.text(a)} at step {step_a} on rank {rank}",
                           rank, step, help=f"move {ctx.text(b)} after {ctx.text(a)}: it needs what {ctx.text(a)} computes")
