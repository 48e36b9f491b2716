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
- `SEND_*`/`RECV_*`: P2P on the pair's own groups; a batch `<...>` is one group call on NCCL
  and its members in written order on gloo. On gloo sends go out in the background by default
  (a thread per peer, in the file's order; `background_sends=False` makes each block until its
  receive), and the step ends once every send has been received. What each message carries
  (shape headers on the first step, the label guard) is `wire.py`.
- `UNSHARD`/`RESHARD`/`REDUCE_GRAD`: no-ops (no sharding here), logged at debug level.

With a `layout` of N replicas (`process_layout.py`), each stage's gradients are averaged over
its replicas: started once its last backward action of the step has run, waited for at the
end of the step (`reduction.py`).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from ..wording import plural
from ..gcpause import no_gc
from ..ir import Kind, Program
from ..semantics import CommModel
from .plan import (B, BACKWARD, BATCH, F, I, NOOP, OVERLAP, RECV_B, RECV_F, SEND_B, SEND_F, W, Op, Plan,
                   compile_rank, last_backward)
from . import values
from .background import JobFailed
from .comm import PeerError, Transport, comm_model_of, gather_objects
from .errors import MessageOrderError, SetupError, StepError
from .framework import Framework, GradRefused, framework_of, get_framework
from .memory import LiveMemory
from .preflight import lint, prepare
from .process_layout import Layout
from .reduction import GradientReducer
from .grad_guard import GradGuard
from .split_backward import DeferredGrads, SplitLinears
from .watchdog import Reporter, Watchdog
from .wire import Exchange, Wire

__all__ = ["MessageOrderError", "PipelineSchedule", "SetupError", "StepError"]

log = logging.getLogger("ppdsl.runtime")

Key = tuple[int, int]


