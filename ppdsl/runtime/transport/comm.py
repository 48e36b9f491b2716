"""Point-to-point transport: one 2-rank group per communicating pair, timeouts (what the messages
hold is `messages.py`).

Why pair groups: on gloo, every operation in a group advances one shared message counter, so
a send between two members of a larger group desynchronises (see the notes on Paddle on
CPU). Every rank creates the same groups in the same order, members or not.

Why a backend's comm model: gloo runs a fused batch member by member, each blocking
(`rendezvous`), or, with sends in the background, lets a send complete before its receive
(`buffered`); NCCL posts a batch's members together (`grouped`). The runtime lints under the
model of the transport it really has before the first step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ...semantics import CommModel
from ..errors import PeerError
from ..framework import Framework
from .notes import StoreNotes
from .background import Background
from ..jobs.process_layout import Layout
from ..jobs.watchdog import Lane, Watchdog

if TYPE_CHECKING:  # pragma: no cover
    Tensor = Any





def gather_objects(fw: Framework, obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order. One rank needs no process group (none is made)."""
    if not fw.is_initialized() or fw.world_size() == 1:
        return [obj]
    return fw.all_gather_object(obj)


def comm_model_of(backend: str, background: bool = False) -> CommModel:
    """gloo runs batches member by member, each send waiting for its receive unless sends go
    out in the background; NCCL-like backends post a batch's members together."""
    if backend.lower() != "gloo":
        return CommModel.GROUPED
    return CommModel.BUFFERED if background else CommModel.RENDEZVOUS


class Carrier(Protocol):
    """What the interpreter sends and receives through: the process groups (`Transport`), or
    threads in one process (`loopback.Loopback`). Peers are pipeline ranks; a receive fills
    the tensor it is given."""

    model: CommModel
    pairs: tuple[tuple[int, int], ...]
    backend: str
    layout: Layout
    data_parallel_group: Any
    watchdog: Watchdog | None

    def send(self, tensor: Tensor, peer: int, label: str) -> None: ...

    def recv(self, tensor: Tensor, peer: int, label: str) -> None: ...

    def batch(self, ops: Sequence[tuple[bool, Tensor, int]], label: str) -> None: ...

    def flush(self) -> None: ...

    def close(self, timeout: float = 5.0) -> None: ...

    def gather(self, obj: Any) -> list[Any]: ...

    def all_reduce(self, tensor: Tensor) -> None: ...

    def group(self, ranks: list[int]) -> Any:
        """The group of global `ranks`, for `all_reduce_over`: a collective of the whole job
        (every process calls it with the same ranks, in the same order)."""

    def all_reduce_over(self, group: Any, tensor: Tensor) -> None:
        """Sum `tensor` over the ranks of `group` (from `group`), in place."""

    def post_note(self, key: str, data: bytes) -> None:
        """Leave `data` under `key` for a peer's `read_note` (the first step's notes, `wire.py`)."""

    def read_note(self, key: str, peer: int, label: str, wait: bool) -> bytes | None:
        """The note `peer` left under `key`: None while it is not there, unless `wait`."""


