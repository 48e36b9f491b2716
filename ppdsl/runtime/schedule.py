"""`PipelineSchedule`: run one rank's part of a `.pps` program, step by step, with Paddle or PyTorch.

The interpreter is written once; what differs between frameworks (tensors, autograd,
process groups, messages) goes through the framework's adapter (`framework.py`), chosen from
the stage layers' type. Shaped like Paddle's `PipelineScheduleSingle`: build it from a program, this rank's stage
layers and a loss function, then call `step(inputs, target=..., losses=[...])` once per batch
and step the optimizer yourself. Gradients accumulate over the microbatches of a step.

Each action of the rank's row runs in order:
- `F`: forward of that stage on that microbatch. The first stage reads the microbatch input,
  a later stage the value received (or handed over locally by the stage before it on this
  rank); the last stage computes the loss. A value is a tensor, a tuple or a dict (values.py).
- `B`: full backward. `I`: the backward with the weight gradients of the stage's Linear layers
  left out and kept, keyed by (stage, microbatch), for `W`, which computes exactly those (see
  `split_backward.py`). With `split_backward=False`: `I` is the framework's `grad` w.r.t. the stage
  input (and, for a right answer, its parameters) with the graph kept and `W` a second full
  backward (every matmul twice).
- `SEND_*`/`RECV_*`: blocking P2P on the pair's own 2-rank group; a batch `<...>` is one
  `batch_isend_irecv` on NCCL and its members in written order on gloo.
- `UNSHARD`/`RESHARD`/`REDUCE_GRAD`: no-ops (no data parallelism here), logged at debug level.

The layout, shapes, dtypes and gradient flags of each value crossing ranks travel in one
header message on the first step and are cached; later steps check that shapes did not change.

The label guard: the transports match a receive with the next message sent on its link,
whatever microbatch it carries (no tags on gloo or NCCL). So on the first step every message
carries its label (kind, stage, microbatch, place on the link) in the header before it (the
value header of a forward; an empty header of the same size for a backward), and a receive that
gets another label than the one it expects stops with both actions named
(`MessageOrderError`) instead of computing on the wrong microbatch. The order is the same
every step, so later steps send no labels.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from ..gcpause import no_gc
from ..ir import Kind, Program
from . import plan as P
from . import values as V
from .comm import DTYPES, LABEL, MAX_DIMS, MAX_ELEMENTS, Label, PeerError, Transport, comm_model_of, gather_objects
from .framework import Framework, framework_of, get_framework
from .memory import LiveMemory
from .preflight import prepare
from .split_backward import DeferredGrads, switch_linears
from .watchdog import Reporter, Watchdog

log = logging.getLogger("ppdsl.runtime")

Key = tuple[int, int]


class StepError(RuntimeError):
    """An action failed: names the rank, step and action."""

    def __init__(self, rank: int, step: int, action: str, message: str, peer: bool = False):
        self.rank, self.step, self.action, self.detail = rank, step, action, message
        self.peer = peer  # the transport failed: the cause may be another rank
        super().__init__(f"rank {rank}, step {step}, action {action}: {message}")


class MessageOrderError(StepError):
    """A receive got the message of another action than the one it expects (label guard)."""


class SetupError(RuntimeError):
    """The model, data or program cannot run; raised before any schedule communication."""


class PipelineSchedule:
    """One rank's interpreter for a program.

    `stages` maps each stage index this rank holds to its layer (or lists them in stage
    order). `loss_fn(output, target)` must return a scalar. With `scale_grads` (default) each
    microbatch's loss is divided by the number of microbatches before its backward, so the
    gradients are those of the mean loss; Paddle's own schedules leave them summed.
    With `split_backward` (default) and a program that has `I`/`W` actions, every plain
    Linear (`paddle.nn.Linear`, `torch.nn.Linear`) of the stage layers is switched to the split matmul (same parameters,
    numerics and state dict); `split_warnings` names any Linear that could not be.
    `profile=True` fills `timings` (per action label) and `memory` (live microbatches and bytes).

    `check=False` skips the checker (and so its refusal of a program that would hang): the
    program runs as written, and the label guard still stops a send/receive order that does
    not match. The private `_guard=False` turns the guard off as well; it exists for the
    soundness tests, which must see what the bare transport does with such an order.
    `_transport` reuses the pair groups of an earlier schedule over the same pairs whose last
    step completed on every rank (creating a gloo group costs ~0.3 s); the soundness tests run
    many programs so.
    """

    def __init__(self, program: Program, stages: Mapping[int, Any] | Sequence[Any],
                 loss_fn: Callable[[Any, Any], Any] | None, *, rank: int | None = None,
                 timeout: float = 60.0, scale_grads: bool = True, watchdog: Watchdog | None = None,
                 backend: str | None = None, profile: bool = False, split_backward: bool = True,
                 check: bool = True, pause_gc: bool = True, framework: str | Framework | None = None,
                 _guard: bool = True, _transport: Transport | None = None):
        fw = self.fw = _framework(framework, stages)
        self.rank = fw.rank() if rank is None else rank
        # One process needs no process group; without one there is no backend to ask.
        self.backend = (backend or (fw.backend() if fw.is_initialized() else "gloo")).lower()
        self.comm_model = comm_model_of(self.backend)
        # Lint (and lower) under the backend's own model before anything is sent.
        self.program = prepare(program, self.comm_model, check=check)
        self.plan = P.compile_rank(self.program, self.rank)
        self.layers = _stage_map(fw, stages, self.plan)
        if self.plan.training and loss_fn is None:
            raise SetupError("a training program needs a loss function")
        self.loss_fn = loss_fn
        self.scale = 1.0 / self.plan.microbatches if scale_grads else 1.0
        self.watchdog = watchdog or Watchdog(timeout, Reporter(self.rank))
        self.step_index = 0
        self.profile = profile
        self.pause_gc = pause_gc
        # Called with (step, op index) before each op: the launcher's crash report reads it.
        self.mark: Callable[[int, int], None] | None = None
        self.timings: dict[str, list[float]] = {}
        self.started: dict[str, list[float]] = {}  # perf_counter at each start (same clock on one machine)
        self.memory = LiveMemory()
        self.deferred: DeferredGrads | None = None
        self.split_warnings: list[str] = []
        if split_backward and self.plan.training and _has_split_backward(self.plan):
            self._switch_layers()
        self.guard = _guard
        self._labels = _guard  # True until the first step has run: only it sends labels
        self._sent_on: dict[int, int] = {}  # peer -> messages sent to it so far (first step)
        self._received_on: dict[int, int] = {}
        self._agree_on_program()
        if _transport is not None and _transport.pairs == self.plan.pairs and _transport.backend == self.backend:
            self.transport = _transport
            self.transport.watchdog = self.watchdog
        else:
            self.transport = Transport(fw, self.rank, self.plan.pairs, self.watchdog, self.backend)
        # Agreed on the first step: the shapes each send carries, what each receive allocates.
        self._sent: dict[tuple[int, Key], list[list[int]]] = {}
        self._recv_meta: dict[Key, V.Incoming] = {}
        self._loss_checked = False
        split = self.deferred is not None
        self._handlers: dict[int, Callable[[P.Op], None]] = {
            P.F: self._forward, P.B: self._backward,
            P.I: self._input_grad if split else self._backward_input,
            P.W: self._deferred_weight_grad if split else self._backward_weight,
            P.SEND_F: self._send_f, P.RECV_F: self._recv_f, P.SEND_B: self._send_b, P.RECV_B: self._recv_b,
            P.NOOP: self._noop, P.OVERLAP: self._overlap, P.BATCH: self._batch,
        }
        self._compiled = [(self._handlers[op.code], op) for op in self.plan.ops]
        self._reset()

    # --- set-up -----------------------------------------------------------------------------
    def _switch_layers(self) -> None:
        self.deferred = DeferredGrads(self.fw)
        for s, layer in sorted(self.layers.items()):
            _, kept = switch_linears(layer, self.deferred)
            for name in kept:
                message = (f"stage {s}: layer {name} overrides Linear.forward, so its weight gradient "
                           "cannot be deferred to W; it is computed with the input gradient in I")
                self.split_warnings.append(message)
                warnings.warn(message, stacklevel=3)

    def _agree_on_program(self) -> None:
        """All ranks compare the digest of the program they hold, and fail together."""
        self.watchdog.arm("checking that all ranks run the same program", "all ranks")
        gathered = gather_objects(self.fw, (self.plan.digest, self.guard))
        self.watchdog.disarm()
        digests = [digest for digest, _ in gathered]
        if len(set(digests)) != 1:
            groups: dict[str, list[int]] = {}
            for r, d in enumerate(digests):
                groups.setdefault(d, []).append(r)
            desc = "; ".join(f"ranks {', '.join(map(str, rs))} hold program {d[:12]}" for d, rs in groups.items())
            raise SetupError(f"the ranks do not hold the same program (text, placement or shape): {desc}")
        unguarded = [r for r, (_, guarded) in enumerate(gathered) if not guarded]
        if unguarded and len(unguarded) != len(gathered):
            raise SetupError(f"ranks {', '.join(map(str, unguarded))} run without the label guard and the others "
                             "with it: the first step's messages would not line up")

    def _reset(self) -> None:
        self._x: dict[Key, list[Any]] = {}  # a stage's input members that need a gradient (leaves)
        self._y: dict[Key, Any] = {}      # stage output; the scaled loss at the last stage
        self._dx: dict[Key, list[Any]] = {}  # gradients of those input members, to hand down
        self._dy: dict[Key, list[Any]] = {}  # gradients of the output members that need one, received
        self._kept_dy: dict[Key, Any] = {}  # between a retained I and its W (split_backward=False)
        self._recv_x: dict[Key, Any] = {}
        self._losses: dict[int, Any] = {}
        self._outputs: dict[int, Any] = {}  # the last stage's outputs, for return_output
        self._inputs: list[Any] = []
        self._targets: list[Any] = []
        self._kwargs: list[dict[str, Any]] = []
        self._keep_outputs = False
        if self.deferred is not None:
            self.deferred.clear()

    # --- the step ---------------------------------------------------------------------------
    def step(self, *args: Any, target: Any = None, losses: list[Any] | None = None,
             return_output: bool = False, **kwargs: Any) -> Any:
        """Run the schedule once over a whole batch (split into the program's microbatches).

        As Paddle's schedules: the first stage is called with `args` (each microbatch's share),
        every stage this rank holds also with `kwargs`; `target` feeds the loss at the last
        stage. With `return_output`, the last stage's rank gets the outputs merged back."""
        return self.run_batch(args, target=target, losses=losses, kwargs=kwargs, return_output=return_output)

    def run_batch(self, inputs: Any, *, target: Any = None, losses: list[Any] | None = None,
                  kwargs: dict[str, Any] | None = None, return_output: bool = False) -> Any:
        """`step` with the first stage's input as one value: a tensor, a tuple (positional
        arguments) or a dict (keyword arguments)."""
        plan = self.plan
        self._reset()
        self._keep_outputs = return_output  # else the last stage's outputs die with their backward
        fw = self.fw
        M = plan.microbatches
        try:
            if plan.first_stage:
                if inputs is None or (type(inputs) is tuple and not inputs):
                    raise SetupError("the first stage needs the batch's inputs: step(inputs, target=...)")
                self._inputs = V.split_batch(fw, inputs, M, "inputs")
            if plan.last_stage and plan.training:
                if target is None:
                    raise SetupError("the last stage needs the batch's targets: step(inputs, target=...)")
                self._targets = V.split_batch(fw, target, M, "target")
            self._kwargs = V.split_batch(fw, dict(kwargs or {}), M, "keyword arguments", need_tensor=False)
        except V.StageValueError as exc:
            raise SetupError(str(exc)) from None
        wd = self.watchdog
        wd.step = self.step_index
        op: P.Op | None = None
        # Python's cyclic collector would otherwise run inside the step, on whichever rank's
        # allocations cross its threshold: measured in one process, about 2% of a step, in
        # pauses of up to tens of ms (a full pass over Paddle's ~130k objects), which delay
        # every rank waiting on that one. Paused, its work moves to the end of the step.
        try:
            with no_gc(promote=False) if self.pause_gc else nullcontext():
                if self.profile or self.mark is not None:
                    timings = self.timings if self.profile else None
                    started = self.started
                    mark = self.mark
                    clock = time.perf_counter
                    step = self.step_index
                    memory = self.memory if self.profile else None
                    # An action's time runs from the end of the one before: the interpreter's own
                    # work between two actions belongs to the rank's timeline too. Counting memory
                    # is the profile's own work: it is left out (also inside an overlapped pair).
                    t0 = clock()
                    for i, (handler, op) in enumerate(self._compiled):
                        if mark is not None:
                            mark(step, i)
                        counted = memory.seconds if memory is not None else 0.0
                        handler(op)
                        if timings is not None:
                            t1 = clock()
                            inner = memory.seconds - counted if memory is not None else 0.0
                            timings.setdefault(op.label, []).append(t1 - t0 - inner)
                            started.setdefault(op.label, []).append(t0)
                            t0 = t1
                        if memory is not None:
                            memory.observe(self)
                            if timings is not None:
                                t0 = clock()
                else:
                    for handler, op in self._compiled:
                        handler(op)
        except StepError:
            raise
        except (SetupError, V.StageValueError) as exc:
            raise StepError(self.rank, self.step_index, op.label if op else "?", str(exc)) from None
        except PeerError as exc:
            raise StepError(self.rank, self.step_index, op.label if op else "?", str(exc), peer=True) from None
        except Exception as exc:  # noqa: BLE001 - any failure becomes a located one
            label = op.label if op else "?"
            raise StepError(self.rank, self.step_index, label, f"{type(exc).__name__}: {exc}") from exc
        finally:
            wd.disarm()
        self._labels = False
        if losses is not None and plan.last_stage and plan.training:
            losses.extend(self._losses[m] for m in sorted(self._losses))
        self.step_index += 1
        if return_output and plan.last_stage and self._outputs:
            return V.merge_batch(fw, [self._outputs[m] for m in sorted(self._outputs)])
        return None

    def last_losses(self) -> list[float]:
        """This step's microbatch losses as floats (last-stage rank only; else empty)."""
        return [float(self._losses[m]) for m in sorted(self._losses)]

    # --- compute ----------------------------------------------------------------------------
    def _forward(self, op: P.Op) -> None:
        s, m = op.stage, op.microbatch
        plan = self.plan
        if s == 0:
            x = self._inputs[m]
        elif self.program.placement[s - 1] == self.rank:
            x = V.hand_over(self.fw, self._y[(s - 1, m)], plan.training)
        else:
            x = self._recv_x.pop((s, m))
        y = V.call(self.layers[s], x, self._kwargs[m])
        if s == plan.stages - 1:
            if self._keep_outputs:
                self._outputs[m] = y
            if plan.training:
                assert self.loss_fn is not None
                loss = self.loss_fn(y, self._targets[m])
                if not self._loss_checked:
                    _check_loss(self.fw, loss)
                    self._loss_checked = True
                self._losses[m] = loss.detach()
                y = loss * self.scale if self.scale != 1.0 else loss
        if s > 0 and plan.training:
            self._x[(s, m)] = V.grad_members(self.fw, x)
        self._y[(s, m)] = y

    def _grad_of_output(self, s: int, m: int) -> list[Any] | None:
        """The gradients of the output members that need one (None at the last stage: the loss)."""
        if s == self.plan.stages - 1:
            return None
        if self.program.placement[s + 1] == self.rank:
            return self._dx.pop((s + 1, m))
        return self._dy.pop((s, m))

    def _differentiated(self, s: int, y: Any) -> list[Any]:
        """What a stage's backward starts from: the loss, or the output members that need a gradient."""
        return [y] if s == self.plan.stages - 1 else V.grad_members(self.fw, y)

    def _input_grads(self, leaves: list[Any], grads: Sequence[Any]) -> list[Any]:
        # A member the stage did not use has no gradient: its sender still waits for one.
        return [g if g is not None else self.fw.zeros_like(x) for x, g in zip(leaves, grads)]

    def _backward(self, op: P.Op) -> None:
        s, m = op.stage, op.microbatch
        y = self._y.pop((s, m))
        g = self._grad_of_output(s, m)
        outs = self._differentiated(s, y)
        if outs:
            self.fw.backward(outs, g)
        if s > 0:
            leaves = self._x.pop((s, m))
            self._dx[(s, m)] = self._input_grads(leaves, [self.fw.grad_of(x) for x in leaves])

    def _input_grad(self, op: P.Op) -> None:
        """`I` with the split matmul: one backward (the graph is freed), weight grads deferred."""
        assert self.deferred is not None
        self.deferred.key = (op.stage, op.microbatch)
        try:
            self._backward(op)
        finally:
            self.deferred.key = None

    def _deferred_weight_grad(self, op: P.Op) -> None:
        assert self.deferred is not None
        self.deferred.run((op.stage, op.microbatch))

    def _backward_input(self, op: P.Op) -> None:
        s, m = op.stage, op.microbatch
        g = self._grad_of_output(s, m)
        self._kept_dy[(s, m)] = g
        if s > 0:
            leaves = self._x[(s, m)]
            outs = self._differentiated(s, self._y[(s, m)])
            # The stage's parameters too, though their gradients are dropped: `paddle.grad`
            # w.r.t. the input alone returns a wrong input gradient through `nn.LayerNorm` once
            # its weight is no longer all ones (paddle 3.3.1, checked against finite differences).
            params = self.fw.trainable(self.layers[s])
            grads = self.fw.grad(outs, leaves + params, g) \
                if outs and leaves else [None] * len(leaves)
            self._dx[(s, m)] = self._input_grads(leaves, grads[:len(leaves)])

    def _backward_weight(self, op: P.Op) -> None:
        key = (op.stage, op.microbatch)
        y = self._y.pop(key)
        g = self._kept_dy.pop(key)
        self._x.pop(key, None)
        outs = self._differentiated(op.stage, y)
        if outs:
            self.fw.backward(outs, g)

    def _overlap(self, op: P.Op) -> None:
        for part in op.parts:  # forwards first (plan order): a forward never needs a backward
            self._handlers[part.code](part)
            if self.profile:  # the forward allocates before the backward frees: both count
                self.memory.observe(self)

    def _noop(self, op: P.Op) -> None:
        log.debug("rank %d: %s is a no-op without data parallelism", self.rank, op.label)

    # --- communication ----------------------------------------------------------------------
    def _outgoing(self, op: P.Op) -> list[Any]:
        """The tensors a send carries, in member order; a new activation's header comes first."""
        key = (op.stage, op.microbatch)
        if op.code == P.SEND_F:
            value = self._y[key]
            members = V.split(value)[1]
            if not all(self.fw.is_tensor(t) for t in members):
                V.describe(self.fw, value, False, f"stage {op.stage}'s output, sent to rank {op.peer} by {op.label}")
            return [self.fw.detach(t) for t in members]
        return self._dx.pop(key)

    def _header(self, op: P.Op) -> tuple[Any, str | None]:
        """The first step's header of a forward send, and the error to raise after sending it
        (a member that cannot cross ranks: the receiver learns why instead of timing out)."""
        key = (op.stage, op.microbatch)
        try:
            meta = V.describe(self.fw, self._y[key], self.plan.training,
                              f"stage {op.stage}'s output, sent to rank {op.peer} by {op.label}")
        except V.StageValueError as exc:
            return Transport.encode_header(self.fw, {"error": str(exc)}), str(exc)
        self._sent[(op.code, key)] = [self.fw.shape(t) for t in V.split(self._y[key])[1]]
        return Transport.encode_header(self.fw, meta), None

    def _first_send(self, op: P.Op, tensors: list[Any]) -> bool:
        """True on the first send of this activation or gradient (a forward one needs a header);
        later, its shapes must be what they were."""
        k = (op.code, (op.stage, op.microbatch))
        known = self._sent.get(k)
        if known is None:
            if op.code == P.SEND_B:
                self._sent[k] = [self.fw.shape(t) for t in tensors]
            return True
        shapes = [self.fw.shape(t) for t in tensors]
        if known != shapes:
            raise SetupError(f"{op.label}: the tensors now have shapes {shapes}, but they had {known} when "
                             "the ranks agreed shapes on the first step")
        return False

    # --- the label guard (first step only) ---------------------------------------------------
    def _label_to_send(self, op: P.Op) -> Label:
        n = self._sent_on[op.peer] = self._sent_on.get(op.peer, 0) + 1
        return Label(Kind(op.code), op.stage, op.microbatch, n)

    def _check_label(self, op: P.Op, received: Any) -> None:
        """Stop with both actions named when the message is not the one `op` expects."""
        n = self._received_on[op.peer] = self._received_on.get(op.peer, 0) + 1
        got = Label.read(self.fw, received, self.plan.stages, self.plan.microbatches)
        if op.code == P.RECV_F:
            want = Label(Kind.SEND_F, op.stage - 1, op.microbatch, n)
        else:
            want = Label(Kind.SEND_B, op.stage + 1, op.microbatch, n)
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
            self.rank, self.step_index, op.label,
            f"messages out of order on the link from rank {op.peer}: this receive is number {n} on that link "
            f"and expects `{want.action}`, but message number {got.ordinal} that rank {op.peer} sent on it is "
            f"`{got.action}` (rank {op.peer}, step {self.step_index}, action {got.action}). The transport hands "
            f"each receive the next message on its link, whatever it carries: {what}. Send and receive in "
            "the same order on both ranks (`ppdsl lint` reports this as PPS212).")

    def _labelled(self, op: P.Op, header: Any | None = None) -> Any:
        """The header to send before `op`'s data: with its label on the first step (a backward
        sends an empty one, the size of a forward's, so either fits where the other was due)."""
        if not self._labels:
            return header
        return self._label_to_send(op).tensor(self.fw, Transport.empty_header(self.fw) if header is None else header)

    def _header_buffer(self) -> Any:
        return Label.empty(self.fw) if self._labels else Transport.empty_header(self.fw)

    def _unlabelled(self, op: P.Op, received: Any) -> Any:
        """The header part of a received header, after checking its label (first step)."""
        if not self._labels:
            return received
        self._check_label(op, received)
        return received[LABEL:]

    def _send_f(self, op: P.Op) -> None:
        tensors = self._outgoing(op) if (op.code, (op.stage, op.microbatch)) in self._sent else None
        if tensors is None:
            header, error = self._header(op)
            self.transport.send(self._labelled(op, header), op.peer, op.label)
            if error is not None:
                raise SetupError(error)
            tensors = self._outgoing(op)
        else:
            self._first_send(op, tensors)
        for t in tensors:
            self.transport.send(t, op.peer, op.label)

    def _send_b(self, op: P.Op) -> None:
        tensors = self._outgoing(op)
        self._first_send(op, tensors)
        if self._labels:
            self.transport.send(self._labelled(op), op.peer, op.label)
        for t in tensors:
            self.transport.send(t, op.peer, op.label)

    def _incoming(self, op: P.Op, header: Any) -> V.Incoming:
        meta = Transport.decode_header(self.fw, header)
        if "error" in meta:
            raise SetupError(f"rank {op.peer} could not send stage {op.stage - 1}'s output: {meta['error']}")
        try:
            incoming = V.parse_description(meta, DTYPES, MAX_DIMS, MAX_ELEMENTS)
        except V.StageValueError as exc:
            raise PeerError(f"from rank {op.peer}: {exc}") from None
        self._recv_meta[(op.stage, op.microbatch)] = incoming
        return incoming

    def _recv_f(self, op: P.Op) -> None:
        key = (op.stage, op.microbatch)
        incoming = self._recv_meta.get(key)
        if incoming is None:
            header = self._header_buffer()
            self.transport.recv(header, op.peer, op.label)
            incoming = self._incoming(op, self._unlabelled(op, header))
        bufs = incoming.buffers(self.fw)
        for b in bufs:
            self.transport.recv(b, op.peer, op.label)
        self._recv_x[key] = incoming.join(self.fw, bufs)

    def _recv_b_buffers(self, op: P.Op) -> list[Any]:
        # The gradient of an output member has that member's shape: no header needed.
        fw = self.fw
        return [fw.empty_like(t) for t in V.grad_members(fw, self._y[(op.stage, op.microbatch)])]

    def _recv_b(self, op: P.Op) -> None:
        if self._labels:
            header = self._header_buffer()
            self.transport.recv(header, op.peer, op.label)
            self._unlabelled(op, header)
        bufs = self._recv_b_buffers(op)
        for b in bufs:
            self.transport.recv(b, op.peer, op.label)
        self._dy[(op.stage, op.microbatch)] = bufs

    def _batch(self, op: P.Op) -> None:
        if self.transport.model is not comm_model_of("nccl") or len(op.parts) == 1:
            for part in op.parts:  # gloo: one after another, each blocking, as written
                self._handlers[part.code](part)
            return
        # Grouped (NCCL): first step, the headers of new forward activations as one batch...
        # A label leads a forward's header and goes just before a backward's data, in the same
        # batch: the guard adds no wait the batch did not have.
        labels = self._labels
        headers: list[tuple[bool, Any, int]] = []
        pending: list[tuple[P.Op, Any]] = []
        errors: list[str] = []
        for part in op.parts:
            key = (part.stage, part.microbatch)
            if part.code == P.SEND_F and (part.code, key) not in self._sent:
                header, error = self._header(part)
                headers.append((True, self._labelled(part, header), part.peer))
                if error is not None:
                    errors.append(error)
            elif part.code == P.RECV_F and key not in self._recv_meta:
                h = self._header_buffer()
                headers.append((False, h, part.peer))
                pending.append((part, h))
        if headers:
            self.transport.batch(headers, op.label)
            if errors:
                raise SetupError(errors[0])
            for part, h in pending:
                self._incoming(part, self._unlabelled(part, h))
        # ...then the data as one batch.
        ops: list[tuple[bool, Any, int]] = []
        received: list[tuple[P.Op, list[Any]]] = []
        checks: list[tuple[P.Op, Any]] = []
        for part in op.parts:
            if part.code in (P.SEND_F, P.SEND_B):
                tensors = self._outgoing(part)
                self._first_send(part, tensors)
                if labels and part.code == P.SEND_B:
                    ops.append((True, self._labelled(part), part.peer))
                ops += [(True, t, part.peer) for t in tensors]
            elif part.code in (P.RECV_F, P.RECV_B):
                if labels and part.code == P.RECV_B:
                    checks.append((part, self._header_buffer()))
                    ops.append((False, checks[-1][1], part.peer))
                bufs = self._recv_meta[(part.stage, part.microbatch)].buffers(self.fw) \
                    if part.code == P.RECV_F else self._recv_b_buffers(part)
                ops += [(False, b, part.peer) for b in bufs]
                received.append((part, bufs))
        if ops:
            self.transport.batch(ops, op.label)
        for part, header in checks:  # before any received gradient is used
            self._unlabelled(part, header)
        for part, bufs in received:
            key = (part.stage, part.microbatch)
            if part.code == P.RECV_F:
                self._recv_x[key] = self._recv_meta[key].join(self.fw, bufs)
            else:
                self._dy[key] = bufs


