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

from collections.abc import Iterator
from itertools import compress, repeat
from operator import and_, ge, gt

from ..diagnostics import Diagnostic
from ..encoding import (COMM_KINDS, COMPLETES, INPUT_FROM_RECEIVE, PEER_OF_KIND, PRODUCERS, SEND_NEEDS, B, F, I,
                        RECV_B, RECV_F, SEND_B, SEND_F, sm_code)
from .context import ABSENT_LAST, RELOWER, Context

FAMILY = "comms"
CODES = ("PPS201", "PPS202", "PPS204", "PPS205", "PPS206", "PPS207")
REQUIRES: tuple[str, ...] = ("structure",)  # families that must have found no error


def check(ctx: Context) -> Iterator[Diagnostic]:
    if not ctx.has_comms:
        return
    pos = ctx.pos
    S, M = ctx.S, ctx.M
    placement = ctx.program.placement
    col = {k: ctx.column(k) for k in (F, I, B, SEND_F, RECV_F, SEND_B, RECV_B)}

    def at(code: int) -> tuple[int, int]:
        return ctx.locate(pos[code])

    # Sends and receives that point outside the pipeline, or stay on one rank.
    reported: set[int] = set()
    for k in COMM_KINDS:
        step_to, partner = PEER_OF_KIND[k]  # which stage and kind it names as its peer
        edge = S - 1 if step_to > 0 else 0
        suspicious = [edge] + [s for s in range(S) if s != edge and placement[s] == placement[s + step_to]]
        for stage in suspicious:
            lo = stage * M
            for sm in compress(range(lo, lo + M), map(ge, col[k][lo:lo + M], repeat(0))):
                code = sm_code(sm, k)
                reported.add(code)
                if stage == edge:
                    rank, step = at(code)
                    where = "after the last stage" if step_to > 0 else "before stage 0"
                    yield ctx.diag("PPS207", f"{ctx.text(code)} names a stage {where}", rank, step,
                                   help="delete it: there is no such stage")
                    continue
                partner_code = sm_code(sm + step_to * M, partner)
                if k in (RECV_F, RECV_B) and pos[partner_code] >= 0:
                    continue  # reported once, on the send
                rank, step = at(code)
                yield ctx.diag("PPS204", f"{ctx.text(code)} hands data between stages {stage} and {stage + step_to}, "
                               f"both on rank {placement[stage]}", rank, step,
                               help="a hand-off inside one rank is local: delete the send and its receive")

    # Pairing: a send of (s, m) meets the receive of (s+1, m) forward, (s-1, m) backward.
    # Stage by stage: where both are there for every microbatch (or neither is), the stage
    # pairs up, decided by two C-level scans.
    for send in (SEND_F, SEND_B):
        step_to, recv = PEER_OF_KIND[send]
        sends, recvs = col[send], col[recv]
        for stage in range(S):
            peer_stage = stage + step_to
            if not 0 <= peer_stage < S:
                continue  # sends out of the pipeline: PPS207 above
            lo, peer_lo = stage * M, peer_stage * M
            here, there = sends[lo:lo + M], recvs[peer_lo:peer_lo + M]
            here_some, there_some = -1 in here, -1 in there
            if not here_some and not there_some:
                continue
            if here_some and there_some and here.count(-1) == M and there.count(-1) == M:
                continue
            for m in range(M):
                if (here[m] >= 0) == (there[m] >= 0):
                    continue
                if here[m] >= 0:  # a send without its receive
                    code = sm_code(lo + m, send)
                    if code in reported:
                        continue
                    rank, step = at(code)
                    peer = sm_code(peer_lo + m, recv)
                    target = placement[peer_stage]
                    yield ctx.diag("PPS201", f"{ctx.text(code)} has no matching {ctx.text(peer)} on rank {target}", rank, step,
                                   help=f"add {ctx.text(peer)} to rank {target}'s row before the compute that uses it")
                else:  # a receive without its send
                    code = sm_code(peer_lo + m, recv)
                    if code in reported:
                        continue
                    rank, step = at(code)
                    peer = sm_code(lo + m, send)
                    source = placement[stage]
                    yield ctx.diag("PPS202", f"{ctx.text(code)} has no matching {ctx.text(peer)} on rank {source}", rank, step,
                                   help=f"add {ctx.text(peer)} to rank {source}'s row after the compute that produces it")

    # A send after its producer; a receive before its consumer. Both run on the stage's rank
    # (structure holds), so global indices compare as positions in one row. An absent
    # producer or consumer is PPS103's business: it never counts as late here.
    kinds = ctx.kinds
    for k, producer in ((k, p) for k, slot in SEND_NEEDS.items() for p in PRODUCERS[slot]):
        if producer not in kinds:
            continue
        for sm in _later(col[producer], col[k], M):
            code = sm_code(sm, k)
            rank, step = at(code)
            yield ctx.diag("PPS205", f"{ctx.text(code)} at step {step} sends what {ctx.text(sm_code(sm, producer))} "
                           f"computes later, at step {ctx.locate(col[producer][sm])[1]}", rank, step,
                           help="move the send after the compute")
    for k, consumer in ((k, c) for k in (RECV_F, RECV_B) for c, slot in INPUT_FROM_RECEIVE.items()
                        if slot == COMPLETES[k]):
        if consumer not in kinds:
            continue
        for sm in _later(col[k], col[consumer], M):
            code, user = sm_code(sm, k), sm_code(sm, consumer)
            rank, step = at(user)
            yield ctx.diag("PPS206", f"{ctx.text(user)} at step {step} runs before {ctx.text(code)} at step "
                           f"{at(code)[1]} receives its input", rank, step,
                           help=f"move {ctx.text(code)} before {ctx.text(user)}")

    # Hand-offs between ranks that nothing carries: stage s's forward input arrives by
    # `sRECV_Fm` (or at least `(s-1)SEND_Fm` names it); stage s-1's gradient likewise.
    for stage in range(1, S):
        if placement[stage] == placement[stage - 1]:
            continue
        lo = stage * M
        recv_f, send_f = col[RECV_F][lo:lo + M], col[SEND_F][lo - M:lo]
        if -1 in recv_f:
            for m in range(M):
                sm = lo + m
                if recv_f[m] < 0 and send_f[m] < 0 and pos[sm_code(sm, F)] >= 0:
                    rank, step = at(sm_code(sm, F))
                    yield ctx.diag("PPS206", f"{ctx.text(sm_code(sm, F))} needs `{stage - 1}F{m}` from rank "
                                   f"{placement[stage - 1]}, but no send and receive carry it", rank, step,
                                   help=f"add `{stage - 1}SEND_F{m}` on rank {placement[stage - 1]} and "
                                        f"`{stage}RECV_F{m}` before it, or {RELOWER}")
        recv_b, send_b = col[RECV_B][lo - M:lo], col[SEND_B][lo:lo + M]
        if -1 in recv_b:
            for m in range(M):
                back = lo - M + m
                if recv_b[m] >= 0 or send_b[m] >= 0:
                    continue
                waiting = next((sm_code(back, c) for c in (B, I) if pos[sm_code(back, c)] >= 0), None)
                if waiting is not None:
                    rank, step = at(waiting)
                    yield ctx.diag("PPS206", f"{ctx.text(waiting)} needs the gradient of stage {stage} from rank "
                                   f"{placement[stage]}, but no send and receive carry it", rank, step,
                                   help=f"add `{stage}SEND_B{m}` on rank {placement[stage]} and "
                                        f"`{stage - 1}RECV_B{m}` before it")


def _later(late: list[int], early: list[int], M: int) -> list[int]:
    """The `stage * M + mb` where both actions are there and `late` comes after `early`
    (positions from `ctx.column`, -1 where absent). Where `early` is there for every (stage,
    microbatch), one comparison pass over the whole columns answers (`late` absent is -1,
    never after anything); else stage by stage, a stage with all of `early` there without
    masking."""
    if -1 not in early:  # every earlier action there: one pass over the whole columns
        return list(compress(range(len(late)), map(gt, late, early))) if any(map(gt, late, early)) else []
    out: list[int] = []
    for lo in range(0, len(late), M):
        e = early[lo:lo + M]
        if -1 in e:
            if e.count(-1) == len(e):
                continue  # none of them: nothing to compare
            e = list(map(and_, e, repeat(ABSENT_LAST)))  # absent: past everything, so never "earlier"
        x = late[lo:lo + M]
        if any(map(gt, x, e)):
            out += compress(range(lo, lo + M), map(gt, x, e))
    return out
