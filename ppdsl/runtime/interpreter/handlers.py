"""What each action kind does at run time: one handler per kind, and the ones users register.

A handler is called as `handler(schedule, op)`: it routes values between the rank's stages and
the wire and calls the stage's compute (`stage.Stage`). The schedule compiles each op of the
plan to its kind's handler once, so a step is a loop over (handler, op) pairs.

Users replace or wrap a kind's handler with `register_handler(kind, fn)`: `fn(ctx)` gets an
`ActionContext` (the action, its stage, the schedule) and `ctx.default()` runs the handler it
replaces, as torch's `register_custom_function` does for its schedules' actions. Registered
handlers apply to schedules built afterwards; `PipelineSchedule(handlers={kind: fn})` gives a
schedule its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from attrs import frozen

from ...ir import KIND_BY_NAME, Kind
from ...kinds import TABLE, KindRow
from . import values
from ..errors import StepError
from ..framework import ShardedWeights
from .plan import BATCH, OVERLAP, RECV_F, SEND_B, SEND_F, Op, Plan
from .split_backward import DeferredGrads
from .stage import Stage
from ..transport.wire import Exchange

if TYPE_CHECKING:  # pragma: no cover
    from .schedule import PipelineSchedule

log = logging.getLogger("ppdsl.runtime")

Handler = Callable[["PipelineSchedule", Op], None]
UserHandler = Callable[["ActionContext"], None]


@frozen
class ActionContext:
    """What a registered handler gets: the action, the stage it names (None when this rank does
    not hold one: never for a compute action), the schedule, and the handler it replaces."""

    op: Op
    stage: Stage | None
    schedule: PipelineSchedule
    _default: Callable[[], None]

    @property
    def kind(self) -> Kind:
        return Kind(self.op.kind)

    @property
    def label(self) -> str:
        return self.op.label

    @property
    def microbatch(self) -> int | None:
        return self.op.microbatch if self.op.microbatch >= 0 else None

    def default(self) -> None:
        """Run the handler this one replaced (the built-in one, or one registered before)."""
        self._default()


class Registration:
    """A registered handler; `remove()` takes it back (schedules built before keep it)."""

    def __init__(self, kind: Kind, fn: UserHandler):
        self.kind, self.fn = kind, fn

    def remove(self) -> None:
        chain = _REGISTERED.get(self.kind, [])
        if self.fn in chain:
            chain.remove(self.fn)


_REGISTERED: dict[Kind, list[UserHandler]] = {}


def kind_of(kind: Kind | str) -> Kind:
    """`Kind.F`, or its name as a `.pps` file spells it (`"F"`, `"REDUCE_GRAD"`)."""
    if isinstance(kind, Kind):
        return kind
    found = KIND_BY_NAME.get(kind.upper()) if isinstance(kind, str) else None
    if found is None:
        raise ValueError(f"{kind!r} is not an action kind; the kinds are {', '.join(KIND_BY_NAME)}")
    return found


def register_handler(kind: Kind | str, fn: UserHandler) -> Registration:
    """Run `fn(ctx)` for every action of `kind` in schedules built from now on, instead of the
    handler they would run; `ctx.default()` runs that one (so `fn` can wrap it). Registering
    twice for one kind wraps the first registration in the second."""
    k = kind_of(kind)
    if not callable(fn):
        raise TypeError(f"the handler for {k.name} must be callable, got {type(fn).__name__}")
    _REGISTERED.setdefault(k, []).append(fn)
    return Registration(k, fn)


def registered() -> dict[Kind, list[UserHandler]]:
    """A copy of the global registrations, per kind, innermost first."""
    return {k: list(fns) for k, fns in _REGISTERED.items() if fns}


def wrap(handler: Handler, fn: UserHandler) -> Handler:
    """`fn` in place of `handler`, which its context's `default()` runs."""
    def run(sched: PipelineSchedule, op: Op) -> None:
        fn(ActionContext(op, sched.stages.get(op.stage), sched, lambda: handler(sched, op)))

    return run


# --- compute ----------------------------------------------------------------------------
def forward(sched: PipelineSchedule, op: Op) -> None:
    s, m = op.stage, op.microbatch
    stage = sched.stages[s]
    if stage.first:
        x = sched.inputs[m]
    elif s - 1 in sched.stages:  # the stage before is on this rank: handed over, not sent
        x = values.hand_over(sched.fw, sched.stages[s - 1].outputs[m], stage.training)
    else:
        x = stage.received.pop(m)
    later_r = stage.keeps_input_only(m)  # nothing it saves lives on
    # A forward an `OFFLOAD` moves keeps what it saved itself (`Stage.device_saved`), under
    # hooks of its own (Paddle takes one pair at a time).
    counted = sched.profile and not later_r and m not in stage.offloaded
    with sched.memory.saving(sched.fw, (s, m)) if counted else nullcontext():
        y = stage.forward(m, x, sched.kwargs[m])
    if sched.grad_guard is not None and sched.step_index == 0 and not later_r:
        sched.grad_guard.learn(s, stage.differentiated(y))


