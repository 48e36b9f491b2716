"""`PipelineSchedule`: run one rank's part of a `.pps` program, step by step, with Paddle.

Shaped like Paddle's `PipelineScheduleSingle`: build it from a program, this rank's stage
layers and a loss function, then call `step(inputs, target=..., losses=[...])` once per batch
and step the optimizer yourself. Gradients accumulate over the microbatches of a step.

Each action of the rank's row runs in order:
- `F`: forward of that stage on that microbatch. The first stage reads the microbatch input,
  a later stage the activation received (or handed over locally by the stage before it on
  this rank); the last stage computes the loss.
- `B`: full backward. `I`: the backward with the weight gradients of the stage's Linear layers
  left out and kept, keyed by (stage, microbatch), for `W`, which computes exactly those (see
  `split_backward.py`). With `split_backward=False`: `I` is `paddle.grad` w.r.t. the stage
  input with the graph kept and `W` a second full backward (every matmul twice).
- `SEND_*`/`RECV_*`: blocking P2P on the pair's own 2-rank group; a batch `<...>` is one
  `batch_isend_irecv` on NCCL and its members in written order on gloo.
- `UNSHARD`/`RESHARD`/`REDUCE_GRAD`: no-ops (no data parallelism here), logged at debug level.

Shapes of activations crossing ranks travel in a small header on the first step and are
cached; later steps check that they did not change.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..ir import Program
from . import plan as P
from .comm import PeerError, Transport, comm_model_of
from .memory import LiveMemory
from .preflight import prepare
from .split_backward import DeferredGrads, switch_linears
from .watchdog import Reporter, Watchdog

if TYPE_CHECKING:  # pragma: no cover
    import paddle

log = logging.getLogger("ppdsl.runtime")

Key = tuple[int, int]


class StepError(RuntimeError):
    """An action failed: names the rank, step and action."""

    def __init__(self, rank: int, step: int, action: str, message: str, peer: bool = False):
        self.rank, self.step, self.action, self.detail = rank, step, action, message
        self.peer = peer  # the transport failed: the cause may be another rank
        super().__init__(f"rank {rank}, step {step}, action {action}: {message}")


class SetupError(RuntimeError):
    """The model, data or program cannot run; raised before any schedule communication."""


class PipelineSchedule:
    """One rank's interpreter for a program.

    `stages` maps each stage index this rank holds to its layer (or lists them in stage
    order). `loss_fn(output, target)` must return a scalar. With `scale_grads` (default) each
    microbatch's loss is divided by the number of microbatches before its backward, so the
    gradients are those of the mean loss; Paddle's own schedules leave them summed.
    With `split_backward` (default) and a program that has `I`/`W` actions, every plain
    `paddle.nn.Linear` of the stage layers is switched to the split matmul (same parameters,
    numerics and state dict); `split_warnings` names any Linear that could not be.
    `profile=True` fills `timings` (per action label) and `memory` (live microbatches and bytes).
    """

    def __init__(self, program: Program, stages: Mapping[int, paddle.nn.Layer] | Sequence[paddle.nn.Layer],
                 loss_fn: Callable[[Any, Any], Any] | None, *, rank: int | None = None,
                 timeout: float = 60.0, scale_grads: bool = True, watchdog: Watchdog | None = None,
                 backend: str | None = None, profile: bool = False, split_backward: bool = True):
        import paddle
        import paddle.distributed as dist

        self.paddle = paddle
        self.rank = dist.get_rank() if rank is None else rank
        self.backend = (backend or dist.get_backend()).lower()
        self.comm_model = comm_model_of(self.backend)
        # Lint (and lower) under the backend's own model before anything is sent.
        self.program = prepare(program, self.comm_model)
        self.plan = P.compile_rank(self.program, self.rank)
        self.layers = _stage_map(stages, self.plan)
        if self.plan.training and loss_fn is None:
            raise SetupError("a training program needs a loss function")
        self.loss_fn = loss_fn
        self.scale = 1.0 / self.plan.microbatches if scale_grads else 1.0
        self.watchdog = watchdog or Watchdog(timeout, Reporter(self.rank))
        self.step_index = 0
        self.profile = profile
        # Called with (step, op index) before each op: the launcher's crash report reads it.
        self.mark: Callable[[int, int], None] | None = None
        self.timings: dict[str, list[float]] = {}
        self.started: dict[str, list[float]] = {}  # perf_counter at each start (same clock on one machine)
        self.memory = LiveMemory()
        self.deferred: DeferredGrads | None = None
        self.split_warnings: list[str] = []
        if split_backward and self.plan.training and _has_split_backward(self.plan):
            self._switch_layers()
        self._agree_on_program(dist)
        self.transport = Transport(self.rank, self.plan.pairs, self.watchdog, self.backend)
        self._sent_shapes: dict[tuple[int, Key], list[int]] = {}
        self._recv_shapes: dict[Key, tuple[list[int], str]] = {}
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
        self.deferred = DeferredGrads()
        for s, layer in sorted(self.layers.items()):
            _, kept = switch_linears(layer, self.deferred)
            for name in kept:
                message = (f"stage {s}: layer {name} overrides Linear.forward, so its weight gradient "
                           "cannot be deferred to W; it is computed with the input gradient in I")
                self.split_warnings.append(message)
                warnings.warn(message, stacklevel=3)

    def _agree_on_program(self, dist: Any) -> None:
        """All ranks compare the digest of the program they hold, and fail together."""
        paddle = self.paddle
        mine = [int(self.plan.digest[i:i + 15], 16) for i in range(0, 60, 15)]
        gathered: list[Any] = []
        self.watchdog.arm("checking that all ranks run the same program", "all ranks")
        dist.all_gather(gathered, paddle.to_tensor(mine, dtype="int64"))
        self.watchdog.disarm()
        digests = [tuple(int(v) for v in t.numpy().tolist()) for t in gathered]
        if len(set(digests)) != 1:
            groups: dict[tuple[int, ...], list[int]] = {}
            for r, d in enumerate(digests):
                groups.setdefault(d, []).append(r)
            desc = "; ".join(f"ranks {', '.join(map(str, rs))} hold program {_hex(d)}" for d, rs in groups.items())
            raise SetupError(f"the ranks do not hold the same program (text, placement or shape): {desc}")

    def _reset(self) -> None:
        self._x: dict[Key, Any] = {}      # stage input (a leaf when it needs a gradient)
        self._y: dict[Key, Any] = {}      # stage output; the scaled loss at the last stage
        self._dx: dict[Key, Any] = {}     # gradient w.r.t. a stage's input, to hand down
        self._dy: dict[Key, Any] = {}     # gradient w.r.t. a stage's output, received
        self._kept_dy: dict[Key, Any] = {}  # between I and W
        self._recv_x: dict[Key, Any] = {}
        self._losses: dict[int, Any] = {}
        self._inputs: list[Any] = []
        self._targets: list[Any] = []
        if self.deferred is not None:
            self.deferred.clear()

    # --- the step ---------------------------------------------------------------------------
    def step(self, *args: Any, target: Any = None, losses: list[Any] | None = None) -> None:
        """Run the schedule once over a whole batch (split into the program's microbatches)."""
        plan = self.plan
        self._reset()
        if plan.first_stage:
            if not args:
                raise SetupError("the first stage needs the batch's inputs: step(inputs, target=...)")
            self._inputs = _split(self.paddle, args[0], plan.microbatches, "inputs")
        if plan.last_stage and plan.training:
            if target is None:
                raise SetupError("the last stage needs the batch's targets: step(inputs, target=...)")
            self._targets = _split(self.paddle, target, plan.microbatches, "target")
        wd = self.watchdog
        wd.step = self.step_index
        op: P.Op | None = None
        try:
            if self.profile or self.mark is not None:
                timings = self.timings if self.profile else None
                started = self.started
                mark = self.mark
                clock = time.perf_counter
                step = self.step_index
                memory = self.memory if self.profile else None
                # An action's time runs from the end of the one before: the interpreter's own
                # work between two actions belongs to the rank's timeline too.
                t0 = clock()
                for i, (handler, op) in enumerate(self._compiled):
                    if mark is not None:
                        mark(step, i)
                    handler(op)
                    if timings is not None:
                        t1 = clock()
                        timings.setdefault(op.label, []).append(t1 - t0)
                        started.setdefault(op.label, []).append(t0)
                        t0 = t1
                    if memory is not None:
                        memory.observe(self)
            else:
                for handler, op in self._compiled:
                    handler(op)
        except StepError:
            raise
        except SetupError as exc:
            raise StepError(self.rank, self.step_index, op.label if op else "?", str(exc)) from None
        except PeerError as exc:
            raise StepError(self.rank, self.step_index, op.label if op else "?", str(exc), peer=True) from None
        except Exception as exc:  # noqa: BLE001 - any failure becomes a located one
            label = op.label if op else "?"
            raise StepError(self.rank, self.step_index, label, f"{type(exc).__name__}: {exc}") from exc
        finally:
            wd.disarm()
        if losses is not None and plan.last_stage:
            losses.extend(self._losses[m] for m in sorted(self._losses))
        self.step_index += 1

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
            x = self._y[(s - 1, m)].detach()  # hand-off: a new leaf so each stage's backward stops here
            x.stop_gradient = not plan.training
        else:
            x = self._recv_x.pop((s, m))
        y = self.layers[s](x)
        if s == plan.stages - 1 and plan.training:
            assert self.loss_fn is not None
            loss = self.loss_fn(y, self._targets[m])
            if not self._loss_checked:
                _check_loss(loss)
                self._loss_checked = True
            self._losses[m] = loss.detach()
            y = loss * self.scale if self.scale != 1.0 else loss
        if s > 0:
            self._x[(s, m)] = x
        self._y[(s, m)] = y

    def _grad_of_output(self, s: int, m: int) -> Any:
        if s == self.plan.stages - 1:
            return None
        if self.program.placement[s + 1] == self.rank:
            return self._dx.pop((s + 1, m))
        return self._dy.pop((s, m))

    def _backward(self, op: P.Op) -> None:
        s, m = op.stage, op.microbatch
        y = self._y.pop((s, m))
        g = self._grad_of_output(s, m)
        self.paddle.autograd.backward([y], None if g is None else [g])
        if s > 0:
            self._dx[(s, m)] = self._x.pop((s, m)).grad

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
            y = self._y[(s, m)]
            (dx,) = self.paddle.grad([y], [self._x[(s, m)]], grad_outputs=None if g is None else [g],
                                     retain_graph=True)
            self._dx[(s, m)] = dx

    def _backward_weight(self, op: P.Op) -> None:
        key = (op.stage, op.microbatch)
        y = self._y.pop(key)
        g = self._kept_dy.pop(key)
        self._x.pop(key, None)
        self.paddle.autograd.backward([y], None if g is None else [g])

    def _overlap(self, op: P.Op) -> None:
        for part in op.parts:  # forwards first (plan order): a forward never needs a backward
            self._handlers[part.code](part)
            if self.profile:  # the forward allocates before the backward frees: both count
                self.memory.observe(self)

    def _noop(self, op: P.Op) -> None:
        log.debug("rank %d: %s is a no-op without data parallelism", self.rank, op.label)

    # --- communication ----------------------------------------------------------------------
    def _outgoing(self, op: P.Op) -> Any:
        key = (op.stage, op.microbatch)
        if op.code == P.SEND_F:
            return self._y[key].detach()
        return self._dx.pop(key)

    def _check_sent_shape(self, op: P.Op, t: Any) -> bool:
        """True on the first send of this activation (a header must go first)."""
        k = (op.code, (op.stage, op.microbatch))
        shape = list(t.shape)
        known = self._sent_shapes.get(k)
        if known is None:
            self._sent_shapes[k] = shape
            return True
        if known != shape:
            raise SetupError(f"{op.label}: the tensor now has shape {shape}, but it had {known} when "
                             "the ranks agreed shapes on the first step")
        return False

    def _send_f(self, op: P.Op) -> None:
        t = self._outgoing(op)
        if self._check_sent_shape(op, t):
            self.transport.send(Transport.header_of(t), op.peer, op.label)
        self.transport.send(t, op.peer, op.label)

    def _send_b(self, op: P.Op) -> None:
        t = self._outgoing(op)
        self._check_sent_shape(op, t)
        self.transport.send(t, op.peer, op.label)

    def _recv_f_buffer(self, op: P.Op) -> Any:
        shape, dtype = self._recv_shapes[(op.stage, op.microbatch)]
        # dtype is a name from DTYPES, which paddle's annotations do not list; no `type: ignore`,
        # which would be unused (an error under --strict) where paddle is not installed.
        empty: Any = self.paddle.empty
        return empty(shape, dtype=dtype)

    def _recv_f(self, op: P.Op) -> None:
        key = (op.stage, op.microbatch)
        if key not in self._recv_shapes:
            header = Transport.empty_header()
            self.transport.recv(header, op.peer, op.label)
            self._recv_shapes[key] = Transport.from_header(header)
        buf = self._recv_f_buffer(op)
        self.transport.recv(buf, op.peer, op.label)
        buf.stop_gradient = not self.plan.training
        self._recv_x[key] = buf

    def _recv_b_buffer(self, op: P.Op) -> Any:
        # The gradient of an output has the output's shape: no header needed.
        y = self._y[(op.stage, op.microbatch)]
        return self.paddle.empty(y.shape, dtype=y.dtype)

    def _recv_b(self, op: P.Op) -> None:
        buf = self._recv_b_buffer(op)
        self.transport.recv(buf, op.peer, op.label)
        self._dy[(op.stage, op.microbatch)] = buf

    def _batch(self, op: P.Op) -> None:
        if self.transport.model is not comm_model_of("nccl") or len(op.parts) == 1:
            for part in op.parts:  # gloo: one after another, each blocking, as written
                self._handlers[part.code](part)
            return
        # Grouped (NCCL): first step, the headers of new forward activations as one batch...
        headers: list[tuple[bool, Any, int]] = []
        pending: list[tuple[P.Op, Any]] = []
        outgoing: dict[int, Any] = {}
        for i, part in enumerate(op.parts):
            if part.code in (P.SEND_F, P.SEND_B):
                t = outgoing[i] = self._outgoing(part)
                if self._check_sent_shape(part, t) and part.code == P.SEND_F:
                    headers.append((True, Transport.header_of(t), part.peer))
            elif part.code == P.RECV_F and (part.stage, part.microbatch) not in self._recv_shapes:
                h = Transport.empty_header()
                headers.append((False, h, part.peer))
                pending.append((part, h))
        if headers:
            self.transport.batch(headers, op.label)
            for part, h in pending:
                self._recv_shapes[(part.stage, part.microbatch)] = Transport.from_header(h)
        # ...then the data as one batch.
        ops: list[tuple[bool, Any, int]] = []
        received: list[tuple[P.Op, Any]] = []
        for i, part in enumerate(op.parts):
            if i in outgoing:
                ops.append((True, outgoing[i], part.peer))
            elif part.code in (P.RECV_F, P.RECV_B):
                buf = self._recv_f_buffer(part) if part.code == P.RECV_F else self._recv_b_buffer(part)
                ops.append((False, buf, part.peer))
                received.append((part, buf))
        self.transport.batch(ops, op.label)
        for part, buf in received:
            key = (part.stage, part.microbatch)
            if part.code == P.RECV_F:
                buf.stop_gradient = not self.plan.training
                self._recv_x[key] = buf
            else:
                self._dy[key] = buf


def _has_split_backward(plan: P.Plan) -> bool:
    return any(o.code in (P.I, P.W) for op in plan.ops for o in (op.parts or (op,)))


def _stage_map(stages: Mapping[int, Any] | Sequence[Any], plan: P.Plan) -> dict[int, Any]:
    import paddle

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
        if not isinstance(layer, paddle.nn.Layer):
            raise SetupError(f"stage {s}: expected a paddle.nn.Layer, got {type(layer).__name__}")
    return layers


def _split(paddle: Any, tensor: Any, microbatches: int, what: str) -> list[Any]:
    if not isinstance(tensor, paddle.Tensor):
        raise SetupError(f"{what}: expected a paddle.Tensor, got {type(tensor).__name__}")
    n = tensor.shape[0] if tensor.shape else 0
    if n % microbatches:
        raise SetupError(f"{what}: a batch of {n} cannot be split into {microbatches} equal microbatches")
    return list(paddle.split(tensor, microbatches, axis=0)) if microbatches > 1 else [tensor]


def _check_loss(loss: Any) -> None:
    import paddle

    if not isinstance(loss, paddle.Tensor):
        raise SetupError(f"the loss function returned {type(loss).__name__}, not a paddle.Tensor")
    if loss.size != 1:
        raise SetupError(f"the loss function returned a tensor of shape {list(loss.shape)}; "
                         "it must return a scalar (reduce it, e.g. with .mean())")


def _hex(digest: tuple[int, ...]) -> str:
    return "".join(f"{v:015x}" for v in digest)[:12]
