"""What a rank really keeps alive between actions, counted from the interpreter's own stores.

A microbatch graph of stage s is live from its `F` until its last backward action: while the
interpreter holds its output (the graph hangs off it), the gradient kept between a retained
`I` and its `W`, or weight gradients deferred under its key. The bytes are those of every
distinct tensor in the stores (inputs, outputs, gradients waiting to be sent or used) and in
the deferred weight gradients; autograd's own saved tensors inside a graph are not visible
from here and are not counted. The checker predicts the count (`ppdsl.memory`); the two
agree when the runtime frees each microbatch at the action the schedule says.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

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

    def observe(self, sched: Any) -> None:
        t0 = time.perf_counter()
        self._observe(sched)
        self.seconds += time.perf_counter() - t0

    def _observe(self, sched: Any) -> None:
        graphs = set(sched._y)
        graphs.update(sched._kept_dy)
        deferred = sched.deferred
        if deferred is not None:
            graphs.update(deferred.keys())
        if len(graphs) > self.peak_graphs:
            self.peak_graphs = len(graphs)
        held = self.bytes_of(sched.fw, _tensors(sched))
        if held > self.peak_bytes:
            self.peak_bytes = held

    @staticmethod
    def bytes_of(fw: Framework, tensors: Iterable[Any]) -> int:
        """Bytes of the distinct buffers among `tensors` (a detached copy shares its buffer)."""
        seen: set[int] = set()
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