def recompute(sched: PipelineSchedule, op: Op) -> None:
    """`R`: the stage's forward of the microbatch again, with autograd, from its kept input."""
    s, m = op.stage, op.microbatch
    stage = sched.stages[s]
    with sched.memory.saving(sched.fw, (s, m)) if sched.profile and m not in stage.offloaded else nullcontext():
        y = stage.recompute(m)
    if sched.grad_guard is not None and sched.step_index == 0:
        sched.grad_guard.learn(s, stage.differentiated(y))


def offload(sched: PipelineSchedule, op: Op) -> None:
    m = op.microbatch
    moved = sched.stages[op.stage].offload(m, [batch[m] for batch in (sched.inputs, sched.targets) if m < len(batch)])
    if sched.profile:
        sched.memory.moved(op.stage, moved)


def reload(sched: PipelineSchedule, op: Op) -> None:
    moved = sched.stages[op.stage].reload(op.microbatch)
    if sched.profile:
        sched.memory.moved(op.stage, moved)


def output_grads(sched: PipelineSchedule, stage: Stage, m: int) -> list[Any] | None:
    """The gradients of a stage's output members (None at the last stage: the loss): handed
    down by the next stage when this rank holds it, else received."""
    if stage.last:
        return None
    after = sched.stages.get(stage.index + 1)
    if after is not None:
        return after.input_grads.pop(m)
    return stage.output_grads.pop(m)


def backward(sched: PipelineSchedule, op: Op) -> None:
    stage = sched.stages[op.stage]
    stage.backward(op.microbatch, output_grads(sched, stage, op.microbatch))


def backward_input(sched: PipelineSchedule, op: Op) -> None:
    stage = sched.stages[op.stage]
    stage.backward_input(op.microbatch, output_grads(sched, stage, op.microbatch))


def backward_split(sched: PipelineSchedule, op: Op) -> None:
    stage = sched.stages[op.stage]
    stage.backward_split(op.microbatch, output_grads(sched, stage, op.microbatch))


def backward_weight(sched: PipelineSchedule, op: Op) -> None:
    sched.stages[op.stage].backward_weight(op.microbatch)


def deferred_weight(sched: PipelineSchedule, op: Op) -> None:
    computed, expected = sched.stages[op.stage].deferred_weight(op.microbatch)
    if not computed and expected and sched.grad_guard is not None:
        raise StepError(sched.global_rank, sched.step_index, op.label,
                        f"{op.label} computed no weight gradient, though the forward of stage {op.stage} on "
                        f"microbatch {op.microbatch} ran layers whose weight gradients are deferred to it: "
                        "their gradients were lost. Run with split_backward=False (--no-split-backward); "
                        "grad_guard=False (--no-grad-guard) turns this check off")


def keyed(handler: Handler, deferred: DeferredGrads) -> Handler:
    """`handler` with the split matmul's store keyed by the action's (stage, microbatch): what an
    `I` defers goes to that key's `W`, and the key's `W` knows its forward deferred to it."""
    def run(sched: PipelineSchedule, op: Op) -> None:
        deferred.key = (op.stage, op.microbatch)
        try:
            handler(sched, op)
        finally:
            deferred.key = None

    return run


# --- stage-only kinds -------------------------------------------------------------------
def gather_weights(sched: PipelineSchedule, op: Op) -> None:
    """`UNSHARD`: start gathering a sharded stage's weights (its next compute waits for them)."""
    if (sharding := _sharding(sched, op)) is not None:
        sharding.gather()


def free_weights(sched: PipelineSchedule, op: Op) -> None:
    """`RESHARD`: free a sharded stage's gathered weights, keeping this rank's shard."""
    if (sharding := _sharding(sched, op)) is not None:
        sharding.free()


def _sharding(sched: PipelineSchedule, op: Op) -> ShardedWeights | None:
    sharding = sched.stages[op.stage].sharding
    if sharding is None:
        log.debug("rank %d: %s: the stage holds its whole weights, there is nothing to gather or free",
                  sched.global_rank, op.label)
    return sharding


def reduce_grads(sched: PipelineSchedule, op: Op) -> None:
    """`REDUCE_GRAD`: start the stage's gradient reduction."""
    reduce_stage(sched, op.stage)


def reduce_stage(sched: PipelineSchedule, s: int) -> None:
    """A sharded stage's reduce-scatter over its group; else the average over its replicas
    (none: nothing to do)."""
    sharding = sched.stages[s].sharding
    if sharding is not None:
        sharding.reduce()
    elif sched.reducer is not None:
        sched.reducer.post(s)
    if sched.tied is not None:
        sched.tied.stage_done(s)


