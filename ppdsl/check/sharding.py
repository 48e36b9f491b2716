"""PPS112, PPS113: does a sharded stage compute on gathered weights, and reduce whole gradients?

A stage with an `UNSHARD` anywhere in the file is a sharded stage (FSDP: each rank of its
group holds a shard of its weights). `UNSHARD` gathers them, `RESHARD` frees the gathered
copy, `REDUCE_GRAD` reduces the stage's gradients over its group (and over its replicas).
They name a stage and no microbatch, may appear several times, and run in their rank's row
order.

PPS112 - a compute action of a sharded stage runs while its weights are not gathered: before
    the stage's first `UNSHARD`, or after a `RESHARD` and before the next `UNSHARD`; or a
    `RESHARD` frees weights that no `UNSHARD` gathered. FAIL:
    `rank 0: 0UNSHARD 0F0 0RESHARD 0B0`. Fix: move `0RESHARD` after `0B0`.

PPS113 - a `REDUCE_GRAD` before the stage's last backward of the step (`B`, or `W` with a
    split backward): the gradients it reduces are not whole yet, and what comes after it is
    never reduced. FAIL: `rank 0: 0F0 0F1 0B0 0REDUCE_GRAD 0B1`. Fix: move `0REDUCE_GRAD`
    after `0B1`.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..diagnostics import Diagnostic
from ..encoding import B, W, sm_code
from ..ir import Action, Kind
from ..shard_actions import WEIGHT_USERS
from .context import Context

FAMILY = "sharding"
CODES = ("PPS112", "PPS113")
REQUIRES: tuple[str, ...] = ("structure",)  # families that must have found no error

UNSHARD, RESHARD, REDUCE_GRAD = int(Kind.UNSHARD), int(Kind.RESHARD), int(Kind.REDUCE_GRAD)


def check(ctx: Context) -> Iterator[Diagnostic]:
    kinds = ctx.kinds
    if UNSHARD in kinds or RESHARD in kinds:  # rare: read the rows
        rows: list[list[tuple[int, Action]]] = [[] for _ in ctx.program.rows]
        for rank, step, action in ctx.program.actions():
            rows[rank].append((step, action))
        sharded = {a.stage for row in rows for _, a in row if a.kind is Kind.UNSHARD}
        for rank, row in enumerate(rows):
            yield from _gathered(ctx, rank, row, sharded)
    if REDUCE_GRAD in kinds:  # PyTorch's GPipe and 1F1B end every row with one: read the columns
        yield from _reduced(ctx)


def _text(action: Action) -> str:
    return f"`{action}`"


def _gathered(ctx: Context, rank: int, row: list[tuple[int, Action]], sharded: set[int]) -> Iterator[Diagnostic]:
    """PPS112, the first problem of each sharded stage on this rank."""
    # stage -> (is it gathered, the action that last changed that); absent: never gathered yet
    state: dict[int, tuple[bool, Action]] = {}
    reported: set[int] = set()
    for step, a in row:
        s = a.stage
        if s not in sharded or s in reported:
            continue
        if a.kind is Kind.UNSHARD:
            state[s] = (True, a)
        elif a.kind is Kind.RESHARD:
            if not state.get(s, (False, a))[0]:
                reported.add(s)
                yield ctx.diag("PPS112", f"{_text(a)} at step {step} frees stage {s}'s gathered weights, but no "
                               "`UNSHARD` gathered them", rank, step,
                               help=f"move {_text(a)} after the stage's `{s}UNSHARD`, or delete it")
                continue
            state[s] = (False, a)
        elif a.kind in WEIGHT_USERS:
            gathered, by = state.get(s, (False, a))
            if gathered:
                continue
            reported.add(s)
            if by is a:  # no UNSHARD yet
                yield ctx.diag("PPS112", f"{_text(a)} at step {step} computes with stage {s}'s weights before "
                               f"`{s}UNSHARD` gathers them (stage {s} is sharded: it has an `UNSHARD`)", rank, step,
                               help=f"move `{s}UNSHARD` before {_text(a)}")
            else:
                yield ctx.diag("PPS112", f"{_text(a)} at step {step} computes with stage {s}'s weights after "
                               f"{_text(by)} freed them", rank, step,
                               help=f"move {_text(by)} after {_text(a)}, or add `{s}UNSHARD` before {_text(a)}")


def _reduced(ctx: Context) -> Iterator[Diagnostic]:
    """PPS113: each stage's first REDUCE_GRAD against its last gradient-making backward (a later
    REDUCE_GRAD of the stage comes after the first, so the first decides)."""
    M = ctx.M
    reduce = ctx.column(REDUCE_GRAD)  # a stage-only action sits at microbatch 0
    backward = [(ctx.column(k), k) for k in (B, W) if k in ctx.kinds]
    for s in range(ctx.S):
        at = reduce[s * M]
        if at < 0:
            continue
        last, code = -1, -1
        for col, k in backward:
            part = col[s * M:(s + 1) * M]
            latest = max(part)
            if latest > last:
                last, code = latest, sm_code(s * M + part.index(latest), k)
        if last > at:
            rank, step = ctx.locate(at)
            b_step = ctx.locate(last)[1]
            yield ctx.diag("PPS113", f"`{s}REDUCE_GRAD` at step {step} reduces stage {s}'s gradients before "
                           f"{ctx.text(code)} at step {b_step} adds to them", rank, step,
                           help=f"move `{s}REDUCE_GRAD` after {ctx.text(code)}")
