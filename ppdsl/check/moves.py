"""The one move that breaks a deadlock, tried and checked (the help of PPS210).

"Let one side receive first" is no help when both sides receive first already. So the help
names a move of one step of a rank on the wait-for cycle: a later step put before the one the
rank is stuck at, the stuck step put after a later one, or, in a stuck batch, the waiting
member put last. Each candidate is the program with that one move, and it is suggested only
when the order, communication and link-order rules find no error in it and, under the same
communication model, it runs to the end or (where no one move does) every rank of the cycle
gets past the wait it was stuck at: the suggestion is a file that lints clean of that
deadlock. Moves of nearby steps are tried first, at most MAX_TRIES of them, and fewer on a
large program (each try runs the engine over the whole program).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence

from attrs import evolve

from ..ir import Action, Batch, Idle, Program, Step
from ..semantics import CommModel, Wait, completes, execute
from . import comms, links, order
from .context import Context

MAX_TRIES = 32
# Steps looked at past the stuck one, on its rank.
WINDOW = 8
# Actions the engine may run over, all tries together (about half a second).
ACTION_BUDGET = 500_000


def breaking_move(program: Program, model: CommModel, cycle: Sequence[Wait]) -> tuple[str, bool] | None:
    """The first checked move that breaks the deadlock of `cycle`, in words, and whether the
    program then runs to the end (a move that only gets every rank of the cycle past its wait
    is kept in case none does: the next lint names the next one)."""
    tries = min(MAX_TRIES, ACTION_BUDGET // max(program.action_count, 1))
    stuck = {(w.rank, w.action) for w in cycle}
    partial: str | None = None
    for _, (rank, row, words) in zip(range(tries), _candidates(program, cycle)):
        rows = tuple(row if r == rank else program.rows[r] for r in range(program.ranks))
        verdict = _verdict(evolve(program, rows=rows, source=None), model, stuck)
        if verdict is _Verdict.COMPLETES:
            return words, True
        if verdict is _Verdict.PAST_THE_CYCLE and partial is None:
            partial = words
    return (partial, False) if partial is not None else None


class _Verdict(enum.Enum):
    BROKEN = "the move breaks another rule, or the ranks still wait where they waited"
    PAST_THE_CYCLE = "every rank of the cycle gets past its wait; a later one may still hang"
    COMPLETES = "runs to the end"


def _candidates(program: Program, cycle: Sequence[Wait]) -> Iterator[tuple[int, tuple[Step, ...], str]]:
    """(rank, its new row, the move in words), nearest moves first, ranks of the cycle in turn."""
    for w in cycle:
        step = program.rows[w.rank][w.step]
        if isinstance(step, Batch) and len(step.parts) > 1 and step.parts[-1] != w.action:
            members = tuple(a for a in step.parts if a != w.action) + (w.action,)
            regrouped = Batch(members)
            yield (w.rank, _replaced(program.rows[w.rank], w.step, regrouped),
                   f"write rank {w.rank}'s `{step}` as `{regrouped}`")
    for distance in range(1, WINDOW + 1):
        for w in cycle:
            row = tuple(program.rows[w.rank])
            later = w.step + distance
            if later >= len(row) or isinstance(row[later], Idle):
                continue
            stuck, other = row[w.step], row[later]
            yield (w.rank, row[:w.step] + (other,) + row[w.step:later] + row[later + 1:],
                   f"put `{other}` before `{stuck}` on rank {w.rank}")
            yield (w.rank, row[:w.step] + row[w.step + 1:later + 1] + (stuck,) + row[later + 1:],
                   f"put `{stuck}` after `{other}` on rank {w.rank}")


def _replaced(row: Sequence[Step], index: int, step: Step) -> tuple[Step, ...]:
    items = tuple(row)
    return items[:index] + (step,) + items[index + 1:]


def _verdict(program: Program, model: CommModel, stuck: set[tuple[int, Action]]) -> _Verdict:
    """What the moved program does. A move keeps every action, so structure and completeness
    stay clean; what it can break (order, pairing, link order) is checked first."""
    ctx = Context(program, model, None, None)
    if any(d.is_error for rule in (order, comms, links) for d in rule.check(ctx)):
        return _Verdict.BROKEN
    if completes(program, model, encoded=ctx.enc):
        return _Verdict.COMPLETES
    waits = execute(program, model, encoded=ctx.enc).waits
    return _Verdict.BROKEN if any((w.rank, w.action) in stuck for w in waits) else _Verdict.PAST_THE_CYCLE
