"""A rank's share of a program, compiled once into the flat list the interpreter runs.

No paddle here: a plan is pure data, so it can be built and tested (and the launcher can
validate a file) without importing the framework.
"""

from __future__ import annotations

import hashlib
from array import array

from attrs import frozen

from ...check import analyse
from ...diagnostics import UsageError, render_header
from ...encoding import encode, peer_stage
from ...wording import plural
from ..errors import SetupError
from ...ir import Action, Batch, Idle, Kind, Overlap, Program
from ...lower import needs_lowering

# Interpreter op codes. Compute kinds keep Kind's values; the rest are the runtime's own.
F, I, W, B = int(Kind.F), int(Kind.I), int(Kind.W), int(Kind.B)
SEND_F, RECV_F, SEND_B, RECV_B = int(Kind.SEND_F), int(Kind.RECV_F), int(Kind.SEND_B), int(Kind.RECV_B)
UNSHARD, RESHARD, REDUCE_GRAD = int(Kind.UNSHARD), int(Kind.RESHARD), int(Kind.REDUCE_GRAD)
OVERLAP = 101
BATCH = 102


@frozen
class Op:
    """One thing a rank does. `peer` is the global rank a send/receive talks to (else -1);
    `microbatch` is -1 for a stage-only kind, an overlapped pair and a batch."""

    kind: int  # a `Kind` value, or OVERLAP / BATCH for a step of several actions
    stage: int
    microbatch: int
    peer: int
    label: str
    parts: tuple[Op, ...] = ()


@frozen
class Plan:
    rank: int
    ranks: int
    stages: int
    microbatches: int
    local_stages: tuple[int, ...]
    ops: tuple[Op, ...]
    # Every pair of ranks that talks anywhere in the program, sorted: all ranks create one
    # 2-rank group per pair in this order (gloo breaks P2P inside larger groups).
    pairs: tuple[tuple[int, int], ...]
    digest: str
    training: bool

    @property
    def first_stage(self) -> bool:
        return 0 in self.local_stages

    @property
    def last_stage(self) -> bool:
        return self.stages - 1 in self.local_stages


def peer_of(action: Action, placement: tuple[int, ...]) -> int:
    """The rank on the other end of a send or receive."""
    return placement[peer_stage(action.stage, action.kind)]


def program_digest(program: Program) -> str:
    """What all ranks must agree on: the program's shape and every rank's actions, read off its
    integer encoding (which the checker made and keeps on the program), never printed."""
    enc = encode(program)
    h = hashlib.sha256(repr((program.ranks, program.stages, program.microbatches, program.mode,
                             program.placement)).encode())
    for rank in range(program.ranks):
        h.update(b"|codes")
        h.update(array("q", enc.codes[rank]).tobytes())
        steps = enc.steps[rank]  # where idle steps and groups fall (None: one action a step)
        h.update(b"|steps" + (array("q", steps).tobytes() if steps is not None else b"-"))
        h.update(repr(sorted(enc.groups[rank].items())).encode())
    return h.hexdigest()


def communicating_pairs(program: Program) -> tuple[tuple[int, int], ...]:
    pairs: set[tuple[int, int]] = set()
    for rank, _, a in program.actions():
        if a.kind.is_comm:
            peer = peer_of(a, program.placement)
            pairs.add((min(rank, peer), max(rank, peer)))
    return tuple(sorted(pairs))


# What no rank can run, whatever the model: the checker's verdicts (a stage on the wrong rank,
# ranges, a batch of computes, a send to no stage or between two stages of one rank). The
# checker's analysis is kept on the program, so the preflight's lint already paid for it.
_UNRUNNABLE = frozenset(("PPS101", "PPS102", "PPS204", "PPS207", "PPS208"))


def _refuse_unrunnable(program: Program) -> None:
    found, _ = analyse(program, families=("structure", "comms"))
    bad = [d for d in found if d.is_error and d.code in _UNRUNNABLE]
    if bad:
        raise UsageError(render_header(bad[0]))


def _op(a: Action, rank: int, program: Program) -> Op:
    if a.kind.stage_only:
        return Op(int(a.kind), a.stage, -1, -1, str(a))
    assert a.microbatch is not None
    peer = peer_of(a, program.placement) if a.kind.is_comm else -1
    return Op(int(a.kind), a.stage, a.microbatch, peer, str(a))