class PipelineSchedule:
    """One rank's interpreter for a program.

    `stages` maps each stage index this rank holds to its layer (or lists them in stage
    order). `loss_fn(output, target)` must return a scalar. With `scale_grads` (default) each
    microbatch's loss is divided by the number of microbatches before its backward, so the
    gradients are those of the mean loss; Paddle's own schedules leave them summed.
    With `split_backward` (default) and a program that has `I`/`W` actions, every eligible
    Linear (`paddle.nn.Linear`, `torch.nn.Linear`) of the stage layers computes through the split
    matmul while a step runs (same parameters and numerics; the modules are left as they were
    between steps); `split_warnings` names any Linear that is not, and why, and `split_paths`
    says per stage which path its weight gradients take. With `grad_guard` (default) a
    parameter the stage's forward used that ends a step with no gradient, or a `W` that computed
    nothing for a forward that deferred to it, is a `StepError` (`grad_guard.py`).
    `profile=True` fills `timings` (per action label) and `memory` (live microbatches and bytes).

    `check=False` skips the checker (and so its refusal of a program that would hang): the
    program runs as written, and the label guard still stops a send/receive order that does
    not match. The private `_guard=False` turns the guard off as well; it exists for the
    soundness tests, which must see what the bare transport does with such an order.
    `background_sends=False` makes every send on gloo wait for its receive (the `rendezvous`
    model, as gloo's own calls do); the default posts them to a thread per peer (`buffered`).
    `layout` (`process_layout.Layout`) places this process in a job of several replicas of the
    pipeline: the plan is compiled for its pipeline rank, and each stage's gradients are
    averaged over the replicas before `step()` returns. Default: one replica, global rank =
    pipeline rank (`rank`).
    `_transport` reuses the pair groups of an earlier schedule over the same pairs whose last
    step completed on every rank (creating a gloo group costs ~0.3 s); the soundness tests run
    many programs so.
    """

    def __init__(self, program: Program, stages: Mapping[int, Any] | Sequence[Any],
                 loss_fn: Callable[[Any, Any], Any] | None, *, rank: int | None = None,
                 timeout: float = 60.0, scale_grads: bool = True, watchdog: Watchdog | None = None,
                 backend: str | None = None, profile: bool = False, split_backward: bool = True,
                 check: bool = True, pause_gc: bool = True, framework: str | Framework | None = None,
                 background_sends: bool = True, layout: Layout | None = None, grad_guard: bool = True,
                 _guard: bool = True,
                 _transport: Transport | None = None):
        fw = self.fw = _framework(framework, stages)
        self.layout = _layout(fw, program, rank, layout)
        self.rank = self.layout.pipeline_rank  # what the plan is compiled for
        self.global_rank = self.layout.rank  # what the job's messages name
        # One process needs no process group; without one there is no backend to ask.
        self.backend = (backend or (fw.backend() if fw.is_initialized() else "gloo")).lower()
        self.comm_model = comm_model_of(self.backend, background_sends)
        # Lint (and lower) under the backend's own model before anything is sent.
        self.program = prepare(program, self.comm_model, check=check)
        self.plan = compile_rank(self.program, self.rank)
        self.layers = _stage_map(fw, stages, self.plan)
        if self.plan.training and loss_fn is None:
            raise SetupError("a training program needs a loss function")
        self.loss_fn = loss_fn
        self.scale = 1.0 / self.plan.microbatches if scale_grads else 1.0
        self.watchdog = watchdog or Watchdog(timeout, Reporter(self.global_rank))
        self.step_index = 0
        self.profile = profile
        # A GPU runs kernels after the call that queues them returns: a timed action waits for
        # them, so that its time is its own (only when profiling: a sync stalls the pipeline).
        self._sync = fw.synchronize if profile and _on_gpu(fw, self.layers) else None
        self.pause_gc = pause_gc
        # Called with (step, op index) before each op: the launcher's crash report reads it.
        self.mark: Callable[[int, int], None] | None = None
        self.timings: dict[str, list[float]] = {}
        self.started: dict[str, list[float]] = {}  # perf_counter at each start (same clock on one machine)
        self.memory = LiveMemory()
        if profile:
            self.memory.parameters = {fw.data_ptr(p) for layer in self.layers.values() for _, p in fw.named_parameters(layer)}
        self.deferred: DeferredGrads | None = None
        self.split: SplitLinears | None = None
        self.split_warnings: list[str] = []
        if split_backward and self.plan.training and _has_split_backward(self.plan):
            self._switch_layers()
        #: Per local stage, which path its weight gradients take (`--verbose`, the profile).
        self.split_paths: dict[int, str] = self.split.report() if self.split is not None else {
            s: "whole: no I/W in this program, or split_backward=False" for s in self.layers}
        self.grad_guard = GradGuard(fw, self.layers, _last_backward_labels(self.plan), self.global_rank) \
            if grad_guard and self.plan.training else None
        self.guard = _guard
        self._agree_on_program()
        if _transport is not None and _transport.pairs == self.plan.pairs and _transport.backend == self.backend \
                and _transport.model is self.comm_model and _transport.layout == self.layout:
            self.transport = _transport
            self.transport.watchdog = self.watchdog
        else:
            self.transport = Transport(fw, self.rank, self.plan.pairs, self.watchdog, self.backend, background_sends,
                                       self.layout)
        self.wire = Wire(fw, self.transport, self.plan, self.global_rank, _guard)
        if self.transport.model is CommModel.GROUPED:
            self.wire.first_in_order = not lint(self.program, CommModel.RENDEZVOUS)
        self.reducer: GradientReducer | None = None
        reduce_after: dict[int, tuple[int, ...]] = {}
        if self.layout.replicas > 1:
            reduce_after = last_backward(self.plan)
            self.reducer = GradientReducer(fw, self.layers, self.transport.data_parallel_group, self.layout.replicas,
                                           self.watchdog, self.layout.data_parallel_ranks(self.rank))
        self._loss_checked = False
        split = self.deferred is not None
        self._handlers: dict[int, Callable[[Op], None]] = {
            # Split: F and I run under their (stage, microbatch) key: what I defers goes to that
            # key's W, and the key's W knows its forward ran layers with deferred gradients.
            F: self._keyed(self._forward) if split else self._forward, B: self._backward,
            I: self._keyed(self._backward) if split else self._backward_input,
            W: self._deferred_weight_grad if split else self._backward_weight,
            SEND_F: self._message, RECV_F: self._message, SEND_B: self._message, RECV_B: self._message,
            NOOP: self._noop, OVERLAP: self._overlap, BATCH: self._batch,
        }
        self._compiled = [(self._reducing(self._handlers[op.code], reduce_after[i]) if i in reduce_after
                           else self._handlers[op.code], op) for i, op in enumerate(self.plan.ops)]
        self._reset()

    # --- set-up -----------------------------------------------------------------------------
    def _switch_layers(self) -> None:
        self.deferred = DeferredGrads(self.fw)
        self.split = SplitLinears(self.layers, self.deferred)
        for message in self.split.warnings():
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
        self._whole: set[Key] = set()  # an I that ran the whole backward (the graph refused less)
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
                self._inputs = values.split_batch(fw, inputs, M, "inputs")
            if plan.last_stage and plan.training:
                if target is None:
                    raise SetupError("the last stage needs the batch's targets: step(inputs, target=...)")
                self._targets = values.split_batch(fw, target, M, "target")
            self._kwargs = values.split_batch(fw, dict(kwargs or {}), M, "keyword arguments", need_tensor=False)
        except values.StageValueError as exc:
            raise SetupError(str(exc)) from None
        wd = self.watchdog
        wd.step = self.wire.step = self.step_index
        op: Op | None = None
        # Python's cyclic collector would otherwise run inside the step, on whichever rank's
        # allocations cross its threshold: measured in one process, about 2% of a step, in
        # pauses of up to tens of ms (a full pass over Paddle's ~130k objects), which delay
        # every rank waiting on that one. Paused, its work moves to the end of the step.
        try:
            with no_gc(promote=False) if self.pause_gc else nullcontext(), \
                    self.split.active() if self.split is not None else nullcontext():
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
                    sync = self._sync
                    if sync is not None:
                        sync()
                    t0 = clock()
                    for i, (handler, op) in enumerate(self._compiled):
                        if mark is not None:
                            mark(step, i)
                        counted = memory.seconds if memory is not None else 0.0
                        handler(op)
                        if timings is not None:
                            if sync is not None:
                                sync()
                            t1 = clock()
                            inner = memory.seconds - counted if memory is not None else 0.0
                            timings.setdefault(op.label, []).append(t1 - t0 - inner)
                            started.setdefault(op.label, []).append(t0)
                            t0 = t1
                        if memory is not None:
                            memory.observe(self, op)
                            if timings is not None:
                                t0 = clock()
                else:
                    for handler, op in self._compiled:
                        handler(op)
                self.transport.flush()
            if self.reducer is not None:
                self.reducer.wait()
            if self.grad_guard is not None:
                self.grad_guard.check(self.step_index)
        except StepError:
            raise
        except JobFailed as exc:  # a send or a reduction that ran in the background, named by its action
            cause = exc.cause
            if isinstance(cause, StepError):
                raise cause from None
            raise StepError(self.global_rank, self.step_index, exc.label, str(cause) if isinstance(cause, PeerError)
                            else f"{type(cause).__name__}: {cause}", peer=isinstance(cause, PeerError)) from None
        except (SetupError, values.StageValueError) as exc:
            raise StepError(self.global_rank, self.step_index, op.label if op else "?", str(exc)) from None
        except PeerError as exc:
            raise StepError(self.global_rank, self.step_index, op.label if op else "?", str(exc), peer=True) from None
        except Exception as exc:  # noqa: BLE001 - any failure becomes a located one
            label = op.label if op else "?"
            raise StepError(self.global_rank, self.step_index, label, f"{type(exc).__name__}: {exc}") from exc
        finally:
            wd.disarm()
        self.wire.first_step_done()
        if losses is not None and plan.last_stage and plan.training:
            losses.extend(self._losses[m] for m in sorted(self._losses))
        self.step_index += 1
        if return_output and plan.last_stage and self._outputs:
            return values.merge_batch(fw, [self._outputs[m] for m in sorted(self._outputs)])
        return None

    def close(self) -> None:
        """End the schedule's background threads (the sending threads, the gradient reduction
        of a data-parallel layout) once the last step is done; a script that exits normally
        should call it."""
        if self.reducer is not None:
            self.reducer.close()
        self.transport.close()

    def last_losses(self) -> list[float]:
        """This step's microbatch losses as floats (last-stage rank only; else empty)."""
        return [float(self._losses[m]) for m in sorted(self._losses)]

    def _reducing(self, handler: Callable[[Op], None], stages: tuple[int, ...]) -> Callable[[Op], None]:
        """`handler`, then the reduction of the stages whose last backward of the step it ran."""
        reducer = self.reducer
        assert reducer is not None

        def run(op: Op) -> None:
            handler(op)
            for s in stages:
                reducer.post(s)

        return run

    # --- compute ----------------------------------------------------------------------------
    def _forward(self, op: Op) -> None:
        s, m = op.stage, op.microbatch
        plan = self.plan
        if s == 0:
            x = self._inputs[m]
        elif self.program.placement[s - 1] == self.rank:
            x = values.hand_over(self.fw, self._y[(s - 1, m)], plan.training)
        else:
            x = self._recv_x.pop((s, m))
        with self.memory.saving(self, (s, m)) if self.profile else nullcontext():
            y = self._stage_forward(s, m, x)
        if s > 0 and plan.training:
            self._x[(s, m)] = values.grad_members(self.fw, x)
        self._y[(s, m)] = y
        if self.grad_guard is not None and self.step_index == 0:
            self.grad_guard.learn(s, self._differentiated(s, y))

    def _keyed(self, handler: Callable[[Op], None]) -> Callable[[Op], None]:
        """`handler` run with the split matmul's store keyed by the action's (stage, microbatch)."""
        deferred = self.deferred
        assert deferred is not None

        def run(op: Op) -> None:
            deferred.key = (op.stage, op.microbatch)
            try:
                handler(op)
            finally:
                deferred.key = None

        return run

    def _stage_forward(self, s: int, m: int, x: Any) -> Any:
        """The stage's output, or at the last stage when training the (scaled) loss."""
        plan = self.plan
        y = values.call(self.layers[s], x, self._kwargs[m])
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
        return y

    def _grad_of_output(self, s: int, m: int) -> list[Any] | None:
        """The gradients of the output members that need one (None at the last stage: the loss)."""
        if s == self.plan.stages - 1:
            return None
        if self.program.placement[s + 1] == self.rank:
            return self._dx.pop((s + 1, m))
        return self._dy.pop((s, m))

    def _differentiated(self, s: int, y: Any) -> list[Any]:
        """What a stage's backward starts from: the loss, or the output members that need a gradient."""
        return [y] if s == self.plan.stages - 1 else values.grad_members(self.fw, y)

    def _input_grads(self, leaves: list[Any], grads: Sequence[Any]) -> list[Any]:
        # A member the stage did not use has no gradient: its sender still waits for one.
        return [g if g is not None else self.fw.zeros_like(x) for x, g in zip(leaves, grads)]

    def _backward(self, op: Op) -> None:
        s, m = op.stage, op.microbatch
        y = self._y.pop((s, m))
        g = self._grad_of_output(s, m)
        outs = self._differentiated(s, y)
        if outs:
            self.fw.backward(outs, g)
        if s > 0:
            leaves = self._x.pop((s, m))
            self._dx[(s, m)] = self._input_grads(leaves, [self.fw.grad_of(x) for x in leaves])

    def _deferred_weight_grad(self, op: Op) -> None:
        deferred = self.deferred
        assert deferred is not None
        key = (op.stage, op.microbatch)
        expected = deferred.expects(key)
        if not deferred.run(key) and expected and self.grad_guard is not None:
            raise StepError(self.global_rank, self.step_index, op.label,
                            f"{op.label} computed no weight gradient, though the forward of stage {op.stage} on "
                            f"microbatch {op.microbatch} ran layers whose weight gradients are deferred to it: "
                            "their gradients were lost. Run with split_backward=False (--no-split-backward); "
                            "grad_guard=False (--no-grad-guard) turns this check off")

    def _backward_input(self, op: Op) -> None:
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
            try:
                grads = self.fw.grad(outs, leaves + params, g) \
                    if outs and leaves else [None] * len(leaves)
            except GradRefused:  # e.g. a reentrant checkpoint: the whole backward now, W has nothing left
                del self._kept_dy[(s, m)]
                self._whole.add((s, m))
                self._backward(op)
                return
            self._dx[(s, m)] = self._input_grads(leaves, grads[:len(leaves)])

    def _backward_weight(self, op: Op) -> None:
        key = (op.stage, op.microbatch)
        if key in self._whole:
            self._whole.discard(key)
            return
        y = self._y.pop(key)
        g = self._kept_dy.pop(key)
        self._x.pop(key, None)
        outs = self._differentiated(op.stage, y)
        if outs:
            self.fw.backward(outs, g)

    def _overlap(self, op: Op) -> None:
        for part in op.parts:  # forwards first (plan order): a forward never needs a backward
            self._handlers[part.code](part)
            if self.profile:  # the forward allocates before the backward frees: both count
                self.memory.observe(self, part)

    def _noop(self, op: Op) -> None:
        log.debug("rank %d: %s is a no-op: ppdsl does not shard (data parallelism reduces without it)",
                  self.global_rank, op.label)

    # --- communication: the wire protocol is `wire.py`; these say what each action carries -
    def _exchange(self, op: Op) -> Exchange:
        key = (op.stage, op.microbatch)
        if op.code == SEND_F:
            return self.wire.send_f(op, self._y[key])
        if op.code == SEND_B:
            return self.wire.send_b(op, self._dx.pop(key))
        if op.code == RECV_F:
            return self.wire.recv_f(op, lambda value: self._recv_x.__setitem__(key, value))
        return self.wire.recv_b(op, values.grad_members(self.fw, self._y[key]),
                                lambda grads: self._dy.__setitem__(key, grads))

    def _message(self, op: Op) -> None:
        self.wire.run(self._exchange(op))

    def _batch(self, op: Op) -> None:
        self.wire.run_batch([self._exchange(part) for part in op.parts], op.label)


