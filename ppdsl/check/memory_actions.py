"""PPS109, PPS110, PPS111: are a microbatch's recompute, offload and reload where they can work?

A (stage, microbatch) may have one `R`, and one `OFFLOAD` with its `RELOAD`, all on its
stage's rank, whose row order is the order they run in. That each comes after its forward is
PPS107's rule (they wait for the `F`); a second of any is PPS104.

PPS109 - a recompute after the backward that needs it. `R` runs the forward again so that
    its backward has activations to read: it comes before the first backward (`B` or `I`)
    of its (stage, microbatch), and a program with no backward (`mode=inference`) has no use
    for it. FAIL: `rank 0: 0F0 0B0 0R0`. Fix: move `0R0` before `0B0`.

PPS110 - an `OFFLOAD` without its `RELOAD`, or a `RELOAD` without its `OFFLOAD`: the
    activations moved to host memory never come back, or what comes back was never moved.
    FAIL: `rank 0: 0F0 0OFFLOAD0 0B0`. Fix: add `0RELOAD0` before `0B0`.

PPS111 - the activations are read while they are in host memory, or moved before they are
    made: an action of the (stage, microbatch) that reads them (`B`, `I`, `W`, `R`) runs
    between its `OFFLOAD` and its `RELOAD`, the `RELOAD` comes before the `OFFLOAD`, or the
    `OFFLOAD` comes before the `R` that makes what it moves. FAIL:
    `rank 0: 0F0 0OFFLOAD0 0B0 0RELOAD0`. Fix: move `0RELOAD0` before `0B0`.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..diagnostics import Diagnostic
from ..encoding import B, I, W, sm_code
from ..ir import Kind
from .context import Context

FAMILY = "memory actions"
CODES = ("PPS109", "PPS110", "PPS111")
REQUIRES: tuple[str, ...] = ("structure",)  # families that must have found no error

R, OFFLOAD, RELOAD = int(Kind.R), int(Kind.OFFLOAD), int(Kind.RELOAD)
# The actions of a (stage, microbatch) that read its saved activations.
_READERS = (B, I, W, R)


def check(ctx: Context) -> Iterator[Diagnostic]:
    kinds = ctx.kinds
    if R not in kinds and OFFLOAD not in kinds and RELOAD not in kinds:
        return
    columns = {k: ctx.column(k) for k in (B, I, W, R, OFFLOAD, RELOAD) if k in kinds}
    absent = [-1] * ctx.S * ctx.M
    r, off, back = (columns.get(k, absent) for k in (R, OFFLOAD, RELOAD))
    full, inp = columns.get(B, absent), columns.get(I, absent)
    train = ctx.program.mode == "train"
    for sm in range(len(r)):
        if r[sm] < 0 and off[sm] < 0 and back[sm] < 0:
            continue
        # (where, code) of its first backward; (-1, -1): none
        first_backward = min(((p, sm_code(sm, k)) for p, k in ((full[sm], B), (inp[sm], I)) if p >= 0), default=(-1, -1))
        if r[sm] >= 0:
            yield from _recompute(ctx, sm, r[sm], first_backward, train)
        if (off[sm] < 0) != (back[sm] < 0):
            yield _unpaired(ctx, sm, off[sm], back[sm], first_backward)
        elif off[sm] >= 0:
            yield from _moved(ctx, sm, off[sm], back[sm], r[sm], columns)


def _recompute(ctx: Context, sm: int, at: int, first_backward: tuple[int, int], train: bool) -> Iterator[Diagnostic]:
    code = sm_code(sm, R)
    rank, step = ctx.locate(at)
    if not train:
        yield ctx.diag("PPS109", f"{ctx.text(code)} recomputes a forward that no backward reads (mode=inference)",
                       rank, step, help=f"delete {ctx.text(code)}: only a backward needs the activations again")
    elif 0 <= first_backward[0] < at:
        later = first_backward[1]
        _, b_step = ctx.locate(first_backward[0])
        yield ctx.diag("PPS109", f"{ctx.text(code)} at step {step} recomputes after {ctx.text(later)} at step {b_step}, "
                       "the backward that needs it", rank, step,
                       help=f"move {ctx.text(code)} before {ctx.text(later)}")


def _unpaired(ctx: Context, sm: int, off: int, back: int, first_backward: tuple[int, int]) -> Diagnostic:
    if off >= 0:
        code, missing = sm_code(sm, OFFLOAD), sm_code(sm, RELOAD)
        rank, step = ctx.locate(off)
        where = f" before {ctx.text(first_backward[1])}" if first_backward[0] > off else ""
        return ctx.diag("PPS110", f"{ctx.text(code)} moves activations to host memory and no "
                        f"{ctx.text(missing)} brings them back", rank, step,
                        help=f"add {ctx.text(missing)}{where}, or delete {ctx.text(code)}")
    code, missing = sm_code(sm, RELOAD), sm_code(sm, OFFLOAD)
    rank, step = ctx.locate(back)
    return ctx.diag("PPS110", f"{ctx.text(code)} brings back activations that no {ctx.text(missing)} moved",
                    rank, step, help=f"add {ctx.text(missing)} before it, or delete {ctx.text(code)}")


def _moved(ctx: Context, sm: int, off: int, back: int, r: int, columns: dict[int, list[int]]) -> Iterator[Diagnostic]:
    offload, reload = sm_code(sm, OFFLOAD), sm_code(sm, RELOAD)
    if back < off:
        rank, step = ctx.locate(back)
        yield ctx.diag("PPS111", f"{ctx.text(reload)} at step {step} comes before {ctx.text(offload)} at step "
                       f"{ctx.locate(off)[1]}", rank, step, help=f"move {ctx.text(reload)} after {ctx.text(offload)}")
        return
    if 0 <= off < r:
        rank, step = ctx.locate(off)
        yield ctx.diag("PPS111", f"{ctx.text(offload)} at step {step} moves activations that {ctx.text(sm_code(sm, R))} "
                       f"makes only at step {ctx.locate(r)[1]}", rank, step,
                       help=f"move {ctx.text(offload)} after {ctx.text(sm_code(sm, R))}")
        return
    readers = sorted((columns[k][sm], k) for k in _READERS if k in columns and off < columns[k][sm] < back)
    if readers:
        at, k = readers[0]
        reader = sm_code(sm, k)
        rank, step = ctx.locate(at)
        yield ctx.diag("PPS111", f"{ctx.text(reader)} at step {step} reads activations that {ctx.text(offload)} "
                       f"moved to host memory before {ctx.text(reload)} at step {ctx.locate(back)[1]} brings them back",
                       rank, step, help=f"move {ctx.text(reload)} before {ctx.text(reader)}")
