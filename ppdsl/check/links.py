"""PPS212: do the messages on each link arrive in the order their receives expect them?

The transports match by position, not by name: on each directed link (sender rank, receiver
rank) the k-th receive a rank posts takes the k-th message the other rank sent on it
(`links.Links`; Paddle's send/recv and `batch_isend_irecv` carry no tag). So the k-th
send on a link must be the one the k-th receive names, or the data lands in the wrong place.

PPS212 - messages out of order on a link. FAIL (2 ranks, 2 microbatches):
    `rank 0: 0F0 0F1 0SEND_F1 0SEND_F0 ...` against `rank 1: 1RECV_F0 1RECV_F1 ...`: the first
    message on the link from rank 0 to rank 1 is `0SEND_F1`, but the first receive is
    `1RECV_F0`, so stage 1 would run microbatch 0 on microbatch 1's activation (or the
    transfer fails on a shape mismatch). Nothing hangs, under any model: reported instead of
    a deadlock. Fix: post the sends in the order the receives are posted (`0SEND_F0 0SEND_F1`),
    or the receives in the order of the sends. Forward activations and backward gradients
    that go the same way on a link (a V placement) share its order.

Only a link whose sends and receives pair up by name but not by position is reported here (a
send or receive without its partner is PPS201/PPS202). The deadlock family runs after this one
with the same matching rule, so a program that also hangs when matched by position gets
PPS210 as well, with a cycle that really happens.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..diagnostics import Diagnostic
from ..encoding import NO_PEER, RECV_F, SEND_F, kind_of, peer_code, sm_of
from .context import Context

FAMILY = "links"
CODES = ("PPS212",)
REQUIRES: tuple[str, ...] = ("structure", "completeness")  # families that must have found no error


def check(ctx: Context) -> Iterator[Diagnostic]:
    if not ctx.has_comms:
        return
    links = ctx.enc.links
    if links.meets is None:
        return  # every link's order agrees with the labels
    M = ctx.M
    for src, dst, k, send, recv in links.mismatches:
        sent, got = links.order[(src, dst)]
        if send == NO_PEER or recv == NO_PEER or sorted(peer_code(c, M) for c in sent) != sorted(got):
            continue  # not a reordering: a send or receive without its partner, PPS201/PPS202
        s_rank, s_step = ctx.locate(ctx.pos[send])
        r_rank, r_step = ctx.locate(ctx.pos[recv])
        s_stage, s_mb = divmod(sm_of(send), M)
        r_stage, r_mb = divmod(sm_of(recv), M)
        carried = "activation" if kind_of(send) == SEND_F else "gradient"
        wanted = "activation" if kind_of(recv) == RECV_F else "gradient"
        expected_send, expected_recv = peer_code(recv, M), peer_code(send, M)
        nth = _ordinal(k + 1)
        message = (f"messages out of order on the link from rank {src} to rank {dst}: the {nth} message rank {src} "
                   f"sends is {ctx.text(send)} ({ctx.where(s_rank, s_step)}), but the {nth} receive rank {dst} "
                   f"posts is {ctx.text(recv)} ({ctx.where(r_rank, r_step)}); the transport hands each receive the "
                   f"next message on its link, so microbatch {r_mb} of stage {r_stage} would be handed the {carried} "
                   f"of microbatch {s_mb} from stage {s_stage}"
                   + (f" where it expects a {wanted}" if carried != wanted else "")
                   + " (or the transfer fails on a shape mismatch)")
        help_ = (f"post them in one order: move {ctx.text(expected_send)} before {ctx.text(send)} on rank {src}, "
                 f"or {ctx.text(expected_recv)} before {ctx.text(recv)} on rank {dst}")
        yield ctx.diag("PPS212", message, r_rank, r_step, help=help_)


def _ordinal(n: int) -> str:
    if n % 100 in (11, 12, 13):
        return f"{n}th"
    return f"{n}" + {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
