"""`Stage`: one stage a rank holds, with everything it keeps between actions and its compute.

A stage owns its layer and, per microbatch of the running step, the values that live between
its actions: the input members that need a gradient, its output (the graph hangs off it), the
gradients of its input (waiting to be sent or handed down), the gradients of its output
(received), an activation received before its forward, and what a retained `I` keeps for its
`W`. The schedule only orders: its handlers (`handlers.py`) route values between stages and
ranks and call the stage's `forward`, `backward`, `backward_input` and `backward_weight`.
Memory and the profile read the stage through `tensors` and `graph_tensors`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from . import values
from ..errors import SetupError
from ..framework import Framework, GradRefused, ShardedWeights, SplitCostly, SplitRefused
from .split_backward import DeferredGrads, GraphSplit


class Saved:
    """A tensor autograd saved for a backward, on the device (`tensor`) or in host memory (`host`)."""

    __slots__ = ("tensor", "host", "shape")

    def __init__(self, tensor: Any):
        self.tensor: Any = tensor
        self.host: Any = None
        self.shape: list[int] | None = None  # in host memory: its shape, where the copy is shared


class Stage:
    """Stage `index` of the program, held by this rank as `layer`.

    `head`, set by the schedule on the last stage, takes the stage's output of microbatch m
    and returns what the stage keeps (when training, the scaled loss its backward starts from)."""

    def __init__(self, index: int, layer: Any, fw: Framework, *, first: bool, last: bool, training: bool,
                 deferred: DeferredGrads | None = None, graph: GraphSplit | None = None):
        self.index = index
        self.layer = layer
        self.fw = fw
        self.first = first
        self.last = last
        self.training = training
        self.deferred = deferred
        self.graph = graph  # the weights the autograd graph defers to W (with the split)
        self.head: Callable[[int, Any], Any] | None = None
        #: Microbatches whose forward an `R` of this rank runs again, and whose saved tensors
        #: an `OFFLOAD` moves to host memory (set by the schedule).
        self.recomputed: set[int] = set()
        self.offloaded: set[int] = set()
        #: Its weights' sharding over a group of ranks (FSDP), driven by UNSHARD, RESHARD and
        #: REDUCE_GRAD; None when the stage holds them whole.
        try:
            self.sharding: ShardedWeights | None = fw.sharded(layer)
        except ValueError as exc:
            raise SetupError(f"stage {index}: {exc}") from None
        self._params = {fw.data_ptr(p) for _, p in fw.named_parameters(layer)}
        self._keeps_input = training and not first  # the first stage's input needs no gradient
        self.reset()

    def reset(self) -> None:
        """Drop what the last step left (a failed step leaves values behind)."""
        self.inputs: dict[int, list[Any]] = {}  # input members that need a gradient (leaves)
        self.outputs: dict[int, Any] = {}  # the output; the scaled loss at the last stage
        self.input_grads: dict[int, list[Any]] = {}  # gradients of those input members, to hand down
        self.output_grads: dict[int, list[Any]] = {}  # gradients of the output members, received
        self.received: dict[int, Any] = {}  # an activation received before this stage's forward
        self.kept: dict[int, Any] = {}  # an output gradient kept between a retained I and its W
        self.whole: set[int] = set()  # microbatches whose I ran the whole backward
        self.kept_inputs: dict[int, tuple[Any, dict[str, Any], Any]] = {}  # input, kwargs, RNG, until R
        self.awaiting: set[int] = set()  # microbatches whose output has no graph until their R
        self.saved: dict[int, list[Saved]] = {}  # what a forward saved, for OFFLOAD and RELOAD
        self.moved: set[int] = set()  # microbatches whose saved tensors are in host memory

    # --- compute ------------------------------------------------------------------------
    def forward(self, m: int, x: Any, kwargs: dict[str, Any]) -> Any:
        """Run the layer on `x`; keep the output (or the scaled loss) for the backward. A
        microbatch an `R` runs again keeps its input instead (`recompute`)."""
        if self.keeps_input_only(m):
            # The graph is built and dropped: the output's members keep their gradient flags
            # (the next stage and the messages need them), and nothing saved for the backward
            # outlives the forward. The RNG state is kept so the `R` draws what this one did.
            self.kept_inputs[m] = (x, kwargs, self.fw.rng_state())
            y = values.hand_over(self.fw, self._run(m, x, kwargs, pack=False), True)
            self.outputs[m] = y
            self.awaiting.add(m)
            return y
        y = self._run(m, x, kwargs)
        self.outputs[m] = y
        return y

    def keeps_input_only(self, m: int) -> bool:
        """Whether the forward of microbatch m keeps only its input (an `R` runs it again)."""
        return self.training and m in self.recomputed

    def recompute(self, m: int) -> Any:
        """`R`: the forward of microbatch m again, with autograd, from the input its `F` kept
        and with the random state it had (restored afterwards, so the draws that follow are
        those of a run without the `R`)."""
        x, kwargs, state = self.kept_inputs.pop(m)
        now = self.fw.rng_state()
        self.fw.set_rng_state(state)
        try:
            y = self._run(m, x, kwargs)
        finally:
            self.fw.set_rng_state(now)
        self.outputs[m] = y
        self.awaiting.discard(m)
        return y

    def _run(self, m: int, x: Any, kwargs: dict[str, Any], pack: bool = True) -> Any:
        if pack and m in self.offloaded and self.training:
            with self._packing(m):
                return self._run(m, x, kwargs, pack=False)
        graph = self.graph
        if graph is not None and graph.active:
            with self.fw.hooks_registered() as hooks:
                y = values.call(self.layer, x, kwargs)
            if hooks:
                warnings.warn(graph.refuse(f"the forward put a hook on an activation ({hooks[0]}), which a second "
                                           "call of the node that made it would run again"), stacklevel=3)
        else:
            y = values.call(self.layer, x, kwargs)
        if self.head is not None:
            y = self.head(m, y)
        if self._keeps_input:
            self.inputs[m] = values.grad_members(self.fw, x)
        return y

    # --- OFFLOAD and RELOAD ---------------------------------------------------------------
    def _packing(self, m: int) -> Any:
        """Around the forward of a microbatch an `OFFLOAD` moves: every tensor autograd saves
        (but the stage's parameters, which stay) is held by a `Saved` the stage keeps."""
        held = self.saved[m] = []
        params = self._params
        data_ptr = self.fw.data_ptr

        def pack(t: Any) -> Any:
            if data_ptr(t) in params:
                return t
            saved = Saved(t)
            held.append(saved)
            return saved

        index = self.index

        def unpack(saved: Any) -> Any:
            if not isinstance(saved, Saved):
                return saved
            if saved.tensor is None:  # the checker's PPS111 keeps a valid program from this
                raise RuntimeError(f"stage {index}, microbatch {m}: its activations are in host memory: the "
                                   "backward ran between its OFFLOAD and its RELOAD")
            return saved.tensor

        return self.fw.packing(pack, unpack)

    def offload(self, m: int, elsewhere: Iterable[Any] = ()) -> int:
        """`OFFLOAD`: the tensors the forward of microbatch m saved, copied to host memory and
        dropped from the device (the stage keeps no other reference). `elsewhere`: values
        the schedule holds for the microbatch (its inputs, its targets). Returns the bytes moved."""
        moved = 0
        nbytes, data_ptr = self.fw.nbytes, self.fw.data_ptr
        # A saved tensor held anyway (the stage's input or output, the batch's own) stays:
        # moving it would free nothing, and its reload would be a second copy beside it.
        kept = [self.inputs[m]] if m in self.inputs else []
        kept += [self.outputs[m]] if m in self.outputs else []
        held = {data_ptr(t) for value in (*kept, *elsewhere) for t in values.split(value)[1] if self.fw.is_tensor(t)}
        # Autograd may save one buffer more than once (a tensor and its reshape): one copy of
        # it, each contiguous view made again from that copy on the way back.
        fw = self.fw
        copies: dict[object, Any] = {}
        for saved in self.saved.get(m, ()):
            t = saved.tensor
            if t is None or data_ptr(t) in held:
                continue
            shared = fw.is_contiguous(t)
            key: object = (data_ptr(t), nbytes(t), fw.dtype_name(t)) if shared else id(t)
            if key not in copies:
                moved += nbytes(t)
                copies[key] = fw.to_host(t)
            saved.host, saved.tensor = copies[key], None
            saved.shape = fw.shape(t) if shared else None
        self.moved.add(m)
        return moved

    def reload(self, m: int) -> int:
        """`RELOAD`: those tensors copied back to the device, where the backward finds them
        (until it runs, `device_saved` counts them). Returns the bytes moved."""
        moved = 0
        nbytes = self.fw.nbytes
        copies: dict[int, Any] = {}  # per host copy (by identity), its one device copy
        fw = self.fw
        for saved in self.saved.get(m, ()):
            if saved.host is not None:
                key = id(saved.host)
                if key not in copies:
                    copies[key] = fw.from_host(saved.host)
                    moved += nbytes(copies[key])
                back = copies[key]
                if saved.shape is not None and saved.shape != fw.shape(back):
                    back = fw.reshape(back, saved.shape)
                saved.tensor, saved.host, saved.shape = back, None, None
        self.moved.discard(m)
        return moved

    def device_saved(self, m: int) -> list[Any]:
        """What autograd saved for microbatch m under an `OFFLOAD`'s hooks and is on the device
        now (after the forward, or after the `RELOAD`): the graph's bulk, which the stage holds."""
        return [saved.tensor for saved in self.saved.get(m, ()) if saved.tensor is not None]

    def differentiated(self, y: Any) -> list[Any]:
        """What a backward starts from: the loss, or the output members that need a gradient."""
        return [y] if self.last else values.grad_members(self.fw, y)

    def backward(self, m: int, grads: list[Any] | None) -> None:
        """The full backward of microbatch m, from `grads` of its output (None: the loss)."""
        outs = self.differentiated(self.outputs.pop(m))
        if outs:
            self.fw.backward(outs, grads)
        self.saved.pop(m, None)  # the graph is gone: what it saved is freed with it
        if not self.first:
            leaves = self.inputs.pop(m)
            self.input_grads[m] = self._input_grads(leaves, [self.fw.grad_of(x) for x in leaves])

    def backward_split(self, m: int, grads: list[Any] | None) -> None:
        """With the split: `I`, the backward with every deferred weight gradient left to `W`
        (the split Linears' by their own backward, the others' on the autograd graph)."""
        graph = self.graph
        if graph is None or not graph.active:
            self.backward(m, grads)
            return
        outs = self.differentiated(self.outputs[m])
        leaves = self.inputs.get(m, []) if not self.first else []
        while True:
            try:
                found, rest = self.fw.backward_split(outs, grads, leaves, graph.eager, graph.deferred) \
                    if outs else ([None] * len(leaves), None)
                break
            except SplitCostly as costly:  # before any work: those weights go to I from now on
                graph.keep_in_i(costly.weights, costly.nodes)
                if not graph.active:
                    self.backward(m, grads)
                    return
            except SplitRefused as exc:  # before any work: the whole backward, from now on
                warnings.warn(graph.refuse(str(exc)), stacklevel=2)
                self.backward(m, grads)
                return
        del self.outputs[m]
        self.inputs.pop(m, None)
        self.saved.pop(m, None)  # the graph keeps what the weights' part needs
        if rest is not None:
            assert self.deferred is not None
            self.deferred.defer_call((self.index, m), rest)
        if not self.first:
            self.input_grads[m] = self._input_grads(leaves, found)

    def backward_input(self, m: int, grads: list[Any] | None) -> None:
        """Without the split matmul: the gradient of the input only, with the graph kept for `W`."""
        self.kept[m] = grads
        if self.first:
            return
        leaves = self.inputs[m]
        outs = self.differentiated(self.outputs[m])
        # The stage's parameters too, though their gradients are dropped: `paddle.grad` w.r.t.
        # the input alone returns a wrong input gradient through `nn.LayerNorm` once its weight
        # is no longer all ones (paddle 3.3.1, checked against finite differences).
        params = self.fw.trainable(self.layer)
        try:
            found = self.fw.grad(outs, leaves + params, grads) if outs and leaves else [None] * len(leaves)
        except GradRefused:  # e.g. a reentrant checkpoint: the whole backward now, W has nothing left
            del self.kept[m]
            self.whole.add(m)
            self.backward(m, grads)
            return
        self.input_grads[m] = self._input_grads(leaves, found[:len(leaves)])

    def backward_weight(self, m: int) -> None:
        """Without the split matmul: the second backward, through the graph `I` kept."""
        if m in self.whole:
            self.whole.discard(m)
            return
        y = self.outputs.pop(m)
        grads = self.kept.pop(m)
        self.inputs.pop(m, None)
        outs = self.differentiated(y)
        if outs:
            self.fw.backward(outs, grads)
        self.saved.pop(m, None)

    def deferred_weight(self, m: int) -> tuple[bool, bool]:
        """The split matmul's `W`: (whether it computed anything, whether the forward deferred to it)."""
        deferred = self.deferred
        assert deferred is not None
        key = (self.index, m)
        expected = deferred.expects(key)
        return deferred.run(key) > 0, expected

    def _input_grads(self, leaves: list[Any], grads: Sequence[Any]) -> list[Any]:
        # A member the stage did not use has no gradient: its sender still waits for one.
        return [g if g is not None else self.fw.zeros_like(x) for x, g in zip(leaves, grads)]

    # --- what memory and the profile read -----------------------------------------------
    def live_graphs(self) -> set[int]:
        """Microbatches whose graph this stage still holds (weight gradients deferred included;
        not a forward whose `R` is still to come: it kept only its input; nor one whose saved
        tensors an `OFFLOAD` moved to host memory)."""
        live = set(self.outputs) - self.awaiting - self.moved
        live.update(self.kept)
        if self.deferred is not None:
            live.update(m for s, m in self.deferred.keys() if s == self.index)
        return live

    def tensors(self) -> Iterator[Any]:
        """Every tensor the stage keeps between actions (members of stored values)."""
        is_tensor = self.fw.is_tensor
        for store in (self.inputs, self.outputs, self.input_grads, self.output_grads, self.kept, self.received):
            for value in store.values():
                yield from (t for t in values.split(value)[1] if is_tensor(t))
        for x, kwargs, _ in self.kept_inputs.values():  # an R's input (its RNG state is not the stage's)
            yield from (t for t in values.split((x, kwargs))[1] if is_tensor(t))
        for m in self.saved:  # what an offloaded microbatch saved, while it is on the device
            yield from self.device_saved(m)

    def kept_input_tensors(self, m: int) -> list[Any]:
        """The tensors a forward whose `R` is to come keeps for it: its input and keyword arguments."""
        if m not in self.kept_inputs:
            return []
        x, kwargs, _ = self.kept_inputs[m]
        return [t for t in values.split((x, kwargs))[1] if self.fw.is_tensor(t)]

    def graph_tensors(self, m: int) -> list[Any]:
        """The tensors kept for microbatch m's graph: its input, output and kept gradient."""
        is_tensor = self.fw.is_tensor
        out = [t for store in (self.inputs, self.outputs, self.kept) if m in store
               for t in values.split(store[m])[1] if is_tensor(t)]
        if self.deferred is not None:
            out.extend(self.deferred.tensors((self.index, m)))
        out.extend(self.device_saved(m))
        return out