def compile_rank(program: Program, rank: int) -> Plan:
    """The ops of one rank. Raises UsageError when the program cannot run as it stands."""
    if not 0 <= rank < program.ranks:
        raise UsageError(f"rank {rank} is outside this program's {plural(program.ranks, 'rank')}")
    if needs_lowering(program):
        raise UsageError("this program has no send/recv between its ranks: lower it first "
                         "(`ppdsl expand --comms`)")
    _refuse_unrunnable(program)
    ops: list[Op] = []
    for step in program.rows[rank]:
        t = type(step)
        if t is Idle:
            continue
        if t is Action:
            assert isinstance(step, Action)
            ops.append(_op(step, rank, program))
        elif t is Overlap:
            assert isinstance(step, Overlap)
            # A forward never needs a backward, so forwards first always respects the data
            # dependencies between the two halves of a pair.
            ordered = sorted((_op(p, rank, program) for p in step.parts), key=lambda o: o.kind != F)
            ops.append(Op(OVERLAP, -1, -1, -1, str(step), tuple(ordered)))
        else:
            assert isinstance(step, Batch)
            parts = tuple(_op(p, rank, program) for p in step.parts)
            ops.append(Op(BATCH, -1, -1, -1, str(step), parts))
    return Plan(
        rank=rank,
        ranks=program.ranks,
        stages=program.stages,
        microbatches=program.microbatches,
        local_stages=program.stages_of(rank),
        ops=tuple(ops),
        pairs=communicating_pairs(program),
        digest=program_digest(program),
        training=program.mode == "train",
    )


def count_actions(plan: Plan) -> int:
    return sum(len(op.parts) or 1 for op in plan.ops)


BACKWARD = frozenset((B, I, W))


def last_backward(plan: Plan) -> dict[int, tuple[int, ...]]:
    """op index -> the stages whose gradients are complete once that op has run: the op
    holding each stage's last backward action of the step (looking inside overlapped pairs and
    batches). An `I` counts too: a stage with no `W` finishes its weight gradients there, and a
    stage with `W`s always runs one after its last `I`. Empty for an inference program."""
    if not plan.training:
        return {}
    last: dict[int, int] = {}
    for index, op in enumerate(plan.ops):
        for part in op.parts or (op,):
            if part.kind in BACKWARD:
                last[part.stage] = index
    ends: dict[int, list[int]] = {}
    for stage, index in sorted(last.items()):
        ends.setdefault(index, []).append(stage)
    return {index: tuple(stages) for index, stages in ends.items()}


def reduction_points(plan: Plan) -> dict[int, tuple[int, ...]]:
    """op index -> stages whose reduction starts after it: after each stage's last backward,
    except a stage whose `REDUCE_GRAD` the file places (its handler starts it), which must then
    come after that backward, once."""
    placed: dict[int, list[int]] = {}
    for index, op in enumerate(plan.ops):
        if op.kind == REDUCE_GRAD:
            placed.setdefault(op.stage, []).append(index)
    implicit = last_backward(plan)
    out: dict[int, tuple[int, ...]] = {}
    for index, stages in implicit.items():
        for s in stages:
            where = placed.get(s)
            if where is None:
                continue
            if len(where) > 1:
                raise SetupError(f"rank {plan.rank} has {len(where)} {s}REDUCE_GRAD actions in a step: the stage's "
                                 "gradients are averaged over its replicas once")
            if where[0] < index:
                raise SetupError(f"{s}REDUCE_GRAD comes before {plan.ops[index].label}, the last backward of stage {s} "
                                 f"on rank {plan.rank}: it would average gradients not yet complete. Move it after")
        rest = tuple(s for s in stages if s not in placed)
        if rest:
            out[index] = rest
    return out


def last_backward_labels(plan: Plan) -> dict[int, str]:
    """stage -> the label of its last backward action of the step on this rank."""
    labels: dict[int, str] = {}
    for op in plan.ops:
        for part in op.parts or (op,):
            if part.kind in BACKWARD:
                labels[part.stage] = part.label
    return labels


def has_split_backward(plan: Plan) -> bool:
    """The plan has an `I` or a `W` (looking inside overlapped pairs)."""
    return any(o.kind in (I, W) for op in plan.ops for o in (op.parts or (op,)))
