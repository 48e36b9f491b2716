"""What a rank really keeps alive between actions, counted from the interpreter's own stores.

A microbatch graph of stage s is live from its `F` until its last backward action: while the
interpreter holds its output (the graph hangs off it), the gradient kept between a retained
`I` and its `W`, or weight gradients deferred under its key. The bytes are those of every
distinct tensor in the stores (inputs, outputs, gradients waiting to be sent or used), in
the deferred weight gradients, and those autograd saved for the backward of each graph still
alive (seen through `Framework.saving` while its forward runs; parameters are state, not
activations). The checker predicts the count (`ppdsl.memory`); the two agree when the
runtime frees each microbatch at the action the schedule says.

Per stage it also keeps the largest microbatch's bytes after its `F` or `R` (`activation`) and
after its `I` (`kept`): what `ppdsl.memory.peak_bytes` predicts the peak from; and the most
one `OFFLOAD` or `RELOAD` moved (`offloaded`). A microbatch whose saved tensors an `OFFLOAD`
moved to host memory holds no graph on the device until its `RELOAD` (the checker's count).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from ..framework import Framework, ShardedWeights
from ...ir import Kind
from . import values
from .plan import F, I, Op

# The actions after which a stage's size is measured: a forward and a recompute (what the
# graph holds until its backward), an `I` (what it keeps until its `W`).
_MEASURED = (F, int(Kind.R), I)
_OFFLOAD = int(Kind.OFFLOAD)
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
        self.offloaded: dict[int, int] = {}  # per stage: the most one OFFLOAD or RELOAD moved
        # Per stage: the most a forward keeps beside what autograd saved (its input and output):
        # all a forward with a later `R` keeps, and what an `OFFLOAD` leaves on the device.
        self.input: dict[int, int] = {}
        self.output: dict[int, int] = {}  # per stage but the last: its output (and its gradient)
        # Per sharded stage: its sharding, and what gathering its whole weights allocates.
        self.shardings: dict[int, ShardedWeights] = {}
        self.gathered: dict[int, int] = {}

    def observe(self, stages: Mapping[int, Stage], op: Op | None = None) -> None:
        """After an action (`op`: which; an F or an I also measures its stage's size)."""
        t0 = time.perf_counter()
        self._observe(stages)
        if op is not None and op.kind == F and not stages[op.stage].last:
            # The output, and so its gradient: what a message of it holds.
            stage = stages[op.stage]
            value = stage.outputs.get(op.microbatch)
            size = self.bytes_of(stage.fw, [t for t in values.split(value)[1] if stage.fw.is_tensor(t)])
            self.output[op.stage] = max(self.output.get(op.stage, 0), size)
        if op is not None and op.kind == _OFFLOAD:
            # What the stage still holds for the microbatch with its saved tensors in host memory.
            stage = stages[op.stage]
            size = self.bytes_of(stage.fw, stage.graph_tensors(op.microbatch), set(self.parameters))
            self.input[op.stage] = max(self.input.get(op.stage, 0), size)
        elif op is not None and op.kind in _MEASURED:
            stage = stages[op.stage]
            m = op.microbatch
            if op.kind == F and m in stage.awaiting:
                # A forward whose `R` is to come kept its input only (the `R` measures the graph).
                size = self.bytes_of(stage.fw, [*stage.kept_input_tensors(m), *stage.graph_tensors(m)],
                                     set(self.parameters))
                self.input[op.stage] = max(self.input.get(op.stage, 0), size)
            else:
                table = self.kept if op.kind == I else self.activation
                size = self._bytes(stage.fw, stage.graph_tensors(m), [(op.stage, m)] if m in stage.outputs else [])
                table[op.stage] = max(table.get(op.stage, 0), size)
        self.seconds += time.perf_counter() - t0

    def moved(self, stage: int, nbytes: int) -> None:
        """An `OFFLOAD` or `RELOAD` of `stage` moved `nbytes`."""
        if nbytes > self.offloaded.get(stage, 0):
            self.offloaded[stage] = nbytes

    def saving(self, fw: Framework, key: tuple[int, int]) -> AbstractContextManager[Any]:
        """Around a forward: note what autograd saves for the graph `key` (not the whole
        weights of a sharded stage: gathered by the time anything is saved, they are counted
        as `gathered`)."""
        saved = self.saved[key] = {}
        weights: list[set[int]] = []

        def pack(t: Any) -> None:
            if not weights:
                weights.append(self._gathered_pointers())
            if fw.storage_ptr(t) not in weights[0]:
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
            # The graphs alive now: not a forward whose `R` is to come (it saved nothing; what
            # its key holds is the last step's).
            outputs.extend((s, m) for m in stage.outputs if m not in stage.awaiting)
        if stages:  # deferred weight gradients are one store for the rank's stages
            deferred = next(iter(stages.values())).deferred
            if deferred is not None:
                tensors.extend(deferred.tensors())
        if graphs > self.peak_graphs:
            self.peak_graphs = graphs
        if fw is None:
            return
        held = self._bytes(fw, tensors, outputs)
        for s, sharding in self.shardings.items():  # a sharded stage's whole weights, while gathered
            whole, _ = sharding.gathered_now()
            held += whole
            if whole > self.gathered.get(s, 0):
                self.gathered[s] = whole
        if held > self.peak_bytes:
            self.peak_bytes = held

    def _gathered_pointers(self) -> set[int]:
        return set().union(*(sharding.gathered_now()[1] for sharding in self.shardings.values()))

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
