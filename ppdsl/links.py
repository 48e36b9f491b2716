"""Whom a send or receive names as its peer, and which one it meets on its link.

The peer rule (`PEER_OF_KIND`): SEND_F(s,m) <-> RECV_F(s+1,m) carries an activation,
SEND_B(s,m) <-> RECV_B(s-1,m) a gradient. The matching rule (`Links`): on each directed link
the k-th receive posted takes the k-th send; `in_label_order` decides from the position table
whether the two agree, so the usual program needs no scan of its rows.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import add, and_, eq, lt
from typing import TYPE_CHECKING

from .gather import gather
from .layout import COMM_KINDS, KIND_BITS, KIND_MASK, KIND_SPACE, RECV_B, RECV_F, SEND_B, SEND_F, code_space, kind_of, kind_slice

if TYPE_CHECKING:
    from .encoding import Encoded

# A send or receive with nothing to meet on its link (more sends than receives on it): its
# peer is a code no rank ever posts, so it waits forever.
NO_PEER = -1


# The operation a send or receive names as its peer, per kind: (stage step, peer kind).
# SEND_F(s,m) <-> RECV_F(s+1,m) carries an activation, SEND_B(s,m) <-> RECV_B(s-1,m) a gradient.
PEER_OF_KIND: dict[int, tuple[int, int]] = {SEND_F: (1, RECV_F), RECV_F: (-1, SEND_F), SEND_B: (-1, RECV_B),
                                            RECV_B: (1, SEND_B)}


def named_deltas(M: int) -> list[int]:
    """Per kind: `code + delta[kind]` is the operation a send or receive names as its peer."""
    delta = [0] * KIND_SPACE
    for k, (step, peer) in PEER_OF_KIND.items():
        delta[k] = (step * M << KIND_BITS) + peer - k
    return delta


def peer_of(kind: int, stage: int) -> tuple[int, int]:
    """(kind, stage) of the operation a send or receive of `stage` names as its peer."""
    step, peer = PEER_OF_KIND[kind]
    return peer, stage + step


def peer_stage(stage: int, kind: int) -> int:
    """The stage on the other end of a send or receive of `stage` (maybe outside the pipeline)."""
    return stage + PEER_OF_KIND[kind][0]


class Links:
    """The matching rule of every transport and model: on each directed link (sender rank,
    receiver rank) the k-th receive posted takes the k-th message sent, whatever its label.
    Paddle's send/recv and `batch_isend_irecv` on gloo and NCCL carry no tag. A rank posts its
    operations in row order and a batch its members as written, so the k-th of each is fixed
    by the text: forward activations and backward gradients that go the same way on a link
    (a V placement) share its order.

    `order[(src, dst)]` holds (the link's send codes in src's row order, its receive codes in
    dst's row order), filled only when some link's order is not its label order (found from
    the position table, `in_label_order`, without a scan in the usual case). `meets` is None when on every link the k-th send is the peer the k-th
    receive names (`peer_code`): matching by position and by name agree, and the engine's
    arithmetic stands. Otherwise `meets` maps each code whose partner on the link differs from
    the named one to that partner (NO_PEER: none), and `mismatches` gives, per such link, the
    first position where they differ: (src, dst, k, send code, receive code), NO_PEER for the
    side that has run out.
    """

    __slots__ = ("order", "meets", "mismatches")

    @classmethod
    def by_construction(cls) -> Links:
        """The links of a program whose maker puts every link in label order (lowering, whose
        rows all follow one global order of exchanges): nothing differs, nothing to scan."""
        links = cls.__new__(cls)
        links.order, links.meets, links.mismatches = {}, None, []
        return links

    def __init__(self, enc: Encoded, scan: bool = False):
        """`scan`: read every row even when the position table shows label order (tests
        compare the two ways)."""
        self.order: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        self.meets: dict[int, int] | None = None
        self.mismatches: list[tuple[int, int, int, int, int]] = []
        if not scan and in_label_order(enc):
            return  # the usual case, decided from the position table without a scan
        self._scan(enc)

    def _scan(self, enc: Encoded) -> None:
        S, M = enc.stages, enc.microbatches
        placement = enc.placement
        # Per code: which end of which link it is, `other rank << 1 | is a send` (-1: not a send
        # or receive, or one to a stage outside the pipeline, PPS207); one entry past the code
        # space for INVALID_CODE. One lookup per code, then two scans per link of a row.
        end = [-1] * (code_space(S, M) + 1)
        for s in range(S):
            for k in COMM_KINDS:
                t = peer_stage(s, k)
                if 0 <= t < S:
                    end[kind_slice(s, k, M)] = [placement[t] << 1 | (k in (SEND_F, SEND_B))] * M
        for r, codes in enumerate(enc.codes):
            ends = gather(end, codes)
            for e in set(ends):
                if e < 0:
                    continue
                mine = list(compress(codes, map(eq, ends, repeat(e))))
                o = e >> 1
                if e & 1:
                    self.order.setdefault((r, o), ([], []))[0].extend(mine)
                else:
                    self.order.setdefault((o, r), ([], []))[1].extend(mine)
        delta = named_deltas(M)
        for (src, dst), (sent, got) in sorted(self.order.items()):
            named = list(map(add, sent, gather(delta, map(and_, sent, repeat(KIND_MASK)))))
            if named == got:
                continue
            meets: dict[int, int] = self.meets if self.meets is not None else {}
            self.meets = meets
            n = max(len(sent), len(got))
            first = next((k for k in range(n) if k >= len(sent) or k >= len(got) or named[k] != got[k]), n)
            self.mismatches.append((src, dst, first, sent[first] if first < len(sent) else NO_PEER,
                                    got[first] if first < len(got) else NO_PEER))
            for k in range(first, n):
                sc = sent[k] if k < len(sent) else NO_PEER
                rc = got[k] if k < len(got) else NO_PEER
                if sc != NO_PEER and rc != sc + delta[kind_of(sc)]:
                    meets[sc] = rc
                if rc != NO_PEER and sc != rc + delta[kind_of(rc)]:
                    meets[rc] = sc



def in_label_order(enc: Encoded) -> bool:
    """Whether on every link the k-th send is the one the k-th receive names, decided from the
    position table: per link, the sends and receives it carries pair up by label (stage s's
    `SEND_F`s with stage s+1's `RECV_F`s, a stage's `SEND_B`s with the previous one's
    `RECV_B`s), and the order holds when sorting the pairs by the send's place also sorts them
    by the receive's. False also when it cannot say that way (an action missing or repeated):
    then `Links` scans the rows."""
    S, M = enc.stages, enc.microbatches
    pos = enc.pos
    if not enc.unrepeated:
        return False  # an action appears twice: the position table holds only its first place
    pairs: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    for s in range(S):
        for send in (SEND_F, SEND_B):
            step, recv = PEER_OF_KIND[send]
            t = s + step
            if not 0 <= t < S:
                continue
            sent = pos[kind_slice(s, send, M)]
            got = pos[kind_slice(t, recv, M)]
            if -1 in sent or -1 in got:
                if sent.count(-1) == M and got.count(-1) == M:
                    continue  # no such hand-off in the program
                return False  # a send without its receive, or the reverse
            into = pairs.setdefault((enc.placement[s], enc.placement[t]), ([], []))
            into[0].extend(sent)
            into[1].extend(got)
    for sent, got in pairs.values():
        if not all(map(lt, sent, sent[1:])):
            by_send = sorted(range(len(sent)), key=sent.__getitem__)
            got = gather(got, by_send)
        if not all(map(lt, got, got[1:])):
            return False
    # Sends and receives with no partner stage (PPS207) are on no link; the rows' other
    # sends and receives are all in `pairs` (each appears once), so every link was seen.
    return True



def peer_code(code: int, microbatches: int) -> int:
    """The code of the operation a send or receive names as its peer: SEND_F(s,m) <->
    RECV_F(s+1,m), and SEND_B(s,m) <-> RECV_B(s-1,m). On a link whose order agrees with the
    labels it is also the one it meets (`Encoded.meets` answers in general)."""
    k = code & KIND_MASK
    step, peer = PEER_OF_KIND.get(k, (0, k))  # not a send or receive: itself
    return code + (step * microbatches << KIND_BITS) + peer - k

