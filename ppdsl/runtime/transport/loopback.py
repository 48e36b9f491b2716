"""`Loopback`: a job's ranks as threads of one process, for tests of the interpreter.

The same `PipelineSchedule` runs on each thread with real framework tensors; what would go
through process groups goes through queues (`links(rank)` is a `comm.Carrier`). So the step loop,
the wire (notes, the label guard), the handlers and the gradient reduction run as they do
across processes, in milliseconds, without a process group (as torch's threaded test groups
let its tests do):

    loop = Loopback("torch", pipeline=2)
    results = loop.run(lambda rank: train(PipelineSchedule(program, {rank: layers[rank]}, loss,
                                                           transport=loop.links(rank))))

The comm model is the checker's: `buffered` (a send returns at once; the step's `flush` waits
until it was received), `rendezvous` (each send waits for its receive, as gloo's own calls) or
`grouped` (a batch's sends are posted together, as NCCL). Every wait gives up after `timeout`
seconds, and once a rank has failed every other rank's wait ends at once with a `PeerError`
naming it: a test never hangs on a deadlock, it fails with the action that waited.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...semantics import CommModel
from ..errors import PeerError
from ..framework import Framework, get_framework
from ..jobs.process_layout import Layout
from ..jobs.watchdog import Watchdog

T = TypeVar("T")
POLL = 0.01  # how often a wait looks whether another rank failed


class Failed(Exception):
    """Raised in a rank's wait when another rank's thread has failed."""


class _Message:
    __slots__ = ("payload", "received")

    def __init__(self, payload: Any):
        self.payload = payload
        self.received = threading.Event()


class Loopback:
    """`pipeline` x `replicas` ranks (global rank = replica * pipeline + pipeline rank, as
    `process_layout.Layout`) of one framework, joined by queues."""

    def __init__(self, framework: str | Framework, pipeline: int, replicas: int = 1, *,
                 model: CommModel = CommModel.BUFFERED, timeout: float = 20.0):
        self.fw = framework if isinstance(framework, Framework) else get_framework(framework)
        self.pipeline, self.replicas = pipeline, replicas
        self.world = pipeline * replicas
        self.model = model
        self.timeout = timeout
        self._links: dict[tuple[int, int], queue.SimpleQueue[_Message]] = {
            (a, b): queue.SimpleQueue() for a in range(self.world) for b in range(self.world) if a != b}
        # (ranks, group) -> per round the gather, per rank its rounds so far
        self._gathers: dict[tuple[tuple[tuple[int, ...], int], int], _Gather] = {}
        self._rounds: dict[tuple[tuple[tuple[int, ...], int], int], int] = {}
        self._lock = threading.Lock()
        self.failure: tuple[int, BaseException] | None = None
        self.notes: dict[str, bytes] = {}
        self._noted = threading.Condition(self._lock)

    def links(self, rank: int) -> LoopbackLinks:
        """Rank `rank`'s end (a global rank): pass it as `PipelineSchedule(transport=...)`."""
        return LoopbackLinks(self, Layout(self.pipeline, self.replicas, rank))

    def run(self, fn: Callable[[int], T], timeout: float | None = None) -> list[T]:
        """`fn(rank)` on a thread per rank; every rank's result, in rank order. The first
        exception a rank raised is raised here (the others' waits end when it is raised)."""
        results: list[Any] = [None] * self.world
        errors: dict[int, BaseException] = {}

        def body(rank: int) -> None:
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                errors[rank] = exc
                self.fail(rank, exc)

        threads = [threading.Thread(target=body, args=(r,), name=f"loopback-rank-{r}", daemon=True)
                   for r in range(self.world)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + (timeout if timeout is not None else 10 * self.timeout)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            raise TimeoutError(f"{', '.join(stuck)} still running after the run's timeout")
        if self.failure is not None:
            rank, exc = self.failure
            first = errors.get(rank, exc)
            raise first
        return results

    def fail(self, rank: int, exc: BaseException) -> None:
        """Rank `rank` failed: every wait of the others ends."""
        with self._lock:
            if self.failure is None:
                self.failure = (rank, exc)

    def wait(self, event: threading.Event, rank: int, doing: str) -> None:
        """Until `event`, another rank's failure or the timeout (a `PeerError` saying which)."""
        deadline = time.monotonic() + self.timeout
        while not event.wait(POLL):
            self._check(rank, doing, deadline)

    def get(self, link: tuple[int, int], doing: str) -> _Message:
        q = self._links[link]
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return q.get(timeout=POLL)
            except queue.Empty:
                self._check(link[1], doing, deadline)

    def _check(self, rank: int, doing: str, deadline: float) -> None:
        failure = self.failure
        if failure is not None and failure[0] != rank:
            raise PeerError(f"rank {failure[0]} failed while this rank was {doing}: "
                            f"{type(failure[1]).__name__}: {failure[1]}")
        if time.monotonic() > deadline:
            raise PeerError(f"timed out after {self.timeout:g} s {doing}")

    def post_note(self, key: str, data: bytes) -> None:
        with self._noted:
            self.notes[key] = data
            self._noted.notify_all()

    def read_note(self, key: str, rank: int, doing: str, wait: bool) -> bytes | None:
        deadline = time.monotonic() + self.timeout
        with self._noted:
            while key not in self.notes:
                if not wait:
                    return None
                self._noted.wait(POLL)
                self._check(rank, doing, deadline)
            return self.notes[key]

    def gather(self, ranks: tuple[int, ...], rank: int, obj: Any, group: int = -1) -> list[Any]:
        """Every rank of `ranks` hands in `obj`; all get the list, in the order of `ranks`.
        The n-th gather of a rank over `ranks` meets the n-th of the others in the same
        `group` (-1: the job's own; else a number from `LoopbackLinks.group`, as two groups of
        one process-group library with the same members are two groups)."""
        key = (ranks, group)
        with self._lock:
            n = self._rounds[(key, rank)] = self._rounds.get((key, rank), -1) + 1
            g = self._gathers.setdefault((key, n), _Gather())
            g.objects[rank] = obj
            if len(g.objects) == len(ranks):
                g.complete.set()
        self.wait(g.complete, rank, f"gathering with ranks {', '.join(map(str, ranks))}")
        with self._lock:
            g.read += 1
            if g.read == len(ranks):
                del self._gathers[(key, n)]
        return [g.objects[r] for r in ranks]


class _Gather:
    def __init__(self) -> None:
        self.objects: dict[int, Any] = {}
        self.complete = threading.Event()
        self.read = 0


class LoopbackLinks:
    """One rank's end of a `Loopback` (a `comm.Carrier`)."""

    def __init__(self, loop: Loopback, layout: Layout):
        self.loop = loop
        self.fw = loop.fw
        self.layout = layout
        self._groups = 0  # groups made so far
        self.rank = layout.rank
        self.model = loop.model
        self.backend = "loopback"
        self.pairs: tuple[tuple[int, int], ...] = ()
        self.data_parallel_group: Any = None
        self.watchdog: Watchdog | None = None  # unused: every wait here has its own timeout
        self._unreceived: list[_Message] = []

    def _peer(self, peer: int) -> int:
        return self.layout.global_rank(peer)

    def send(self, tensor: Any, peer: int, label: str) -> None:
        fw = self.fw
        message = _Message((fw.flatten([fw.detach(tensor)]), fw.shape(tensor), fw.dtype_name(tensor)))
        to = self._peer(peer)
        self.loop._links[(self.rank, to)].put(message)
        if self.model is CommModel.RENDEZVOUS:
            self.loop.wait(message.received, self.rank, f"sending to rank {to} ({label})")
        else:
            self._unreceived.append(message)

    def recv(self, tensor: Any, peer: int, label: str) -> None:
        frm = self._peer(peer)
        message = self.loop.get((frm, self.rank), f"waiting for rank {frm} ({label})")
        flat, shape, dtype = message.payload
        fw = self.fw
        if shape != fw.shape(tensor) or dtype != fw.dtype_name(tensor):
            message.received.set()
            raise PeerError(f"{label}: rank {frm} sent a {dtype} tensor of shape {shape} where this rank receives "
                            f"a {fw.dtype_name(tensor)} tensor of shape {fw.shape(tensor)}")
        fw.unflatten_into(flat, [tensor], 1.0)
        message.received.set()

    def batch(self, ops: Sequence[tuple[bool, Any, int]], label: str) -> None:
        """Posted together: every send, then every receive (a send never waits inside a batch)."""
        model, self.model = self.model, CommModel.BUFFERED
        try:
            for is_send, t, peer in ops:
                if is_send:
                    self.send(t, peer, label)
        finally:
            self.model = model
        for is_send, t, peer in ops:
            if not is_send:
                self.recv(t, peer, label)
        self.flush()

    def flush(self) -> None:
        """Until every send so far has been received."""
        for message in self._unreceived:
            self.loop.wait(message.received, self.rank, "waiting for a peer to receive what this rank sent")
        self._unreceived.clear()

    def close(self, timeout: float = 5.0) -> None:
        self._unreceived.clear()

    def post_note(self, key: str, data: bytes) -> None:
        self.loop.post_note(key, data)

    def read_note(self, key: str, peer: int, label: str, wait: bool) -> bytes | None:
        frm = self._peer(peer)
        return self.loop.read_note(key, self.rank, f"waiting for a note from rank {frm} ({label})", wait)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (the whole job, as `comm.gather_objects`)."""
        return self.loop.gather(tuple(range(self.loop.world)), self.rank, obj)

    def all_reduce(self, tensor: Any) -> None:
        """Sum `tensor` over this rank's replicas, in place (every replica adds in one order)."""
        self.all_reduce_over((tuple(self.layout.data_parallel_ranks(self.layout.pipeline_rank)), -1), tensor)

    def group(self, ranks: list[int]) -> Any:
        # Every rank makes every group in one order (as `comm.Carrier.group` asks): the n-th
        # group of each is one group.
        self._groups += 1
        return tuple(ranks), self._groups

    def all_reduce_over(self, group: Any, tensor: Any) -> None:
        """Sum `tensor` over the ranks of `group`, in place (every one adds in one order)."""
        ranks, number = group
        parts = self.loop.gather(ranks, self.rank, self.fw.flatten([self.fw.detach(tensor)]), number)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        self.fw.unflatten_into(total, [tensor], 1.0)