# --- messages: the protocol is `wire.py`; these say what each action carries -------------
def exchange(sched: PipelineSchedule, op: Op) -> Exchange:
    stage, m = sched.stages[op.stage], op.microbatch
    wire = sched.wire
    if op.kind == SEND_F:
        return wire.send_f(op, stage.outputs[m])
    if op.kind == SEND_B:
        return wire.send_b(op, stage.input_grads.pop(m))
    if op.kind == RECV_F:
        return wire.recv_f(op, lambda value: stage.received.__setitem__(m, value))
    return wire.recv_b(op, values.grad_members(sched.fw, stage.outputs[m]),
                       lambda grads: stage.output_grads.__setitem__(m, grads))


def message(sched: PipelineSchedule, op: Op) -> None:
    sched.wire.run(exchange(sched, op))


def batch(sched: PipelineSchedule, op: Op) -> None:
    """A batch `<...>`: its members are posted together by the wire, not by their handlers."""
    sched.wire.run_batch([exchange(sched, part) for part in op.parts], op.label)


def overlap(sched: PipelineSchedule, op: Op) -> None:
    """An overlapped pair: its parts' handlers, forwards first (a forward never needs a backward)."""
    handlers = sched.handlers
    for part in op.parts:
        handlers[part.kind](sched, part)
        if sched.profile:  # the forward allocates before the backward frees: both count
            sched.memory.observe(sched.stages, part)


def builtin(deferred: DeferredGrads | None) -> dict[Kind, Handler]:
    """Every kind's handler: with the split matmul (its store `deferred`), `I` is the backward
    with the Linears' weight gradients deferred and `W` computes them; without, `I` is the
    gradient of the input with the graph kept and `W` a second backward through it."""
    split = deferred is not None
    return {
        Kind.F: keyed(forward, deferred) if deferred is not None else forward,
        Kind.B: backward,
        Kind.I: keyed(backward_split, deferred) if deferred is not None else backward_input,
        Kind.W: deferred_weight if split else backward_weight,
        Kind.R: keyed(recompute, deferred) if deferred is not None else recompute,
        Kind.OFFLOAD: offload, Kind.RELOAD: reload,
        Kind.SEND_F: message, Kind.RECV_F: message, Kind.SEND_B: message, Kind.RECV_B: message,
        Kind.UNSHARD: gather_weights, Kind.RESHARD: free_weights, Kind.REDUCE_GRAD: reduce_grads,
    }


def unrunnable(plan: Plan, handlers: Mapping[int, Handler], framework: str,
               rows: Mapping[int, KindRow] = TABLE.by_value) -> str | None:
    """Why `plan` cannot run on `framework`'s runtime (None: it can): the first action of a kind
    with no handler, or whose row in the table of kinds does not list that runtime."""
    for op in plan.ops:
        for part in op.parts or (op,):
            row = rows.get(part.kind)
            if row is None:
                continue
            if framework not in row.runtimes or part.kind not in handlers:
                runs = ", ".join(sorted(row.runtimes)) or "no runtime yet"
                return (f"rank {plan.rank} has {part.label}, but the {framework} runtime has no handler for "
                        f"{row.name} actions (the table of action kinds says: {runs})")
    return None


def table(deferred: DeferredGrads | None, own: Mapping[Kind | str, UserHandler] | None = None) -> dict[int, Handler]:
    """op code -> handler: the built-in ones, wrapped by the global registrations, then by `own`."""
    out: dict[int, Handler] = {}
    mine = {kind_of(k): fn for k, fn in (own or {}).items()}
    for kind, handler in builtin(deferred).items():
        for fn in _REGISTERED.get(kind, []):
            handler = wrap(handler, fn)
        if kind in mine:
            handler = wrap(handler, mine[kind])
        out[int(kind)] = handler
    out[BATCH] = batch
    out[OVERLAP] = overlap
    return out


def compile_ops(plan: Plan, table: Mapping[int, Handler], reductions: Mapping[int, tuple[int, ...]]) -> list[tuple[Handler, Op]]:
    """(handler, op) per op of the plan; an op that ends stages' backward also starts their reduction."""
    out: list[tuple[Handler, Op]] = []
    for i, op in enumerate(plan.ops):
        handler = table[op.kind]
        if i in reductions:
            handler = reducing(handler, reductions[i])
        out.append((handler, op))
    return out


def reducing(handler: Handler, stages: tuple[int, ...]) -> Handler:
    """`handler`, then the reduction of the stages whose last backward of the step it ran."""
    def run(sched: PipelineSchedule, op: Op) -> None:
        handler(sched, op)
        for s in stages:
            reduce_stage(sched, s)

    return run
