"""PPS101, PPS102, PPS106, PPS208: is the program's shape consistent?

PPS101 - a stage runs on more than one rank, or not on the rank its placement names.
    Every stage lives on exactly one rank; its forwards, backwards, sends and receives all
    run there. FAIL: `placement=[0,1]` with `1F0` in rank 0's row. Fix: move the action to
    the rank that holds its stage, or change the placement.

PPS102 - the program's shape is inconsistent: a row count other than `ranks`, a placement
    that names a rank that does not exist or covers another number of stages, or an action
    whose stage or microbatch is out of range (programs built through the API; the parser
    reports these as PPS014).

PPS106 - backward work (`B`, `I`, `W`, `SEND_B`, `RECV_B`) in a program whose header says
    `mode=inference`. Fix: drop the backward work, or drop `mode=inference`.

PPS208 - a batch `<...>` that is empty or holds a compute action (programs built through
    the API; the parser reports these as PPS008).
"""

from __future__ import annotations

from collections.abc import Iterator
from ..diagnostics import Diagnostic
from ..wording import plural
from ..ir import Batch, kept_as_codes
from ..encoding import B, I, RECV_B, SEND_B, W, code, kind_of
from .context import Context

FAMILY = "structure"
CODES = ("PPS101", "PPS102", "PPS106", "PPS208")
REQUIRES: tuple[str, ...] = ()  # families that must have found no error


def check(ctx: Context) -> Iterator[Diagnostic]:
    p = ctx.program
    if len(p.rows) != p.ranks:
        yield ctx.diag("PPS102", f"the program has {plural(len(p.rows), 'row')} but {plural(p.ranks, 'rank')}",
                       help="give one row per rank")
    if len(p.placement) != p.stages:
        yield ctx.diag("PPS102", f"the placement covers {plural(len(p.placement), 'stage')} but the program has {p.stages}")
        return
    bad = [r for r in p.placement if not 0 <= r < p.ranks]
    if bad:
        yield ctx.diag("PPS102", f"the placement names rank {bad[0]}, but ranks are 0..{p.ranks - 1}")
        return
    for rank, step, action in ctx.enc.invalid:
        what = "stage" if not 0 <= action.stage < p.stages else "microbatch"
        yield ctx.diag("PPS102", f"`{action}` is out of range: {what}s are 0..{(p.stages if what == 'stage' else p.microbatches) - 1}",
                       rank, step)
    for rank in range(len(p.rows)):  # by index: a row kept as integers is not made into actions
        if not ctx.enc.groups[rank] and (ctx.enc.steps[rank] is None or kept_as_codes(p.rows, rank)):
            continue  # only plain actions (and idle steps) in this row (an empty batch leaves `steps` set)
        for step, st in enumerate(p.rows[rank]):
            if type(st) is Batch and (not st.parts or not all(a.kind.is_comm for a in st.parts)):
                yield ctx.diag("PPS208", f"the batch `{st}` holds something other than sends and receives"
                               if st.parts else "an empty batch", rank, step,
                               help="a batch fuses SEND_F, RECV_F, SEND_B and RECV_B actions only")
    yield from _placement(ctx)
    if p.mode == "inference":
        yield from _inference(ctx)


def _placement(ctx: Context) -> Iterator[Diagnostic]:
    p = ctx.program
    M = ctx.M
    explicit = p.source is not None and "placement" in p.source.options
    span = code(1, 0, 0, M)  # the codes of one stage: code // span is the stage
    for rank, codes in enumerate(ctx.enc.codes):
        stages = ctx.enc.stages_of(rank)
        stages.discard(-1)  # an out-of-range action (code -1), reported above
        wrong = sorted(s for s in stages if p.placement[s] != rank)
        for s in wrong:
            i = next(i for i, c in enumerate(codes) if c >= 0 and c // span == s)
            home = p.placement[s]
            why = f"the header places stage {s} on rank {home}" if explicit else f"stage {s} runs on rank {home}"
            yield ctx.diag("PPS101", f"{ctx.text(codes[i])} is on rank {rank}, but {why}", rank, ctx.enc.step_of(rank, i),
                           help="each stage runs on exactly one rank: move its actions there"
                                + ("" if explicit else " or write `placement=[...]` in the header"))


def _inference(ctx: Context) -> Iterator[Diagnostic]:
    backward = {B, I, W, SEND_B, RECV_B}
    for rank, codes in enumerate(ctx.enc.codes):
        found = [i for i, c in enumerate(codes) if c >= 0 and kind_of(c) in backward]
        if found:
            i = found[0]
            more = f" (and {len(found) - 1} more on this rank)" if len(found) > 1 else ""
            yield ctx.diag("PPS106", f"{ctx.text(codes[i])} is backward work, but the header says mode=inference{more}",
                           rank, ctx.enc.step_of(rank, i),
                           help="drop the backward work, or drop `mode=inference` to train")
