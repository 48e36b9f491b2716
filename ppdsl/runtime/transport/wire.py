"""The wire protocol of one rank: what each send or receive puts on its link, as data.

Each `SEND_*`/`RECV_*` action becomes an `Exchange`: the messages it posts, each with what to
do once that message is through. A single action runs its messages one after another; a
batch `<...>` on a backend that posts batches together (NCCL's `grouped` model) posts every
send whole with the receives' first-step headers in one group call, then the receives' data
(`Wire.run_batch`). So
the protocol is written once, and the batch path is only an order of running it (as PyTorch's
pipelining hands out P2P ops that a single send runs alone and a batch runs together).

What travels (the label guard and the shape headers, see docs/runtime.md):
- a forward send: on the first step of each activation a header (its layout, shapes, dtypes,
  gradient flags), then its tensors; later steps only the tensors, whose shapes must not change;
- a backward send: the gradients, in the order of the output members that need one (the
  receiver knows their shapes from its own forward);
- on the first step every message carries a label (kind, stage, microbatch, place on the
  link) in the header before it (an empty header of the same size for a backward), and a
  receive that gets another label than it expects stops with both actions named
  (`MessageOrderError`). The order is the same every step, so later steps send no labels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from attrs import define

from ...ir import Kind
from ...links import peer_of
from ..interpreter.plan import Op, Plan
from ..interpreter import values
from . import messages
from .comm import Carrier, PeerError, comm_model_of
from .messages import DTYPES, LABEL, MAX_DIMS, MAX_ELEMENTS, Label
from ..framework import Framework
from ..errors import MessageOrderError, SetupError

Key = tuple[int, int]
Then = Callable[[], None] | None
# (is_send, tensor, peer, what to do once this message is through)
Message = tuple[bool, Any, int, Then]


@define
class Exchange:
    """One send or receive action's messages: the first step's header (posted before anything
    that depends on it), then the data, built once the header is through."""

    # Built when posted, not when the exchange is made: a label numbers its message among the
    # sends on its link in the order they go out.
    label: str  # the action's, for the watchdog and for errors
    sends: bool  # a send's messages all go out at once; a receive's body waits for its head
    peer: int
    head: Callable[[], list[Message]] = lambda: []
    body: Callable[[], list[Message]] = lambda: []
    finish: Then = None


class Wire:
    """The messages of one rank's sends and receives, the shapes agreed on the first step, and
    the label guard."""

    def __init__(self, fw: Framework, transport: Carrier, plan: Plan, rank: int, guard: bool):
        self.fw = fw
        self.transport = transport
        self.plan = plan
        self.rank = rank
        self.guard = guard
        self.labels = guard  # True until the first step has run: only it sends labels
        self.first = True  # the first step: shape headers travel
        # On a `grouped` backend, whether the first step may run each batch member by member
        # (the program is also sound under `rendezvous`), which its headers never hang.
        self.first_in_order = False
        self.step = 0
        self._sent_on: dict[int, int] = {}  # peer -> messages sent to it so far (first step)
        self._received_on: dict[int, int] = {}
        # Agreed on the first step: the shapes each send carries, what each receive allocates.
        self._sent: dict[tuple[int, Key], list[list[int]]] = {}
        self._incoming: dict[Key, messages.Incoming] = {}

    def first_step_done(self) -> None:
        self.labels = False
        self.first = False

    # --- running exchanges ---------------------------------------------------------------
    def run(self, exchange: Exchange) -> None:
        """One action: its messages one after another, each blocking."""
        for message in exchange.head():
            self._post(message, exchange.label)
        for message in exchange.body():
            self._post(message, exchange.label)
        if exchange.finish is not None:
            exchange.finish()

    def run_batch(self, exchanges: Sequence[Exchange], label: str) -> None:
        """A batch. `rendezvous` backends (gloo) run each member in written order; `grouped`
        ones (NCCL) post it together, in as few group calls as the first step's headers allow.

        A send needs nothing from its peer, so every send goes whole (header and data) into the
        first call: a peer that needs this batch's data before it sends what the batch receives
        gets it. A receive's data is sized from its header: on each incoming link a call takes
        the receives up to and including the first one with a header, the next call its data
        and on to the next header. Within a call the members keep their written order. So each
        link keeps the protocol's order (head, body, member after member) and the k-th receive
        on a link still meets the k-th send; on later steps, which send no headers, a batch is
        one call. Two batches facing each other that each send and receive a new activation
        would wait forever so (each first call holds a send whose data the peer receives only in
        its second call), so a program that is sound under `rendezvous` as well runs its first
        step member by member (`first_in_order`); only one sound under `grouped` alone, with
        such facing batches, still hangs there (docs/runtime.md)."""
        if self.transport.model is not comm_model_of("nccl") or len(exchanges) == 1 \
                or (self.first and self.first_in_order):
            for exchange in exchanges:
                self.run(exchange)
            return
        todo = list(exchanges)  # members with messages left to post, in written order
        headed: set[int] = set()  # receives whose header has been posted
        while todo:
            # In written order (gloo, which the soundness tests run this path on, posts a call's
            # messages one by one; NCCL all at once): a send whole, a receive's header or data.
            call: list[Message] = []
            blocked: set[int] = set()  # incoming links with a header in this call
            later: list[Exchange] = []
            for e in todo:
                if e.sends:  # needs nothing from its peer: whole, in the first call
                    call += e.head() + e.body()
                    continue
                if e.peer in blocked:
                    later.append(e)
                    continue
                if id(e) not in headed:  # a receive's header, once (none after the first step)
                    headed.add(id(e))
                    head = e.head()
                    if head:
                        call += head  # its data is sized from this header: in the next call
                        blocked.add(e.peer)
                        later.append(e)
                        continue
                call += e.body()
            self._post_together(call, label)
            todo = later
        for exchange in exchanges:
            if exchange.finish is not None:
                exchange.finish()

    def _post(self, message: Message, label: str) -> None:
        is_send, tensor, peer, then = message
        if is_send:
            self.transport.send(tensor, peer, label)
        else:
            self.transport.recv(tensor, peer, label)
        if then is not None:
            then()

    def _post_together(self, messages: list[Message], label: str) -> None:
        if not messages:
            return
        self.transport.batch([(is_send, t, peer) for is_send, t, peer, _ in messages], label)
        for *_, then in messages:  # what each message's arrival allows, in posted order
            if then is not None:
                then()

    # --- the four actions ----------------------------------------------------------------
    def send_f(self, op: Op, value: Any) -> Exchange:
        key = (op.stage, op.microbatch)
        where = f"stage {op.stage}'s output, sent to rank {op.peer} by {op.label}"
        fw = self.fw
        exchange = Exchange(op.label, True, op.peer)
        if (op.kind, key) not in self._sent:
            try:
                meta = messages.describe(fw, value, self.plan.training, where)
                header, error = messages.encode_header(fw, meta), None
                self._sent[(op.kind, key)] = [fw.shape(t) for t in values.split(value)[1]]
            except values.StageValueError as exc:
                # The receiver learns why instead of timing out; this rank stops after sending.
                header, error = messages.encode_header(fw, {"error": str(exc)}), str(exc)

            def refuse() -> None:
                if error is not None:
                    self.transport.flush()  # the header that says why must reach the peer first
                    raise SetupError(error)

            exchange.head = lambda: [(True, self._labelled(op, header), op.peer, refuse)]

        def data() -> list[Message]:
            members = values.split(value)[1]
            if not all(fw.is_tensor(t) for t in members):
                messages.describe(fw, value, False, where)  # raises, naming the member
            tensors = [fw.detach(t) for t in members]
            self._same_shapes(op, tensors)
            return [(True, t, op.peer, None) for t in tensors]

        exchange.body = data
        return exchange

    def send_b(self, op: Op, tensors: list[Any]) -> Exchange:
        def data() -> list[Message]:
            self._same_shapes(op, tensors)
            label = [(True, self._labelled(op), op.peer, None)] if self.labels else []
            return label + [(True, t, op.peer, None) for t in tensors]

        return Exchange(op.label, True, op.peer, body=data)

    def recv_f(self, op: Op, done: Callable[[Any], None]) -> Exchange:
        key = (op.stage, op.microbatch)
        exchange = Exchange(op.label, False, op.peer)
        if key not in self._incoming:
            header = self._header_buffer()
            exchange.head = lambda: [(False, header, op.peer, lambda: self._read_incoming(op, header))]
        buffers: list[Any] = []

        def data() -> list[Message]:
            buffers.extend(self._incoming[key].buffers(self.fw))
            return [(False, b, op.peer, None) for b in buffers]

        exchange.body = data
        exchange.finish = lambda: done(self._incoming[key].join(self.fw, buffers))
        return exchange

    def recv_b(self, op: Op, like: list[Any], done: Callable[[list[Any]], None]) -> Exchange:
        """The gradients of the output members `like`: each has its member's shape, no header."""
        buffers = [self.fw.empty_like(t) for t in like]

        def data() -> list[Message]:
            label: list[Message] = []
            if self.labels:
                header = self._header_buffer()
                label.append((False, header, op.peer, lambda: self._unlabelled(op, header)))
            return label + [(False, b, op.peer, None) for b in buffers]

        return Exchange(op.label, False, op.peer, body=data, finish=lambda: done(buffers))

    # --- headers and the shapes agreed on the first step ---------------------------------
    def _same_shapes(self, op: Op, tensors: list[Any]) -> None:
        """A backward's first send records its shapes; later sends must have the first's."""
        k = (op.kind, (op.stage, op.microbatch))
        shapes = [self.fw.shape(t) for t in tensors]
        known = self._sent.get(k)
        if known is None:
            self._sent[k] = shapes
        elif known != shapes:
            raise SetupError(f"{op.label}: the tensors now have shapes {shapes}, but they had {known} when "
                             "the ranks agreed shapes on the first step")

    def _read_incoming(self, op: Op, header: Any) -> None:
        meta = messages.decode_header(self.fw, self._unlabelled(op, header))
        if "error" in meta:
            raise SetupError(f"rank {op.peer} could not send stage {op.stage - 1}'s output: {meta['error']}")
        try:
            incoming = messages.parse_description(meta, DTYPES, MAX_DIMS, MAX_ELEMENTS)
        except values.StageValueError as exc:
            raise PeerError(f"from rank {op.peer}: {exc}") from None
        self._incoming[(op.stage, op.microbatch)] = incoming

    # --- the label guard (first step only) -----------------------------------------------
    def _labelled(self, op: Op, header: Any | None = None) -> Any:
        """The header to send before `op`'s data: with its label on the first step (a backward
        sends an empty one, the size of a forward's, so either fits where the other was due)."""
        if not self.labels:
            return header
        n = self._sent_on[op.peer] = self._sent_on.get(op.peer, 0) + 1
        label = Label(Kind(op.kind), op.stage, op.microbatch, n)
        return label.tensor(self.fw, messages.empty_header(self.fw) if header is None else header)

    def _header_buffer(self) -> Any:
        return Label.empty(self.fw) if self.labels else messages.empty_header(self.fw)

    def _unlabelled(self, op: Op, received: Any) -> Any:
        """The header part of a received header, after checking its label (first step)."""
        if not self.labels:
            return received
        self._check_label(op, received)
        return received[LABEL:]

    def _check_label(self, op: Op, received: Any) -> None:
        """Stop with both actions named when the message is not the one `op` expects."""
        n = self._received_on[op.peer] = self._received_on.get(op.peer, 0) + 1
        got = Label.read(self.fw, received, self.plan.stages, self.plan.microbatches)
        kind, stage = peer_of(op.kind, op.stage)
        want = Label(Kind(kind), stage, op.microbatch, n)
        if got == want:
            return
        if got.kind is not want.kind:
            what = ("an activation would arrive where a gradient is expected" if got.kind is Kind.SEND_F else
                    "a gradient would arrive where an activation is expected") + " (or fail on its shape)"
        elif got.kind is Kind.SEND_F:
            what = (f"stage {op.stage} would compute microbatch {op.microbatch} from the activation of "
                    f"microbatch {got.microbatch}")
        else:
            what = (f"stage {op.stage}'s backward of microbatch {op.microbatch} would use the gradient of "
                    f"microbatch {got.microbatch}")
        raise MessageOrderError(
            self.rank, self.step, op.label,
            f"messages out of order on the link from rank {op.peer}: this receive is number {n} on that link "
            f"and expects `{want.action}`, but message number {got.ordinal} that rank {op.peer} sent on it is "
            f"`{got.action}` (rank {op.peer}, step {self.step}, action {got.action}). The transport hands "
            f"each receive the next message on its link, whatever it carries: {what}. Send and receive in "
            "the same order on both ranks (`ppdsl lint` reports this as PPS212).")