class Transport:
    """Send/recv to a pipeline peer over that pair's own groups.

    Peers are pipeline ranks (what a plan names); `layout` maps them to global ranks. Every
    process creates every replica's pair groups, then the data-parallel groups (one per
    pipeline rank), all in the same order: a group's creation is a collective of the world.

    With `background` (gloo only) each peer's sends go out on a thread of their own, in the
    order they were posted, while this rank computes; receives still block (the rank needs
    what it receives). Then every pair has one group per direction: a gloo group's message
    counter is shared by its operations, so a send on one thread and a receive on another must
    not share one. `flush()` waits for every posted send; a failed send comes back there (or at
    the next send to that peer) as `JobFailed`. The checker's model of such a run is
    `buffered` (a send completes without waiting for its receive)."""

    def __init__(self, fw: Framework, rank: int, pairs: Sequence[tuple[int, int]], watchdog: Watchdog | None,
                 backend: str | None = None, background: bool = False, layout: Layout | None = None):
        self.fw = fw
        self.layout = layout or Layout.single(1 + max([rank, *(b for _, b in pairs)]), rank)
        self.rank = self.layout.rank
        self.pairs = tuple(pairs)
        self.backend = (backend or fw.backend()).lower()
        self.background = background and self.backend == "gloo"
        self.model = comm_model_of(self.backend, self.background)
        # The NCCL code path over gloo groups (the soundness tests run it so): a group call's
        # sends go to the sending threads, so that its members are posted together as on NCCL.
        self.emulated = self.backend != "gloo" and fw.is_initialized() and fw.backend() == "gloo"
        threads = self.background or self.emulated
        self._watchdog = watchdog
        # pipeline peer -> (the group sends to it use, its blocking send, its blocking receive)
        self.links: dict[int, tuple[Any, Callable[[Any], None], Callable[[Any], None]]] = {}
        # This pipeline rank's replicas, reduced together (None with one replica).
        self.data_parallel_group: Any = None
        me = self.layout.rank
        for a, b in self.layout.pair_groups(pairs):
            groups = [self._new_group([a, b]) for _ in range(2 if threads else 1)]  # a to b, then b to a
            if me in (a, b):
                peer = b if me == a else a
                sends, receives = (groups[0], groups[-1]) if me == a else (groups[-1], groups[0])
                self.links[self.layout.pipeline_rank_of(peer)] = (sends, fw.link(sends, me, peer)[0],
                                                           fw.link(receives, me, peer)[1])
        if self.layout.replicas > 1:
            for ranks in self.layout.data_parallel_groups():
                group = self._new_group(ranks)
                if me in ranks:
                    self.data_parallel_group = group
        if watchdog is not None:
            watchdog.disarm()
        self.notes = StoreNotes(fw.job_store, lambda: self._watchdog)
        self.senders: dict[int, Background] = {}
        if threads:
            self.senders = {peer: Background(f"send-to-{peer}", self._lane()) for peer in self.links}

    @property
    def watchdog(self) -> Watchdog | None:
        return self._watchdog

    @watchdog.setter
    def watchdog(self, watchdog: Watchdog | None) -> None:
        """A transport reused by a later schedule reports to that schedule's watchdog."""
        self._watchdog = watchdog
        for sender in self.senders.values():
            sender.lane = self._lane()

    def _lane(self) -> Lane | None:
        return self._watchdog.lane() if self._watchdog is not None else None

    def _new_group(self, ranks: list[int]) -> Any:
        if self.watchdog is not None:
            self.watchdog.arm(f"creating the group of ranks {', '.join(map(str, ranks))}")
        group = self.fw.new_group(ranks)
        # gloo: two groups being created at once (say {0,3} and {1,2}) break each other's
        # connection set-up; a barrier after each keeps the creations one at a time.
        if self.backend == "gloo":
            self.fw.barrier()
        return group

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        return gather_objects(self.fw, obj)

    def all_reduce(self, tensor: Tensor) -> None:
        """Sum `tensor` over this rank's replicas, in place."""
        self.fw.all_reduce(tensor, self.data_parallel_group)

    def group(self, ranks: list[int]) -> Any:
        return self._new_group(ranks)

    def all_reduce_over(self, group: Any, tensor: Tensor) -> None:
        self.fw.all_reduce(tensor, group)

    def post_note(self, key: str, data: bytes) -> None:
        self.notes.post(key, data)

    def read_note(self, key: str, peer: int, label: str, wait: bool) -> bytes | None:
        return self.notes.read(key, f"waiting for a note from rank {self.global_rank(peer)}", label, wait)

    def global_rank(self, peer: int) -> int:
        """The global rank of pipeline peer `peer` in this process's replica (what a message
        about a peer should name: with one replica the two are the same)."""
        return self.layout.global_rank(peer)

    def _link(self, peer: int) -> tuple[Any, Callable[[Any], None], Callable[[Any], None]]:
        link = self.links.get(peer)
        if link is None:  # pragma: no cover - plans only name peers from the program's pairs
            raise PeerError(f"no group with rank {peer}")
        return link

    def send(self, tensor: Tensor, peer: int, label: str) -> None:
        sender = self.senders.get(peer) if self.background else None
        if sender is None:
            self._send(tensor, peer, label, self._watchdog)
        else:
            sender.post(functools.partial(self._send, tensor, peer, label), label)

    def _send(self, tensor: Tensor, peer: int, label: str, lane: Lane | None) -> None:
        _, send, _ = self._link(peer)
        if lane is not None:
            lane.arm(label, f"sending to rank {self.global_rank(peer)}")
        t0 = time.monotonic()
        try:
            send(tensor)
        except RuntimeError as exc:
            raise peer_error(exc, "sending to", self.global_rank(peer), time.monotonic() - t0) from None
        if lane is not None:
            lane.since = 0.0

    def flush(self) -> None:
        """Until every send posted so far has been received (at once without `background`)."""
        wd = self._watchdog
        for peer, sender in self.senders.items():
            if sender.idle:
                continue
            if wd is not None:
                wd.arm(wd.label, f"waiting for rank {self.global_rank(peer)} to receive what this rank sent it")
            sender.wait()
            if wd is not None:
                wd.since = 0.0

    def close(self, timeout: float = 5.0) -> None:
        """End the sending threads once their sends are out (a process that exits normally
        should hold no thread in the framework: Paddle's teardown can crash under one)."""
        for sender in self.senders.values():
            sender.join(timeout)

    def recv(self, tensor: Tensor, peer: int, label: str) -> None:
        _, _, recv = self._link(peer)
        wd = self._watchdog
        if wd is not None:
            wd.arm(label, f"waiting for rank {self.global_rank(peer)}")
        t0 = time.monotonic()
        try:
            recv(tensor)
        except RuntimeError as exc:
            raise peer_error(exc, "receiving from", self.global_rank(peer), time.monotonic() - t0) from None
        if wd is not None:
            wd.since = 0.0

    def batch(self, ops: Sequence[tuple[bool, Tensor, int]], label: str) -> None:
        """(is_send, tensor, peer) posted together: NCCL's group call."""
        if self.emulated:
            for is_send, t, peer in ops:
                if is_send:
                    self.senders[peer].post(functools.partial(self._send, t, peer, label), label)
            for is_send, t, peer in ops:
                if not is_send:
                    self.recv(t, peer, label)
            self.flush()
            return
        p2p = [(is_send, t, self.global_rank(peer), self._link(peer)[0]) for is_send, t, peer in ops]
        wd = self._watchdog
        if wd is not None:
            wd.arm(label, "in a batched send/receive with ranks "
                   + ", ".join(sorted({str(self.global_rank(p)) for _, _, p in ops})))
        t0 = time.monotonic()
        try:
            self.fw.batch(p2p)
        except RuntimeError as exc:
            raise peer_error(exc, "exchanging with", self.global_rank(ops[0][2]), time.monotonic() - t0) from None
        if wd is not None:
            wd.disarm()


