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
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from ..framework import Framework
from .plan import F, I, Op
from .stage import Stage


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

    def observe(self, stages: Mapping[int, Stage], op: Op | None = None) -> None:
        """After an action (`op`: which; an F or an I also measures its stage's size)."""
        t0 = time.perf_counter()
        self._observe(stages)
        if op is not None and op.kind in (F, I):
            stage = stages[op.stage]
            table = self.activation if op.kind == F else self.kept
            m = op.microbatch
            size = self._bytes(stage.fw, stage.graph_tensors(m), [(op.stage, m)] if m in stage.outputs else [])
            table[op.stage] = max(table.get(op.stage, 0), size)
        self.seconds += time.perf_counter() - t0

    def saving(self, fw: Framework, key: tuple[int, int]) -> AbstractContextManager[Any]:
        """Around a forward: note what autograd saves for the graph `key`."""
        saved = self.saved[key] = {}

        def pack(t: Any) -> None:
            saved[fw.data_ptr(t)] = fw.nbytes(t)

        context: AbstractContextManager[Any] = fw.saving(pack)
        return context

    def _observe(self, stages: Mapping[int, Stage]) -> None:
        graphs = 0
        tensors: list[Any] = []
        outputs: list[tuple[int, int]] = []
        fw: Framework | None = None
        for s, stage in stages.items():
            fw = stage.fw
            graphs += len(stage.live_graphs())
            tensors.extend(stage.tensors())
            outputs.extend((s, m) for m in stage.outputs)
        if stages:  # deferred weight gradients are one store for the rank's stages
            deferred = next(iter(stages.values())).deferred
            if deferred is not None:
                tensors.extend(deferred.tensors())
        if graphs > self.peak_graphs:
            self.peak_graphs = graphs
        if fw is None:
            return
        held = self._bytes(fw, tensors, outputs)
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
