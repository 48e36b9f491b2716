"""PPS201-PPS207: in a program with sends and receives, does every hand-off between ranks
have exactly one send and one receive, in the right places?

A forward output crosses from stage s to s+1 as `sSEND_Fm` (on s's rank) and
`(s+1)RECV_Fm` (on s+1's rank); an input gradient crosses from s to s-1 as `sSEND_Bm` and
`(s-1)RECV_Bm`.

PPS201 - a send has no matching receive. FAIL: `rank 0: 0F0 0SEND_F0` with no `1RECV_F0` on
    rank 1. Fix: add the receive before `1F0`.
PPS202 - a receive has no matching send. Fix: add the send after the compute that produces it.
PPS203 - a send or receive appears twice (see completeness).
PPS204 - a send or receive between two stages on the same rank: that hand-off is local and
    needs no message. Fix: delete the pair.
PPS205 - a send runs before the compute that produces its data. FAIL: `0SEND_F0 0F0`.
    Fix: move the send after `0F0`.
PPS206 - a compute runs before the receive that feeds it (`1F0 1RECV_F0`), or no send and
    receive carry its input from the other rank at all. Fix: receive first; add the pair.
PPS207 - a send or receive to a stage that does not exist (`SEND_F` of the last stage,
    `RECV_F` of stage 0, `SEND_B` of stage 0, `RECV_B` of the last stage).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import compress, repeat
from operator import add, gt, lshift, lt, or_, sub

from ..diagnostics import Diagnostic
from ..semantics import B, F, I, RECV_B, RECV_F, SEND_B, SEND_F
from .context import Context

FAMILY = "comms"
CODES = ("PPS201", "PPS202", "PPS204", "PPS205", "PPS206", "PPS207")
REQUIRES: tuple[str, ...] = ("structure",)  # families that must have found no error

_NEVER = 1 << 62


def check(ctx: Context) -> Iterator[Diagnostic]:
    if not ctx.has_comms:
        return
    pos = ctx.pos
    get, has = pos.get, pos.__contains__
    S, M = ctx.S, ctx.M
    SM = S * M
    placement = ctx.program.placement
    # The (stage * M + mb) of every send/receive of each kind, sorted: one C-level pass each.
    present = {k: list(compress(range(SM), map(has, range(k, SM << 4, 16)))) for k in (SEND_F, RECV_F, SEND_B, RECV_B)}

    def at(code: int) -> tuple[int, int]:
        return ctx.locate(pos[code])

    # Sends and receives that point outside the pipeline, or stay on one rank.
    reported: set[int] = set()
    partner_kind = {SEND_F: RECV_F, RECV_F: SEND_F, SEND_B: RECV_B, RECV_B: SEND_B}
    for k, step_to, edge in ((SEND_F, 1, S - 1), (RECV_F, -1, 0), (SEND_B, -1, 0), (RECV_B, 1, S - 1)):
        sms = present[k]
        suspicious = [edge] + [s for s in range(S) if s != edge and placement[s] == placement[s + step_to]]
        for stage in suspicious:
            lo, hi = bisect_left(sms, stage * M), bisect_left(sms, stage * M + M)
            for sm in sms[lo:hi]:
                code = sm << 4 | k
                reported.add(code)
                if stage == edge:
                    rank, step = at(code)
                    where = "after the last stage" if step_to > 0 else "before stage 0"
                    yield ctx.diag("PPS207", f"{ctx.text(code)} names a stage {where}", rank, step,
                                   help="delete it: there is no such stage")
                    continue
                partner = (sm + step_to * M) << 4 | partner_kind[k]
                if k in (RECV_F, RECV_B) and partner in pos:
                    continue  # reported once, on the send
                rank, step = at(code)
                yield ctx.diag("PPS204", f"{ctx.text(code)} hands data between stages {stage} and {stage + step_to}, "
                               f"both on rank {placement[stage]}", rank, step,
                               help="a hand-off inside one rank is local: delete the send and its receive")

    # Pairing, by set differences.
    for send, recv, delta in ((SEND_F, RECV_F, M), (SEND_B, RECV_B, -M)):
        sends, recvs = set(present[send]), set(present[recv])
        shifted = set(map(add, sends, repeat(delta)))
        for sm in sorted(map(sub, shifted - recvs, repeat(delta))):
            code = sm << 4 | send
            if code in reported:
                continue
            rank, step = at(code)
            peer = (sm + delta) << 4 | recv
            target = placement[(sm + delta) // M]
            yield ctx.diag("PPS201", f"{ctx.text(code)} has no matching {ctx.text(peer)} on rank {target}", rank, step,
                           help=f"add {ctx.text(peer)} to rank {target}'s row before the compute that uses it")
        for sm in sorted(recvs - shifted):
            code = sm << 4 | recv
            if code in reported:
                continue
            rank, step = at(code)
            peer = (sm - delta) << 4 | send
            source = placement[(sm - delta) // M]
            yield ctx.diag("PPS202", f"{ctx.text(code)} has no matching {ctx.text(peer)} on rank {source}", rank, step,
                           help=f"add {ctx.text(peer)} to rank {source}'s row after the compute that produces it")

    # A send after its producer; a receive before its consumer. Both run on the stage's rank
    # (structure holds), so global indices compare as positions in one row.
    kinds = ctx.kinds
    for k, producer in ((SEND_F, F), (SEND_B, B), (SEND_B, I)):
        if producer not in kinds:
            continue
        sms = present[k]
        base = list(map(lshift, sms, repeat(4)))
        sent = list(map(pos.__getitem__, map(or_, base, repeat(k))))
        made = list(map(get, map(or_, base, repeat(producer)), repeat(-1)))
        for j in compress(range(len(sms)), map(gt, made, sent)):
            sm = sms[j]
            code = sm << 4 | k
            rank, step = at(code)
            yield ctx.diag("PPS205", f"{ctx.text(code)} at step {step} sends what {ctx.text(sm << 4 | producer)} "
                           f"computes later, at step {ctx.locate(made[j])[1]}", rank, step,
                           help="move the send after the compute")
    for k, consumer in ((RECV_F, F), (RECV_B, B), (RECV_B, I)):
        if consumer not in kinds:
            continue
        sms = present[k]
        base = list(map(lshift, sms, repeat(4)))
        got = list(map(pos.__getitem__, map(or_, base, repeat(k))))
        used = list(map(get, map(or_, base, repeat(consumer)), repeat(_NEVER)))
        for j in compress(range(len(sms)), map(lt, used, got)):
            sm = sms[j]
            code, user = sm << 4 | k, sm << 4 | consumer
            rank, step = at(user)
            yield ctx.diag("PPS206", f"{ctx.text(user)} at step {step} runs before {ctx.text(code)} at step "
                           f"{at(code)[1]} receives its input", rank, step,
                           help=f"move {ctx.text(code)} before {ctx.text(user)}")

    # Hand-offs between ranks that nothing carries.
    carried_f = set(present[RECV_F]).union(map(add, present[SEND_F], repeat(M)))
    carried_b = set(present[RECV_B]).union(map(sub, present[SEND_B], repeat(M)))
    for stage in range(1, S):
        if placement[stage] == placement[stage - 1]:
            continue
        span = range(stage * M, stage * M + M)
        for sm in sorted(set(span) - carried_f):
            if (sm << 4) in pos:
                rank, step = at(sm << 4)
                yield ctx.diag("PPS206", f"{ctx.text(sm << 4)} needs `{stage - 1}F{sm % M}` from rank "
                               f"{placement[stage - 1]}, but no send and receive carry it", rank, step,
                               help=f"add `{stage - 1}SEND_F{sm % M}` on rank {placement[stage - 1]} and "
                                    f"`{stage}RECV_F{sm % M}` before it, or lower the compute-only program "
                                    "with `ppdsl expand --comms`")
        for back in sorted(set(range(stage * M - M, stage * M)) - carried_b):
            waiting = next((back << 4 | c for c in (B, I) if (back << 4 | c) in pos), None)
            if waiting is not None:
                rank, step = at(waiting)
                yield ctx.diag("PPS206", f"{ctx.text(waiting)} needs the gradient of stage {stage} from rank "
                               f"{placement[stage]}, but no send and receive carry it", rank, step,
                               help=f"add `{stage}SEND_B{back % M}` on rank {placement[stage]} and "
                                    f"`{stage - 1}RECV_B{back % M}` before it")
