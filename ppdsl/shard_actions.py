"""Place `UNSHARD`, `RESHARD` and `REDUCE_GRAD` for sharded stages (`ppdsl expand --fsdp`), or
`REDUCE_GRAD` alone (`ppdsl expand --reduce-grad`: replicas, tied parameters).

Each rank's row is read in order. Before each step that computes, the rank keeps gathered the
next `window` distinct stages its row computes from that step on: the ones not gathered yet
are gathered there (`UNSHARD`, in the order they will be used), and a gathered stage that is
not among them is freed (`RESHARD`). At the end of the row every stage still gathered is
freed. A stage's `REDUCE_GRAD` follows the backward that completes its gradients: its M-th
`B` or `W`. This is PyTorch's lowering for FSDP (`max_active_stages`, default 3: one stage
computing a forward, one a backward, one prefetched), so a file made here runs as torch's
would; `ppdsl lint` holds the result to PPS112 and PPS113.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .diagnostics import UsageError
from .ir import Action, Kind, Overlap, Program, Step

DEFAULT_WINDOW = 3  # PyTorch's max_active_stages
WINDOW_MAX = 1024  # more than any rank holds stages; a larger number says nothing more
# The actions that compute with a stage's weights (an OFFLOAD or RELOAD only moves activations).
WEIGHT_USERS = frozenset({Kind.F, Kind.B, Kind.I, Kind.W, Kind.R})
SHARD_KINDS = frozenset({Kind.UNSHARD, Kind.RESHARD, Kind.REDUCE_GRAD})
_GRADIENT = (Kind.B, Kind.W)  # the last of these completes a stage's gradients (`I` leaves the weights' to W)


def add_shard_actions(program: Program, window: int = DEFAULT_WINDOW) -> Program:
    """`program` with every stage sharded: its rows with UNSHARD, RESHARD and REDUCE_GRAD
    placed (UsageError for a program that places them already, or a window below 1)."""
    if not 1 <= window <= WINDOW_MAX:
        raise UsageError(f"--fsdp-window must be between 1 and {WINDOW_MAX} (got {window})")
    written = _written(program, SHARD_KINDS)
    if written:
        shown = ", ".join(f"`{w}`" for w in written[:3]) + (", ..." if len(written) > 3 else "")
        raise UsageError(f"the program places sharding actions already ({shown}): --fsdp places them in a "
                         "program that has none")
    reduce = program.mode == "train"
    rows = [_row(row, window, program.microbatches, reduce) for row in program.rows]
    return program.evolve(rows=rows, source=None, generated=None)


def add_reduce_actions(program: Program) -> Program:
    """`program` (training) with each stage's `REDUCE_GRAD` after the backward that completes
    its gradients, and nothing else: where replicas average a stage's gradients and tied
    parameters are summed (UsageError for a program that places one already, or one that
    does not train)."""
    if program.mode != "train":
        raise UsageError("--reduce-grad places REDUCE_GRAD after each stage's last backward: the program has no "
                         "backward (mode=inference)")
    written = _written(program, {Kind.REDUCE_GRAD})
    if written:
        raise UsageError(f"the program places `{written[0]}` already: --reduce-grad places REDUCE_GRAD in a "
                         "program that has none")
    rows: list[list[Step]] = []
    for row in program.rows:
        backwards: dict[int, int] = {}
        out: list[Step] = []
        for step in row:
            out.append(step)
            out.extend(_reductions(step, backwards, program.microbatches))
        rows.append(out)
    return program.evolve(rows=rows, source=None, generated=None)


def _written(program: Program, kinds: Collection[Kind]) -> list[str]:
    """The actions of `kinds` the program places already, as written, sorted."""
    return sorted({str(a) for _, _, a in program.actions() if a.kind in kinds})


def _reductions(step: Step, backwards: dict[int, int], microbatches: int) -> list[Action]:
    """The `REDUCE_GRAD`s that follow `step`: of each stage whose gradients it completes (its
    M-th `B` or `W`; `backwards` counts them so far, per stage)."""
    out: list[Action] = []
    parts = step.parts if type(step) is Overlap else (step,) if type(step) is Action else ()
    for a in parts:
        if type(a) is Action and a.kind in _GRADIENT:
            n = backwards[a.stage] = backwards.get(a.stage, 0) + 1
            if n == microbatches:
                out.append(Action(a.stage, Kind.REDUCE_GRAD, None))
    return out


def _stages_used(step: Step) -> list[int]:
    if type(step) is Action:
        return [step.stage] if step.kind in WEIGHT_USERS else []
    if type(step) is Overlap:
        return list(dict.fromkeys(p.stage for p in step.parts if p.kind in WEIGHT_USERS))
    return []


def _ahead(row: Sequence[Step], window: int) -> list[list[int]]:
    """Per step, the first `window` distinct stages computed from that step on, in order of
    first use. Built from the end: a step's stages move to the front of the list after it."""
    order: list[int] = []
    out: list[list[int]] = [[] for _ in row]
    for i in range(len(row) - 1, -1, -1):
        used = _stages_used(row[i])
        if used:
            order = used + [s for s in order if s not in used]
        out[i] = order[:max(window, len(used))]  # an overlapped pair's two stages, whatever the window
    return out


def _row(row: Sequence[Step], window: int, microbatches: int, reduce: bool) -> list[Step]:
    ahead = _ahead(row, window)
    gathered: list[int] = []  # in the order they were gathered
    backwards: dict[int, int] = {}  # stage -> its B and W so far
    out: list[Step] = []
    for i, step in enumerate(row):
        if _stages_used(step):
            wanted = ahead[i]
            for s in sorted(s for s in gathered if s not in wanted):
                gathered.remove(s)
                out.append(Action(s, Kind.RESHARD, None))
            for s in wanted:
                if s not in gathered:
                    gathered.append(s)
                    out.append(Action(s, Kind.UNSHARD, None))
        out.append(step)
        if reduce:
            out.extend(_reductions(step, backwards, microbatches))
    for s in sorted(gathered):
        out.append(Action(s, Kind.RESHARD, None))
    return out
