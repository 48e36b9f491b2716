"""PPS103, PPS104, PPS105: is every piece of work there exactly once?

PPS103 - a forward or backward is missing. Every (stage, microbatch) has one `F`, and in a
    training program either one `B` or one `I` and one `W`. FAIL (1 stage, 2 microbatches):
    `rank 0: 0F0 0F1 0B0`. Fix: add `0B1`, or declare `mode=inference` for a forward-only
    program. In a CSV, whose microbatch count is one past its largest microbatch, an action
    of a last microbatch that fewer than half the stages have is told instead of every
    stage's lack of it.

PPS104 - an action appears twice (anywhere in the program). FAIL: `rank 0: 0F0 0F0 0B0`.
    Fix: delete one. (Sends and receives twice are PPS203.)

PPS203 - (reported here) a send or receive appears twice.

PPS105 - a backward is both full and split (`B` and `I`), or split without its other half
    (`I` without `W` or `W` without `I`). FAIL: `rank 0: 0F0 0I0`. Fix: add `0W0`, or write
    `0B0` instead of the split pair.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from ..diagnostics import Diagnostic
from ..encoding import COMM_KINDS, RECV_B, B, F, I, W, kind_of, sm_code, sm_of
from .context import LOW, SHIFT, Context, mb_ranges

FAMILY = "completeness"
CODES = ("PPS103", "PPS104", "PPS105", "PPS203")
REQUIRES: tuple[str, ...] = ("structure",)  # families that must have found no error



def check(ctx: Context) -> Iterator[Diagnostic]:
    yield from _duplicates(ctx)
    pos = ctx.pos
    M = ctx.M
    train = ctx.program.mode == "train"
    f = ctx.column(F)
    stray = _stray_last_microbatch(ctx)
    if stray:
        yield from stray
    # Missing actions, less those of a stray last microbatch (told once above, not per stage).
    lacking = [sm for sm, x in enumerate(f) if x < 0 and not (stray and sm % M == M - 1)] if -1 in f else []
    if lacking:
        yield from _missing(ctx, lacking, "F", "forward")
    if not train:
        return
    b, i, w = ctx.column(B), ctx.column(I), ctx.column(W)
    SM = len(f)
    if (-1 not in b and i.count(-1) == SM and w.count(-1) == SM) or (b.count(-1) == SM and -1 not in i and -1 not in w):
        return  # every backward full, or every backward split
    # Backward state per (stage, mb): 4*B + 2*I + W; 4 (full) and 3 (split) are sound.
    state = [(x >= 0) * 4 + (y >= 0) * 2 + (z >= 0) for x, y, z in zip(b, i, w)]
    if stray:
        state[M - 1::M] = [4] * ctx.S  # the stray microbatch: told above
    none = [sm for sm, x in enumerate(state) if x == 0]
    yield from _missing(ctx, none, "B", "backward", "training needs a backward for every forward;"
                        " declare `mode=inference` in the header for a forward-only program")
    for sm, x in enumerate(state):
        if x in (0, 3, 4):
            continue
        stage, mb = divmod(sm, M)
        if x & 4:
            code = sm_code(sm, I if x & 2 else W)
            msg = f"`{stage}B{mb}` is a full backward, but {ctx.text(code)} splits the same backward"
            help_ = f"keep either `{stage}B{mb}` or the pair `{stage}I{mb}` `{stage}W{mb}`"
        elif x == 2:
            code = sm_code(sm, I)
            msg = f"`{stage}I{mb}` has no matching `{stage}W{mb}`"
            help_ = f"add `{stage}W{mb}` after it, or write `{stage}B{mb}` for a full backward"
        else:
            code = sm_code(sm, W)
            msg = f"`{stage}W{mb}` has no matching `{stage}I{mb}`"
            help_ = f"add `{stage}I{mb}` before it"
        rank, step = ctx.locate(pos[code])
        yield ctx.diag("PPS105", msg, rank, step, help=help_)


def _stray_last_microbatch(ctx: Context) -> list[Diagnostic]:
    """A CSV's microbatch count is read from its largest microbatch: one action numbered one
    past the rest (PyTorch 2.13's `Schedule1F1B` order has `3F8` for `3F0` on its last rank
    at 4 ranks x 8 microbatches) would make every other stage lack that microbatch. When the
    last microbatch is had by fewer than half the stages, each of its actions is told once
    instead (PPS103), and the stages without it are not."""
    source, S, M = ctx.program.source, ctx.S, ctx.M
    if source is None or source.format != "csv" or M < 2 or S < 2:
        return []
    codes = [c for s in range(S) for k in (F, B, I, W) if ctx.pos[c := sm_code(s * M + M - 1, k)] >= 0]
    having = {sm_of(c) // M for c in codes}  # the stages that have it
    if not having or 2 * len(having) >= S:
        return []
    others = [s for s in range(S) if s not in having]
    out = []
    for code in codes:
        rank, step = ctx.locate(ctx.pos[code])
        out.append(ctx.diag(
            "PPS103", f"{ctx.text(code)} is of microbatch {M - 1}, which stage{'s' * (len(others) > 1)} "
            f"{mb_ranges(others)} {'have' if len(others) > 1 else 'has'} no action of: this CSV's microbatch "
            f"count, {M}, is read from its largest microbatch", rank, step,
            help=f"number it within 0..{M - 2}, as the other stages' are (is it one past where it should be?)"))
    return out


def _missing(ctx: Context, sms: list[int], kind: str, what: str, help: str | None = None) -> Iterator[Diagnostic]:
    """PPS103 for each stage, located where the first missing action belongs (`_beside`)."""
    M = ctx.M
    by_stage: dict[int, list[int]] = {}
    for sm in sms:
        by_stage.setdefault(sm // M, []).append(sm % M)
    for stage, mbs in sorted(by_stage.items()):
        rank = ctx.program.placement[stage]
        noun = "microbatch" if len(mbs) == 1 else "microbatches"
        token = f"{stage}{kind}{mbs[0]}" if len(mbs) == 1 else f"{stage}{kind}{{...}}"
        step, where = _beside(ctx, stage, mbs[0], F if kind == "F" else B)
        first = f"`{stage}{kind}{mbs[0]}`"
        hint = f"add {first} {where}" + ("" if len(mbs) == 1 else ", and the other missing ones")
        yield ctx.diag("PPS103", f"stage {stage} (rank {rank}) has no {what} for {noun} {mb_ranges(mbs)} (`{token}`)",
                       rank, step, help=f"{hint}; {help}" if help else hint)


def _beside(ctx: Context, stage: int, mb: int, kind: int) -> tuple[int | None, str]:
    """Where a missing action of `stage` and `mb` belongs, as (the step to point at, words):
    after the same kind of the stage's closest earlier microbatch, else before its closest
    later one, else (a backward) after its own forward, else at the end of the row."""
    M = ctx.M
    base = stage * M
    kinds = (kind,) if kind == F else (B, W, I)  # a split backward ends with its W
    for k in kinds:
        column = ctx.column(k)
        earlier = next((column[base + m] for m in range(mb - 1, -1, -1) if column[base + m] >= 0), -1)
        if earlier >= 0:
            return _after(ctx, earlier, "after")
    for k in kinds:
        column = ctx.column(k)
        later = next((column[base + m] for m in range(mb + 1, M) if column[base + m] >= 0), -1)
        if later >= 0:
            return _after(ctx, later, "before")
    own_forward = ctx.column(F)[base + mb]
    if kind != F and own_forward >= 0:
        return _after(ctx, own_forward, "after")
    rank = ctx.program.placement[stage]
    steps = len(ctx.program.rows[rank])
    return (steps - 1 if steps else None), f"at the end of rank {rank}'s row"


def _after(ctx: Context, position: int, relation: str) -> tuple[int, str]:
    rank, step = ctx.locate(position)
    return step, f"{relation} {ctx.text(ctx.enc.codes[rank][position & LOW])} (step {step}) in rank {rank}'s row"


def _duplicates(ctx: Context) -> Iterator[Diagnostic]:
    if ctx.enc.unrepeated:
        return
    counts = Counter(c for codes in ctx.enc.codes for c in codes if c >= 0 and kind_of(c) <= RECV_B)  # stage-only actions aside
    repeated = {c for c, n in counts.items() if n > 1}
    if not repeated:
        return
    first = ctx.pos
    for rank, codes in enumerate(ctx.enc.codes):
        for i, c in enumerate(codes):
            if c in repeated and first[c] != (rank << SHIFT | i):
                r0, s0 = ctx.locate(first[c])
                code = "PPS203" if kind_of(c) in COMM_KINDS else "PPS104"
                yield ctx.diag(code, f"{ctx.text(c)} appears again; it first runs on rank {r0} at step {s0}",
                               rank, ctx.enc.step_of(rank, i), help="each action runs exactly once: delete one")
