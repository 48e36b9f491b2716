"""`PipelineSchedule`: run one rank's part of a `.pps` program, step by step, with Paddle or PyTorch.

Shaped like Paddle's `PipelineScheduleSingle`: build it from a program, this rank's stage
layers and a loss function, then call `step(inputs, target=..., losses=[...])` once per batch
and step the optimizer yourself. Gradients accumulate over the microbatches of a step.

The schedule only orders. Set-up (lint and lower under the transport's model, the pair groups,
the ranks' agreement on the program) happens once; then each step runs the rank's ops in
order, each through its kind's handler (`handlers.py`, where users can register their own),
which routes values and calls the compute of the `Stage` it names (`stage.py`, which owns
that stage's buffers). The interpreter is written once; what differs between frameworks goes
through the adapter (`framework.py`) chosen from the stage layers' type. What each message
carries (the first step's notes: shapes and the label guard) is `wire.py`.

With a `layout` of N replicas (`process_layout.py`), each stage's gradients are averaged over
its replicas: started at the stage's `REDUCE_GRAD` where the file places one, else once its
last backward action of the step has run, and waited for at the end of the step
(`reduction.py`).
"""

from __future__ import annotations

import secrets
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any

from ...gcpause import no_gc
from ...ir import Kind, Program
from .plan import Op, compile_rank, has_split_backward, last_backward_labels, reduction_points
from . import clipping, setup, tied, values
from .tied import TiedParameters
from ..transport.background import JobFailed
from . import handlers as handlers_
from ..transport.comm import Carrier, Transport, comm_model_of, gather_objects
from ..errors import MessageOrderError, PeerError, SetupError, StepError
from ..framework import Framework
from .live_memory import LiveMemory
from .preflight import prepare
from ..jobs.process_layout import Layout
from .reduction import GradientReducer
from .grad_guard import GradGuard
from .stage import Stage
from .split_backward import DeferredGrads, GraphSplit, SplitLinears
from ..jobs.watchdog import Reporter, Watchdog
from ..transport.wire import Wire

