"""The wire protocol of one rank: what each send or receive puts on its link, as data.

Each `SEND_*`/`RECV_*` action becomes an `Exchange`: on the first step, the note it posts or
reads (`agree`), then the messages it posts, each with what to do once that message is
through. A single action runs its note and then its messages; a batch `<...>` on a backend
that posts batches together (NCCL's `grouped` model) posts its members together
(`Wire.run_batch`). So the protocol is written once, and the batch path is only an order of
running it (as PyTorch's pipelining hands out P2P ops that a single send runs alone and a
batch runs together).

What travels (the label guard and the shapes, see docs/runtime.md):
- on the links, only tensors, the same on every step: a forward send the members of its
  value, a backward send the gradients, in the order of the output members that need one;
- on the first step, beside the links, a note per send through the job's key-value store
  (`messages.encode_note`), numbered by its place on the link as the messages are: a
  forward's describes its value (form, shapes, dtypes, gradient flags), so that the receive
  can size its buffers; with the label guard every note also carries the sending action, and
  a receive that reads another label than it expects stops with both actions named
  (`MessageOrderError`). The order is the same every step, so later steps post no notes, and
  the shapes must not change.
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
from .comm import Carrier, comm_model_of
from .messages import DTYPES, MAX_DIMS, MAX_ELEMENTS, Label
from ..framework import Framework, Spread
from ..errors import MessageOrderError, PeerError, SetupError

Key = tuple[int, int]
Then = Callable[[], None] | None
# (is_send, tensor, peer, what to do once this message is through)
Message = tuple[bool, Any, int, Then]


def _agreed(wait: bool) -> bool:
    return True


@define
class Exchange:
    """One send or receive action: its note (first step), then its messages."""

    label: str  # the action's, for the watchdog and for errors
    sends: bool
    peer: int
    # A send posts its note; a receive reads its peer's, waiting for it when `wait` (else
    # False while the note is not there). Whether the action may post its messages.
    agree: Callable[[bool], bool] = _agreed
    body: Callable[[], list[Message]] = lambda: []
    finish: Then = None


class Wire:
    """The notes and messages of one rank's sends and receives, the shapes agreed on the first
    step, and the label guard."""

    def __init__(self, fw: Framework, transport: Carrier, plan: Plan, rank: int, guard: bool, prefix: str = "",
                 mesh_of: Callable[[int], Any | None] = lambda stage: None):
        self.fw = fw
        # The mesh a stage's tensors are laid out over (tensor parallelism): a member sent as a
        # DTensor's part is rebuilt over the receiving stage's.
        self.mesh_of = mesh_of
        self.transport = transport
        self.plan = plan
        self.rank = rank
        self.guard = guard
        self.first = True  # the first step: notes are posted and read
        self.step = 0
        self.prefix = prefix  # the job's keys for this schedule's notes (agreed by all ranks)
        # Notes posted to each peer / read from each so far (first step): their place on the link.
        self._posted: dict[int, int] = {}
        self._read: dict[int, int] = {}
        # Agreed on the first step: the shapes each send carries, what each receive allocates.
        self._sent: dict[tuple[int, Key], list[list[int]]] = {}
        self._incoming: dict[Key, messages.Incoming] = {}
        self._grad_spreads: dict[Key, list[Spread | None]] = {}  # a backward receive's, where any is laid out

    def first_step_done(self) -> None:
        self.first = False

    def abandon(self, reason: str) -> None:
        """On the first step, a rank that stops before all its notes are out leaves each peer
        it sends to one more note saying why: a peer waiting for a note from it raises that
        reason (and leaves its own peers the same), instead of waiting out its timeout."""
        if not self.first:
            return
        peers = {part.peer for op in self.plan.ops for part in (op.parts or (op,))
                 if part.kind in (Kind.SEND_F, Kind.SEND_B)}
        for peer in sorted(peers):
            n = self._posted[peer] = self._posted.get(peer, 0) + 1
            try:
                self.transport.post_note(self._key(self.rank, self.transport.layout.global_rank(peer), n),
                                         messages.encode_note(None, error=reason[:4000], abandoned=True))
            except Exception:  # noqa: BLE001 - the reason the rank stops is what it raises
                return

    # --- running exchanges ---------------------------------------------------------------
    def run(self, exchange: Exchange) -> None:
        """One action: its note, then its messages one after another, each blocking."""
        exchange.agree(True)
        for message in exchange.body():
            self._post(message, exchange.label)
        if exchange.finish is not None:
            exchange.finish()

    def run_batch(self, exchanges: Sequence[Exchange], label: str) -> None:
        """A batch. `rendezvous` backends (gloo) run each member in written order; `grouped`
        ones (NCCL) post it together.

        Every send's note goes out first (it needs nothing from the peer). A receive can post
        its buffers once it has read its note; the first group call takes every send and the
        receives whose notes are there, in written order, and a receive on a link whose earlier
        receive still waits waits with it (the k-th receive on a link meets the k-th send). The
        rest follow as their notes arrive: a note missing means its peer has not reached the
        send, which could not have completed before then anyway. A peer that needs this batch's
        sends before it sends what the batch receives gets them in the first call, and two
        batches facing each other each find the other's notes, since each posts its own before
        it reads. From the second step on there are no notes: every batch is one call."""
        if self.transport.model is not comm_model_of("nccl") or len(exchanges) == 1:
            for exchange in exchanges:
                self.run(exchange)
            return
        for e in exchanges:
            if e.sends:
                e.agree(True)
        todo = list(exchanges)  # members with messages left to post, in written order
        while todo:
            call: list[Message] = []
            waiting: set[int] = set()  # incoming links with a receive still waiting for its note
            later: list[Exchange] = []
            for e in todo:
                if e.sends:
                    call += e.body()
                elif e.peer in waiting or not e.agree(False):
                    waiting.add(e.peer)
                    later.append(e)
                else:
                    call += e.body()
            if call:
                self._post_together(call, label)
            elif later:
                later[0].agree(True)
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
        if self.first:
            def agree(wait: bool) -> bool:
                exchange.agree = _agreed
                try:
                    meta = messages.describe(fw, value, self.plan.training, where)
                    self._sent[(op.kind, key)] = [fw.shape(fw.local(t)) for t in values.split(value)[1]]
                    self._post_note(op, messages.encode_note(self._label(op), meta))
                except values.StageValueError as exc:
                    # The receiver learns why instead of timing out; this rank stops.
                    self._post_note(op, messages.encode_note(self._label(op), error=str(exc)))
                    raise SetupError(str(exc)) from None
                return True

            exchange.agree = agree

        def data() -> list[Message]:
            members = values.split(value)[1]
            if not all(fw.is_tensor(t) for t in members):
                messages.describe(fw, value, False, where)  # raises, naming the member
            tensors = [fw.detach(fw.local(t)) for t in members]
            self._same_shapes(op, tensors)
            return [(True, t, op.peer, None) for t in tensors]

        exchange.body = data
        return exchange

    def send_b(self, op: Op, tensors: list[Any]) -> Exchange:
        def data() -> list[Message]:
            parts = [self.fw.local(t) for t in tensors]
            self._same_shapes(op, parts)
            return [(True, t, op.peer, None) for t in parts]

        exchange = Exchange(op.label, True, op.peer, body=data)
        if self.first:
            def agree(wait: bool) -> bool:
                exchange.agree = _agreed
                self._post_note(op, messages.encode_note(self._label(op), grads=[self.fw.spread(t) for t in tensors]))
                return True

            exchange.agree = agree
        return exchange

    def recv_f(self, op: Op, done: Callable[[Any], None]) -> Exchange:
        key = (op.stage, op.microbatch)
        exchange = Exchange(op.label, False, op.peer)
        if self.first:
            exchange.agree = self._reader(exchange, op, lambda note: self._read_value(op, note))
        buffers: list[Any] = []

        def data() -> list[Message]:
            buffers.extend(self._incoming[key].buffers(self.fw))
            return [(False, b, op.peer, None) for b in buffers]

        exchange.body = data
        exchange.finish = lambda: done(self._incoming[key].join(self.fw, buffers, lambda: self._mesh(op)))
        return exchange

    def recv_b(self, op: Op, like: list[Any], done: Callable[[list[Any]], None]) -> Exchange:
        """The gradients of the output members `like`: each has its member's shape (its part's,
        for a DTensor, rebuilt as the gradient's sender laid it out)."""
        key = (op.stage, op.microbatch)
        fw = self.fw
        buffers = [fw.empty_like(fw.local(t)) for t in like]

        def finish() -> None:
            spreads = self._grad_spreads.get(key)
            if spreads is None:
                done(buffers)
                return
            done([b if spread is None else fw.rewrap(b, self._mesh(op), spread) for b, spread in zip(buffers, spreads)])

        exchange = Exchange(op.label, False, op.peer, body=lambda: [(False, b, op.peer, None) for b in buffers],
                            finish=finish)
        if self.first:
            exchange.agree = self._reader(exchange, op, lambda note: self._read_grads(op, note, like))
        return exchange

    def _mesh(self, op: Op) -> Any:
        mesh = self.mesh_of(op.stage)
        if mesh is None:
            raise SetupError(f"{op.label}: a DTensor's part arrived for stage {op.stage}, whose parameters are laid "
                             "out over no mesh to rebuild it on: split the stage too (tensor parallelism), or send "
                             "plain tensors (use_local_output=True)")
        return mesh

    def _read_grads(self, op: Op, note: dict[str, Any], like: list[Any]) -> None:
        """A backward send's note: the layouts of the gradients laid out over a mesh, each of
        whose part must have its output member's part's shape (the buffer it arrives in)."""
        grads = note.get("grads")
        if grads is None:
            return
        if not isinstance(grads, list) or len(grads) != len(like):
            raise PeerError(f"garbled note from rank {op.peer}: the layouts of {len(like)} gradients expected")
        try:
            spreads = [None if g is None else messages.parse_spread(g, MAX_DIMS, MAX_ELEMENTS) for g in grads]
        except values.StageValueError as exc:
            raise PeerError(f"from rank {op.peer}: {exc}") from None
        for i, (grad, member) in enumerate(zip(spreads, like)):
            output = self.fw.spread(member)
            if grad is None or output is None:
                if grad is not output:
                    raise SetupError(f"{op.label}: the gradient of output member {i} arrives "
                                     f"{'whole' if grad is None else 'as a DTensor part'} but the member was "
                                     f"{'a DTensor' if grad is None else 'a plain tensor'}: its part would not fit")
                continue
            sharded = [p[1] if p[0] == "S" else None for p in output["placements"]]
            if [p[1] if p[0] == "S" else None for p in grad["placements"]] != sharded:
                raise SetupError(f"{op.label}: the gradient of output member {i} arrives placed "
                                 f"{grad['placements']}, the member was {output['placements']}: a part of "
                                 "another shape than the member's (redistribute the gradient in the next stage, "
                                 "or send plain tensors)")
        self._grad_spreads[(op.stage, op.microbatch)] = spreads

    # --- notes (first step) --------------------------------------------------------------
    def _key(self, sender: int, receiver: int, n: int) -> str:
        return f"{self.prefix}{sender}>{receiver}/{n}"

    def _label(self, op: Op) -> Label | None:
        """The label of the note `op` is about to post (its number on the link is the next)."""
        if not self.guard:
            return None
        return Label(Kind(op.kind), op.stage, op.microbatch, self._posted.get(op.peer, 0) + 1)

    def _post_note(self, op: Op, note: bytes) -> None:
        n = self._posted[op.peer] = self._posted.get(op.peer, 0) + 1
        self.transport.post_note(self._key(self.rank, self.transport.layout.global_rank(op.peer), n), note)

    def _reader(self, exchange: Exchange, op: Op, use: Callable[[dict[str, Any]], None]) -> Callable[[bool], bool]:
        """A receive's `agree`: read the next note on its link (its number is taken at the
        first try), check its label, hand it to `use`."""
        numbered: list[int] = []

        def agree(wait: bool) -> bool:
            if not numbered:
                numbered.append(self._read.get(op.peer, 0) + 1)
                self._read[op.peer] = numbered[0]
            key = self._key(self.transport.layout.global_rank(op.peer), self.rank, numbered[0])
            data = self.transport.read_note(key, op.peer, op.label, wait)
            if data is None:
                return False
            note = messages.decode_note(data)
            if note.get("abandoned"):
                raise PeerError(str(note.get("error", "a peer stopped")))
            if self.guard:
                self._check_label(op, note.get("label"), numbered[0])
            use(note)
            exchange.agree = _agreed
            return True

        return agree

    def _read_value(self, op: Op, note: dict[str, Any]) -> None:
        if "error" in note:
            raise SetupError(f"rank {op.peer} could not send stage {op.stage - 1}'s output: {note['error']}")
        if "value" not in note:  # without the guard: the note of a gradient, where an activation's is due
            raise PeerError(f"rank {op.peer}'s message number {self._read[op.peer]} on this link is not an "
                            "activation: the ranks send and receive in different orders")
        try:
            incoming = messages.parse_description(note.get("value"), DTYPES, MAX_DIMS, MAX_ELEMENTS)
        except values.StageValueError as exc:
            raise PeerError(f"from rank {op.peer}: {exc}") from None
        self._incoming[(op.stage, op.microbatch)] = incoming

    # --- the shapes agreed on the first step --------------------------------------------
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

    # --- the label guard (first step only) -----------------------------------------------
    def _check_label(self, op: Op, words: Any, n: int) -> None:
        """Stop with both actions named when the message is not the one `op` expects."""
        got = Label.read(words, self.plan.stages, self.plan.microbatches)
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
