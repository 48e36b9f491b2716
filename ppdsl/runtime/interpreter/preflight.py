"""Before the first step: lint under the backend's comm model, lower, and refuse what would hang.

gloo runs every send and receive as a rendezvous, and a batch member by member; NCCL posts a
batch's members together. A file that deadlocks under the model of the backend in use is
refused here, with the wait-for cycle, instead of hanging at run time. No paddle here.
"""

from __future__ import annotations

from ...check import check
from ...diagnostics import Diagnostic, PpsError
from ...ir import Program
from ...lower import lower, needs_lowering, unit_run
from ...semantics import CommModel, execute, wait_cycle


# Kept on a prepared program (`Program.derived`): the (model, check) it is ready to run under.
_PREPARED = "runtime.prepared"


def lint(program: Program, model: CommModel) -> list[Diagnostic]:
    """The checker's errors for this program under `model` (empty when it is sound)."""
    return [d for d in check(program, comm_model=str(model)) if d.is_error]


def deadlock(program: Program, model: CommModel) -> str | None:
    """How the program gets stuck under `model`, or None when every rank finishes."""
    run = execute(program, model)
    if run.completed:
        return None
    cycle = wait_cycle(run.waits)
    waits = cycle or list(run.waits)
    parts = [f"rank {w.rank} at `{w.action}` (step {w.step}) waits for {w.needs}"
             + (f" from rank {w.on_rank}" if w.on_rank is not None else " which nothing produces")
             for w in waits]
    kind = "a wait-for cycle" if cycle else "stuck"
    return f"under the `{model}` model it would hang ({kind}): " + "; ".join(parts)


def prepare(program: Program, model: CommModel, check: bool = True) -> Program:
    """The program ready to run: linted under `model` and lowered to explicit send/recv.

    Raises PpsError with the checker's diagnostics (a hang under `model` is PPS210 among
    them). Each program is analysed once: the analysis stays on it for `compile_rank`, and a
    program prepared under `model` is returned as it is (a process prepares it once).
    `check=False` only lowers: the bypass for tests and experts, who then rely on the
    runtime's label guard (docs/runtime.md) to stop a mismatched order.
    """
    ready = program.derived.get(_PREPARED)
    if isinstance(ready, set) and (str(model), check) in ready:
        return program  # prepared already in this process (the worker, then its schedule)
    lowering = needs_lowering(program)
    if lowering:
        unit_run(program)  # made first and kept: the lint's deadlock rule reads it, lower() places by it
    errors = lint(program, model) if check else []
    if errors:
        raise PpsError(errors)
    if lowering:
        program = lower(program, fuse=False, comm_model=str(model))
        errors = lint(program, model) if check else []
        if errors:  # pragma: no cover - lowering produces sound programs from sound ones
            raise PpsError(errors)
    # No run of its own to look for a hang: the lint ran the program under `model` (PPS210).
    marks = program.derived.setdefault(_PREPARED, set())
    assert isinstance(marks, set)
    marks.add((str(model), check))
    return program