__all__ = ["MessageOrderError", "PipelineSchedule", "SetupError", "StepError"]

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
    `handlers` maps action kinds (`"F"`, `Kind.REDUCE_GRAD`) to this schedule's own handlers,
    which wrap those registered with `register_handler` (`handlers.py`).
    `transport` replaces the process groups: `loopback.Loopback(...).links(rank)` runs the ranks
    as threads of one process.
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
                 handlers: Mapping[Kind | str, handlers_.UserHandler] | None = None,
                 transport: Carrier | None = None, _guard: bool = True, _transport: Transport | None = None,
                 _shared: bool = False):
        fw = self.fw = setup.framework(framework, stages)
        self.layout = setup.layout(fw, program, rank, layout if layout is not None or transport is None else transport.layout)
        self.rank = self.layout.pipeline_rank  # what the plan is compiled for
        self.global_rank = self.layout.rank  # what the job's messages name
        # One process needs no process group; without one there is no backend to ask.
        self.backend = (backend or (fw.backend() if fw.is_initialized() else "gloo")).lower()
        self.comm_model = transport.model if transport is not None else comm_model_of(self.backend, background_sends)
        # Lint (and lower) under the backend's own model before anything is sent.
        self._source = program  # as given: `eval` takes its forwards
        self._evaluator: PipelineSchedule | None = None
        self._shared = _shared  # another schedule's transport (`eval`'s): closed by that one
        self.program = prepare(program, self.comm_model, check=check)
        self.plan = compile_rank(self.program, self.rank)
        self.layers = setup.stage_map(fw, stages, self.plan)
        if self.plan.training and loss_fn is None:
            raise SetupError("a training program needs a loss function")
        self.loss_fn = loss_fn
        self.scale = 1.0 / self.plan.microbatches if scale_grads else 1.0
        self._own_watchdog = watchdog is None
        self.watchdog = watchdog or Watchdog(timeout, Reporter(self.global_rank))
        self.step_index = 0
        self.profile = profile
        # A GPU runs kernels after the call that queues them returns: a timed action waits for
        # them, so that its time is its own (only when profiling: a sync stalls the pipeline).
        self._sync = fw.synchronize if profile and setup.on_gpu(fw, self.layers) else None
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
        if split_backward and self.plan.training and has_split_backward(self.plan):
            self._switch_layers()
        graphs: dict[int, GraphSplit] = self.split.graphs if self.split is not None else {}
        #: The stages this rank holds, by index: each owns its buffers and compute (`stage.py`).
        self.stages: dict[int, Stage] = {
            s: Stage(s, layer, fw, first=s == 0, last=s == self.plan.stages - 1, training=self.plan.training,
                     deferred=self.deferred, graph=graphs.get(s)) for s, layer in self.layers.items()}
        if self.plan.last_stage:
            self.stages[self.plan.stages - 1].head = self.head
        if profile:
            self.memory.shardings = {s: st.sharding for s, st in self.stages.items() if st.sharding is not None}
        unsharded = sorted(s for s, stage in self.stages.items() if stage.sharding is None)
        if unsharded != sorted(self.stages) and not self.layout.sharded and self.layout.replicas > 1:
            raise SetupError(f"stage {min(set(self.stages) - set(unsharded))} is sharded (fully_shard) but the layout "
                             f"has {self.layout.replicas} replicas and no shards: give Layout(..., shards=N) for the "
                             "replicas each stage is sharded over")
        if self.layout.sharded and unsharded:
            raise SetupError(f"the layout shards every stage over {self.layout.shards} ranks, but stage {unsharded[0]} "
                             "holds its weights whole: wrap each stage layer with fully_shard over its mesh "
                             "(Layout.shard_mesh) before building the schedule")
        for op in self.plan.ops:
            for part in op.parts or (op,):
                if part.kind == Kind.R:
                    self.stages[part.stage].recomputed.add(part.microbatch)
                elif part.kind == Kind.OFFLOAD:
                    self.stages[part.stage].offloaded.add(part.microbatch)
        self.grad_guard = GradGuard(fw, self.layers, last_backward_labels(self.plan), self.global_rank) \
            if grad_guard and self.plan.training else None
        self.guard = _guard
        #: op code -> handler (`handlers.py`): the built-in ones, wrapped by those registered.
        self.handlers = handlers_.table(self.deferred, handlers)
        if transport is None and _transport is not None and _transport.pairs == self.plan.pairs \
                and _transport.backend == self.backend and _transport.model is self.comm_model \
                and _transport.layout == self.layout:
            transport = _transport
        if transport is not None:
            transport.watchdog = self.watchdog
        # Before any group is made: ranks holding different programs would make different groups.
        copies, refused = self._tied_copies()
        self._agree_on_program(transport.gather if transport is not None else partial(gather_objects, fw),
                               handlers_.unrunnable(self.plan, self.handlers, fw.name) or self._unrecomputable()
                               or refused, copies)
        self.transport: Carrier = transport if transport is not None else Transport(
            fw, self.rank, self.plan.pairs, self.watchdog, self.backend, background_sends, self.layout)
        self.wire = Wire(fw, self.transport, self.plan, self.global_rank, _guard, f"ppdsl/notes/{self._token}/",
                         lambda s: fw.mesh_of(self.layers[s]))
        reductions: dict[int, tuple[int, ...]] = {}
        # A sharded stage's gradients are reduced by its sharding, over its own mesh (which
        # holds the replicas of a sharded pipeline too): the replicas' average is for the rest.
        plain = {s: layer for s, layer in self.layers.items() if self.stages[s].sharding is None}
        if self.plan.training and (self.layout.replicas > 1 or len(plain) < len(self.layers) or self._ties):
            reductions = reduction_points(self.plan)
        #: Parameters of different stages that are one (`tied.py`): summed at the stages' `REDUCE_GRAD`.
        self.tied: TiedParameters | None = None
        if self._ties:
            self.tied = TiedParameters(fw, self.layers, self._ties, self._holders, self.global_rank,
                                       self.layout.replica_of(self.global_rank), self.layout.replicas,
                                       self.transport.group, self.transport.all_reduce_over, self.watchdog.lane(),
                                       early=not fw.device.is_gpu)
        self.reducer: GradientReducer | None = None
        if self.layout.replicas > 1 and plain:
            self.reducer = GradientReducer(fw, plain, self.transport.all_reduce, self.layout.replicas,
                                           self.watchdog, self.layout.data_parallel_ranks(self.rank),
                                           skip=self.tied.local.ids() if self.tied is not None else set())
        self._freed = {op.stage for op in self.plan.ops if op.kind == Kind.RESHARD}
        self._loss_checked = False
        self._compiled = handlers_.compile_ops(self.plan, self.handlers, reductions)
        self._reset()

    @property
    def split_paths(self) -> dict[int, str]:
        """Per local stage, which path its weight gradients take (`--verbose`, the profile); a
        split the graph refused during a step shows from then on."""
        if self.split is None:
            return {s: "whole: no I/W in this program, or split_backward=False" for s in self.layers}
        return self.split.report()

    # --- set-up -----------------------------------------------------------------------------
    def _switch_layers(self) -> None:
        self.deferred = DeferredGrads(self.fw)
        self.split = SplitLinears(self.layers, self.deferred)
        for message in self.split.warnings():
            self.split_warnings.append(message)
            warnings.warn(message, stacklevel=3)

    def _unrecomputable(self) -> str | None:
        """Why a stage with `R` actions cannot run them exactly (None: all can): a layer that
        updates running statistics would update them twice, and the model would drift from
        the one trained without the `R`."""
        for s, stage in sorted(self.stages.items()):
            if stage.recomputed and self.plan.training:
                found = self.fw.running_statistics(stage.layer)
                if found:
                    return (f"rank {self.plan.rank}: stage {s} has R actions, but its {', '.join(found[:3])} "
                            f"({'updates' if len(found) == 1 else 'update'} running statistics in training) would "
                            "update them a second time in each R: remove its R actions (or the layer's running "
                            "statistics, track_running_stats=False)")
        return None

    def _tied_copies(self) -> tuple[list[tied.Copy], str | None]:
        """The tied parameters this rank's stages declare (a training program only), or why
        they cannot be run."""
        if not self.plan.training:
            return [], None
        try:
            copies = tied.declared(self.fw, self.layers)
        except SetupError as exc:
            return [], f"rank {self.global_rank}: {exc}"
        if copies and (self.layout.sharded or self.layout.tensor > 1):
            return [], (f"rank {self.global_rank}: stage {copies[0].stage} declares tied parameters, which sharded "
                        "and tensor-parallel stages do not support yet: untie them, or run without sharding and --tp")
        return copies, None

    def _agree_on_program(self, gather: Callable[[Any], list[Any]], refused: str | None,
                          copies: Sequence[tied.Copy] = ()) -> None:
        """All ranks compare the digest of the program they hold, and whether each can run its
        part (`refused`: why not), and fail together. They also learn every rank's tied
        parameters (`tied.py`)."""
        self.watchdog.arm("checking that all ranks run the same program", "all ranks")
        gathered = gather((self.plan.digest, self.guard, refused, secrets.token_hex(8), copies))
        self.watchdog.disarm()
        # Rank 0's draw names this schedule's notes in the job's store (unique to this schedule,
        # as a transport and its store may serve several).
        self._token: str = gathered[0][3]
        refusals = [why for _, _, why, *_ in gathered if why is not None]
        if refusals:
            raise SetupError(refusals[0])
        digests = [digest for digest, *_ in gathered]
        if len(set(digests)) != 1:
            groups: dict[str, list[int]] = {}
            for r, d in enumerate(digests):
                groups.setdefault(d, []).append(r)
            desc = "; ".join(f"ranks {', '.join(map(str, rs))} hold program {d[:12]}" for d, rs in groups.items())
            raise SetupError(f"the ranks do not hold the same program (text, placement or shape): {desc}")
        unguarded = [r for r, (_, guarded, *_) in enumerate(gathered) if not guarded]
        if unguarded and len(unguarded) != len(gathered):
            raise SetupError(f"ranks {', '.join(map(str, unguarded))} run without the label guard and the others "
                             "with it: the first step's messages would not line up")
        self._ties: dict[str, list[tied.Copy]] = {}
        self._holders: dict[str, list[int]] = {}  # tie -> the global ranks holding a copy, all replicas
        if any(g[4] for g in gathered):
            layout = self.layout
            self._ties = tied.check([c for r, g in enumerate(gathered) if layout.replica_of(r) == 0 for c in g[4]])
            for tie in self._ties:
                self._holders[tie] = [r for r, g in enumerate(gathered) if any(c.tie == tie for c in g[4])]

    def _reset(self) -> None:
        for stage in self.stages.values():
            stage.reset()
        #: The running step's microbatches: the first stage's inputs, the last stage's targets
        #: and losses, every stage's keyword arguments, the outputs kept for `return_output`.
        self.inputs: list[Any] = []
        self.targets: list[Any] = []
        self.kwargs: list[dict[str, Any]] = []
        self.losses: dict[int, Any] = {}
        self.outputs: dict[int, Any] = {}
        self.keep_outputs = False
        if self.deferred is not None:
            self.deferred.clear()
        if self.tied is not None:
            self.tied.reset()
        if self.plan.training:
            for s, stage in self.stages.items():
                if stage.sharding is not None:
                    stage.sharding.begin_step(s in self._freed)

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
        self.keep_outputs = return_output  # else the last stage's outputs die with their backward
        fw = self.fw
        M = plan.microbatches
        try:
            if plan.first_stage:
                if inputs is None or (type(inputs) is tuple and not inputs):
                    raise SetupError("the first stage needs the batch's inputs: step(inputs, target=...)")
                self.inputs = values.split_batch(fw, inputs, M, "inputs")
            if plan.last_stage and plan.training:
                if target is None:
                    raise SetupError("the last stage needs the batch's targets: step(inputs, target=...)")
                self.targets = values.split_batch(fw, target, M, "target")
            self.kwargs = values.split_batch(fw, dict(kwargs or {}), M, "keyword arguments", need_tensor=False)
        except (SetupError, values.StageValueError) as exc:
            self.wire.abandon(f"rank {self.global_rank} stopped before step {self.step_index}: {exc}")
            raise SetupError(str(exc)) from None
        try:
            return self._run_step(losses, return_output)
        except StepError as exc:
            self.wire.abandon(exc.detail if exc.peer else str(exc))
            raise

    def _run_step(self, losses: list[Any] | None, return_output: bool) -> Any:
        plan, fw = self.plan, self.fw
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
                        handler(self, op)
                        if timings is not None:
                            if sync is not None:
                                sync()
                            t1 = clock()
                            inner = memory.seconds - counted if memory is not None else 0.0
                            timings.setdefault(op.label, []).append(t1 - t0 - inner)
                            started.setdefault(op.label, []).append(t0)
                            t0 = t1
                        if memory is not None:
                            memory.observe(self.stages, op)
                            if timings is not None:
                                t0 = clock()
                else:
                    for handler, op in self._compiled:
                        handler(self, op)
                self.transport.flush()
            if self.reducer is not None:
                self.reducer.wait()
            if self.tied is not None:
                self.tied.wait()
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
            losses.extend(self.losses[m] for m in sorted(self.losses))
        self.step_index += 1
        if return_output and plan.last_stage and self.outputs:
            return values.merge_batch(fw, [self.outputs[m] for m in sorted(self.outputs)])
        return None

    def eval(self, *args: Any, target: Any = None, losses: list[Any] | None = None, **kwargs: Any) -> Any:
        """Forward only, under no gradient: the program's forwards in their order (its
        backward work dropped), the batch split into the same microbatches. Every rank calls
        it, as `step()` (the first call agrees on the forward-only program, a collective).
        On the last stage's rank it returns the outputs merged back into one batch and, with
        `target`, appends each microbatch's loss (unscaled) to `losses`; elsewhere None. No
        gradient, running statistic of a training step or random draw of one is changed by it
        beyond what the forwards themselves do (a model in `eval()` mode draws nothing)."""
        inner = self._evaluator
        if inner is None:
            inner = self._evaluator = self._forward_only()
        with self.fw.no_grad():
            out = inner.run_batch(args, kwargs=kwargs, return_output=True)
            # The forwards gathered sharded weights with no RESHARD after them: freed, so that the
            # next step gathers what the optimizer has made of them since.
            for stage in self.stages.values():
                if stage.sharding is not None:
                    stage.sharding.free()
            if target is not None and losses is not None and inner.plan.last_stage:
                assert self.loss_fn is not None
                try:
                    targets = values.split_batch(self.fw, target, self.plan.microbatches, "target")
                except values.StageValueError as exc:
                    raise SetupError(str(exc)) from None
                losses.extend(self.fw.detach(self.loss_fn(inner.outputs[m], targets[m])) for m in sorted(inner.outputs))
        return out

    def _forward_only(self) -> PipelineSchedule:
        """The schedule `eval` runs: this program's forwards in each rank's order, over this
        schedule's transport, layers and watchdog."""
        from ...generators.registry import forwards_only

        program = self._source.evolve(mode="inference", rows=tuple(forwards_only(row) for row in self._source.rows))
        return PipelineSchedule(program, self.layers, None, transport=self.transport, watchdog=self.watchdog,
                                backend=self.backend, framework=self.fw, pause_gc=self.pause_gc,
                                split_backward=False, grad_guard=False, _guard=self.guard, _shared=True)

    def gradients_finite(self, losses: Sequence[Any] = ()) -> bool:
        """Whether the gradients on every rank, and the `losses` each rank passes (the last
        stage's of the step), are all finite: a collective, called by every rank after
        `step()`; when False, skip the optimizer step on every rank."""
        return clipping.all_finite(self.fw, self.layers.values(), self.transport.gather,
                                   [float(self.fw.detach(v)) if self.fw.is_tensor(v) else float(v) for v in losses])

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip every stage's gradients by the global norm over the whole model (all pipeline
        ranks; the replicas hold the same averaged gradients after `step()`): scaled by
        `max_norm / (norm + 1e-6)` where that is below 1, as `torch.nn.utils.clip_grad_norm_`.
        Returns the norm before clipping. Every rank calls it after `step()` and before its
        optimizer steps (it is a collective); a non-finite norm scales nothing."""
        return clipping.clip_grad_norm(self.fw, self.layers.values(), clipping.check_max_norm(max_norm),
                                       self.transport.gather,
                                       self.layout.pipeline * self.layout.shards * self.layout.tensor,
                                       self.tied.local.others() if self.tied is not None else (),
                                       whole_too=self.layout.tensor_rank == 0)

    def close(self) -> None:
        """End the schedule's background threads (the sending threads, the gradient reduction
        of a data-parallel layout) once the last step is done; a script that exits normally
        should call it."""
        if self._evaluator is not None and self._evaluator.reducer is not None:
            self._evaluator.reducer.close()
        if self.reducer is not None:
            self.reducer.close()
        if self.tied is not None:
            self.tied.close()
        if not self._shared:
            self.transport.close()
        if self._own_watchdog:
            self.watchdog.stop()

    def last_losses(self) -> list[float]:
        """This step's microbatch losses as floats (last-stage rank only; else empty)."""
        return [float(self.losses[m]) for m in sorted(self.losses)]

    def head(self, m: int, y: Any) -> Any:
        """The last stage's output of microbatch m: kept for `return_output`, and when training
        turned into the (scaled) loss its backward starts from."""
        if self.keep_outputs:
            self.outputs[m] = y
        if not self.plan.training:
            return y
        assert self.loss_fn is not None
        loss = self.loss_fn(y, self.targets[m])
        if not self._loss_checked:
            setup.check_loss(self.fw, loss)
            self._loss_checked = True
        self.losses[m] = loss.detach()
        return loss * self.scale if self.scale != 1.0 else loss