GLOO_TIMEOUT_SECONDS = 30.0  # gloo's own limit on one send or receive


def peer_error(exc: RuntimeError, doing: str, peer: int, waited: float) -> PeerError:
    """What a failed send or receive means, from gloo's message and how long the call waited."""
    text = str(exc)
    timed_out = "TIMEOUT" in text or "Timed out" in text
    # gloo also says TIMEOUT (pair.cc) when the peer's socket closes under a pending operation:
    # measured on loopback, about 2 in 8 runs with a killed peer, within a second.
    if timed_out and waited < GLOO_TIMEOUT_SECONDS / 2:
        return PeerError(f"lost rank {peer} while {doing} it (gloo closed the link after {waited:.1f} s, long "
                         f"before its own {GLOO_TIMEOUT_SECONDS:g} s limit): rank {peer} died or was stopped")
    if timed_out:
        return PeerError(f"the transport gave up {doing} rank {peer} after {waited:.0f} s (gloo's own "
                         f"{GLOO_TIMEOUT_SECONDS:g} s limit): the peer is stuck, dead, or waiting for something else")
    if "Connection reset" in text or "Connection closed" in text:
        return PeerError(f"lost rank {peer} while {doing} it (connection reset): rank {peer} died or was stopped")
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return PeerError(f"{doing} rank {peer} failed: {first[:300]}")
