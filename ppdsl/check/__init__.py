"""The checker: prove a schedule sound, or say exactly where and why it is not.

`check(program, comm_model, max_memory, memory_weights)` runs every rule family in the
registry below, in order, and returns sorted, deduplicated diagnostics (errors and warnings).
A family runs only when the families it REQUIRES found no error, so one fault is reported
once, where it is, rather than again as each later consequence (a missing send would
otherwise also be a deadlock).

Each family is one module with a docstring that documents its codes, `FAMILY`, `CODES`,
`REQUIRES` and `check(ctx) -> Iterator[Diagnostic]`; the registry is explicit, as in yamllint.
The rules read the program's encoding (`ppdsl/encoding.py`: codes, positions, links, what each
code waits for) and the engine (`semantics`); the analysis is kept on the program, so lint,
then lower, then the runtime's plan analyse a program once. The checker calls down, never the
reverse: `lower_checked` runs the rules lowering's proof needs and then `lower.lower`, which
itself imports nothing from here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from types import ModuleType

from attrs import frozen

from ..diagnostics import Diagnostic, PpsError, sorted_unique
from ..ir import Program, require_program
from ..memory import Sizes
from ..lower import lower, refuse_communication, unit_run
from ..semantics import CommModel
from . import completeness, comms, deadlock, links, memory, memory_actions, order, sharding, structure, warnings
from .context import Context, no_gc

RULES: tuple[ModuleType, ...] = (structure, completeness, order, memory_actions, sharding, comms, links, deadlock, memory,
                                  warnings)

RULE_OF_CODE: dict[str, ModuleType] = {code: rule for rule in RULES for code in rule.CODES}


def analyse(program: Program, comm_model: str | CommModel = "rendezvous", max_memory: float | None = None,
            memory_weights: Sequence[float] | None = None, families: Sequence[str] | None = None,
            max_bytes: tuple[float, Sizes] | None = None) -> tuple[list[Diagnostic], Context]:
    """check() and the context it built (with the execution, when the program got that far).

    `families` limits the rule families run. The analysis is kept on the program
    (`Program.derived`), so asking again (lint, then lower, then the runtime's plan) costs
    nothing."""
    require_program(program)
    model = CommModel(comm_model)
    _check_limits(max_memory, memory_weights)
    wanted = frozenset(r.FAMILY for r in RULES) if families is None else frozenset(families)
    memory_key = (max_memory, None if memory_weights is None else tuple(memory_weights), max_bytes)
    last = program.derived.get(_ANALYSIS)
    if isinstance(last, _Analysis) and (last.model is model or not wanted & _BY_MODEL) and wanted <= last.families \
            and ("memory" not in wanted or last.memory_key == memory_key):
        # The same immutable program analysed a moment ago (lint, then lower): reuse it.
        codes = {c for r in RULES if r.FAMILY in wanted for c in r.CODES}
        return [d for d in last.found if d.code in codes], last.ctx
    with no_gc():
        ctx = Context(program, model, max_memory, memory_weights, max_bytes)
        found = _analyse(ctx, wanted)
    program.derived[_ANALYSIS] = _Analysis(model, wanted, memory_key, ctx, found)  # one per program: it holds the execution
    return found, ctx


def _check_limits(max_memory: object, weights: Sequence[object] | None) -> None:
    """The memory limit and weights of a caller from Python (the command line checks its own)."""
    if max_memory is not None:
        if isinstance(max_memory, bool) or not isinstance(max_memory, numbers.Real):
            raise TypeError(f"max_memory is a number of microbatches of a rank's activations, not "
                            f"{type(max_memory).__name__} (a limit in bytes is max_bytes=(bytes, sizes))")
        if not (math.isfinite(max_memory) and float(max_memory) > 0):
            raise ValueError(f"max_memory must be a finite number above 0, not {max_memory}")
    for w in weights or ():
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not (math.isfinite(w) and float(w) >= 0):
            raise ValueError(f"memory_weights are finite numbers >= 0, one per stage, not {w!r}")


_ANALYSIS = "analysis"  # its entry in Program.derived
_BY_MODEL = frozenset(("deadlock",))  # the families whose verdict depends on the comm model


@frozen
class _Analysis:
    """The last analysis of a program, kept on it (`Program.derived`)."""

    model: CommModel
    families: frozenset[str]
    memory_key: tuple[float | None, tuple[float, ...] | None, tuple[float, Sizes] | None]
    ctx: Context
    found: list[Diagnostic]


def _analyse(ctx: Context, families: frozenset[str]) -> list[Diagnostic]:
    found: list[Diagnostic] = []
    for rule in RULES:
        if rule.FAMILY not in families:
            continue
        if ctx.failed.intersection(rule.REQUIRES):
            continue
        produced = list(rule.check(ctx))
        found.extend(produced)
        if any(d.is_error for d in produced):
            ctx.failed.add(rule.FAMILY)
    return sorted_unique(found)


def check(program: Program, comm_model: str | CommModel = "rendezvous", max_memory: float | None = None,
          memory_weights: Sequence[float] | None = None, max_bytes: tuple[float, Sizes] | None = None
          ) -> list[Diagnostic]:
    """Every problem in `program`, sorted by position, without duplicates. `max_bytes`: a
    memory limit in bytes and the sizes of the program's stages (PPS301 in bytes)."""
    found = analyse(program, comm_model, max_memory, memory_weights, max_bytes=max_bytes)[0]
    if not program.costs:
        return found
    from ..cost_sources import from_program  # the `costs` line is checked here, not only when simulating

    try:
        from_program(program)
    except PpsError as exc:
        return sorted_unique([*found, *exc.diagnostics])
    return found


# What lowering's proof needs of its input (lower.py): every action once, in a possible order,
# running to the end under `rendezvous`.
LOWERING_NEEDS = ("structure", "completeness", "order", "deadlock")


def lower_checked(program: Program, fuse: bool = False, comm_model: str | CommModel = "rendezvous") -> Program:
    """`lower()` of a program the checker passes (`ppdsl expand --comms`): PpsError with the
    checker's errors when it does not, PPS220 when it has sends and receives already.

    The checker calls lowering, not the other way. The unit-time run that lowering places its
    exchanges by is made first (it is kept on the program), so the deadlock rule reads its
    verdict instead of running the engine a second time."""
    refuse_communication(program)
    unit_run(program)
    errors = [d for d in analyse(program, CommModel.RENDEZVOUS, families=LOWERING_NEEDS)[0] if d.is_error]
    if errors:
        raise PpsError(errors)
    return lower(program, fuse, comm_model)


__all__ = ["LOWERING_NEEDS", "RULES", "analyse", "RULE_OF_CODE", "check", "lower_checked"]