def _last_backward_labels(plan: Plan) -> dict[int, str]:
    """stage -> the label of its last backward action of the step on this rank."""
    labels: dict[int, str] = {}
    for op in plan.ops:
        for part in op.parts or (op,):
            if part.code in BACKWARD:
                labels[part.stage] = part.label
    return labels


def _has_split_backward(plan: Plan) -> bool:
    return any(o.code in (I, W) for op in plan.ops for o in (op.parts or (op,)))


def _on_gpu(fw: Framework, layers: Mapping[int, Any]) -> bool:
    """The stages live on a GPU: the one bound by `ppdsl run`, or one the caller moved them to."""
    if fw.device.is_gpu:
        return True
    return any(fw.is_on_gpu(p) for layer in layers.values() for _, p in fw.named_parameters(layer))


def _layout(fw: Framework, program: Program, rank: int | None, layout: Layout | None) -> Layout:
    """This process's place: the layout given (checked against the program), else one replica."""
    if layout is None:
        return Layout.single(max(program.ranks, 1 + (rank if rank is not None else fw.rank())),
                             fw.rank() if rank is None else rank)
    if layout.pipeline != program.ranks:
        raise SetupError(f"the layout has {plural(layout.pipeline, 'pipeline rank')} but the program "
                         f"{plural(program.ranks, 'rank')}")
    if rank is not None and rank != layout.pipeline_rank:
        raise SetupError(f"rank={rank} but the layout puts global rank {layout.rank} at pipeline rank "
                         f"{layout.pipeline_rank} (give one of them)")
    return layout


def _framework(framework: str | Framework | None, stages: Mapping[int, Any] | Sequence[Any]) -> Framework:
    """The adapter asked for, else the one the stage layers belong to (Paddle when none)."""
    if isinstance(framework, Framework):
        return framework
    if framework is not None:
        return get_framework(framework)
    layers = list(stages.values()) if isinstance(stages, Mapping) else list(stages)
    return framework_of(layers[0]) if layers else get_framework()


def _stage_map(fw: Framework, stages: Mapping[int, Any] | Sequence[Any], plan: Plan) -> dict[int, Any]:
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
