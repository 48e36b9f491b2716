"""What a rank really keeps alive between actions, counted from the interpreter's own stores.

A microbatch graph of stage s is live from its `F` until its last backward action: while the
interpreter holds its output (the graph hangs off it), the gradient kept between a retained
`I` and its `W`, or weight gradients deferred under its key. The bytes are those of every
distinct tensor in the stores (inputs, outputs, gradients waiting to be sent or used), in
the deferred weight gradients, and those autograd saved for the backward of each graph still
alive (seen through `Framework.saving` while its forward runs; parameters are state, not
activations). The checker predicts the count (`ppdsl.memory`); the two agree when the
runtime frees each microbatch at the action the schedule says.

Per stage it also keeps the largest microbatch's bytes after its `F` (`activation`) and
after its `I` (`kept`): what `ppdsl.memory.peak_bytes` predicts the peak from.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..ir import Kind
from .framework import Framework
from .values import split


class LiveMemory:
    """Peaks over every observation (one after each action, and inside an overlapped pair).

    `seconds` is the time the observations took (tens of microseconds each at a pipeline's
    size): a profile leaves it out of the actions' times and of the step it compares with
    the simulator, since a run without `--profile` does not spend it.
    """

    def __init__(self) -> None:
        self.peak_graphs = 0
        self.peak_bytes = 0
        self.seconds = 0.0
        # Per live graph (stage, microbatch): the buffers autograd saved for it, pointer -> bytes.
        self.saved: dict[tuple[int, int], dict[int, int]] = {}
        self.parameters: set[int] = set()  # pointers of the parameters (state, never activations)
        self.activation: dict[int, int] = {}  # per stage: the most one microbatch holds after F
        self.kept: dict[int, int] = {}  # per stage: the most one microbatch holds after I

    def observe(self, sched: Any, op: Any = None) -> None:
        """After an action (`op`: which; an F or an I also measures its stage's size)."""
        t0 = time.perf_counter()
        self._observe(sched)
        if op is not None and op.code in (Kind.F, Kind.I):
            key = (op.stage, op.microbatch)
            table = self.activation if op.code == Kind.F else self.kept
            table[op.stage] = max(table.get(op.stage, 0), self._graph_bytes(sched, key))
        self.seconds += time.perf_counter() - t0

    def saving(self, sched: Any, key: tuple[int, int]) -> AbstractContextManager[Any]:
        """Around a forward: note what autograd saves for the graph `key`."""
        saved = self.saved[key] = {}
        fw = sched.fw

        def pack(t: Any) -> None:
            saved[fw.data_ptr(t)] = fw.nbytes(t)

        context: AbstractContextManager[Any] = fw.saving(pack)
        return context

    def _graph_bytes(self, sched: Any, key: tuple[int, int]) -> int:
        """The distinct bytes kept for one microbatch of one stage: its stores' entries, its
        deferred weight gradients and, while its graph lives, what autograd saved."""
        fw = sched.fw
        tensors = [m for store in (sched._x, sched._y, sched._kept_dy) if key in store
                   for m in split(store[key])[1] if fw.is_tensor(m)]
        if sched.deferred is not None:
            tensors.extend(sched.deferred.tensors(key))
        return self._bytes(fw, tensors, [key] if key in sched._y else [])

    def _observe(self, sched: Any) -> None:
        graphs = set(sched._y)
        graphs.update(sched._kept_dy)
        deferred = sched.deferred
        if deferred is not None:
            graphs.update(deferred.keys())
        if len(graphs) > self.peak_graphs:
            self.peak_graphs = len(graphs)
        held = self._bytes(sched.fw, _tensors(sched), sched._y)
        if held > self.peak_bytes:
            self.peak_bytes = held

    def _bytes(self, fw: Framework, tensors: Iterable[Any], graphs: Iterable[tuple[int, int]]) -> int:
        """`bytes_of(tensors)` and the saved buffers of `graphs` not among them (nor parameters)."""
        seen = set(self.parameters)
        total = self.bytes_of(fw, tensors, seen)
        saved = self.saved
        for key in graphs:
            for ptr, n in saved.get(key, {}).items():
                if ptr not in seen:
                    seen.add(ptr)
                    total += n
        return total

    @staticmethod
    def bytes_of(fw: Framework, tensors: Iterable[Any], seen: set[int] | None = None) -> int:
        """Bytes of the distinct buffers among `tensors` (a detached copy shares its buffer)
        that are not in `seen` (which gets them)."""
        seen = set() if seen is None else seen
        total = 0
        for t in tensors:
            if t is None:
                continue
            ptr = fw.data_ptr(t)
            if ptr in seen:
                continue
            seen.add(ptr)
            total += fw.nbytes(t)
        return total


def _tensors(sched: Any) -> Iterator[Any]:
    # A store holds stage values (a tensor, a tuple, a dict) or lists of tensors: their members.
    is_tensor = sched.fw.is_tensor
    for store in (sched._x, sched._y, sched._dx, sched._dy, sched._kept_dy, sched._recv_x):
        for value in store.values():
            yield from (m for m in split(value)[1] if is_tensor(m))
    if sched.deferred is not None:
        yield from sched.deferred.tensors()