def _has_split_backward(plan: P.Plan) -> bool:
    return any(o.code in (P.I, P.W) for op in plan.ops for o in (op.parts or (op,)))


def _framework(framework: str | Framework | None, stages: Mapping[int, Any] | Sequence[Any]) -> Framework:
    """The adapter asked for, else the one the stage layers belong to (Paddle when none)."""
    if isinstance(framework, Framework):
        return framework
    if framework is not None:
        return get_framework(framework)
    layers = list(stages.values()) if isinstance(stages, Mapping) else list(stages)
    return framework_of(layers[0]) if layers else get_framework()


def _stage_map(fw: Framework, stages: Mapping[int, Any] | Sequence[Any], plan: P.Plan) -> dict[int, Any]:
    if isinstance(stages, Mapping):
        layers = dict(stages)
    else:
        seq = list(stages)
        if len(seq) != len(plan.local_stages):
            raise SetupError(f"rank {plan.rank} holds stages {list(plan.local_stages)} of the program, "
                             f"but {len(seq)} stage layers were given")
        layers = dict(zip(plan.local_stages, seq))
    if sorted(layers) != list(plan.local_stages):
        raise SetupError(f"rank {plan.rank} holds stages {list(plan.local_stages)} of the program, "
                         f"but layers were given for stages {sorted(layers)}")
    for s, layer in layers.items():
        if not fw.is_layer(layer):
            raise SetupError(f"stage {s}: expected a {fw.layer_type}, got {type(layer).__name__}")
    return layers


def _check_loss(fw: Framework, loss: Any) -> None:
    if not fw.is_tensor(loss):
        raise SetupError(f"the loss function returned {type(loss).__name__}, not a {fw.tensor_type}")
    if fw.numel(loss) != 1:
        raise SetupError(f"the loss function returned a tensor of shape {list(loss.shape)}; "
                         "it must return a scalar (reduce it, e.g. with .mean())")
