"""The named generators as the search's yardstick and its starting points.

`named_results` prices every registered generator at a size under the given costs, with its
peak in the search's unit (a rank's whole share of the model; a V or interleaved stage counts
1/v). `seed_rows` turns those that fit a problem's shape and limit into the search's codes,
so the search starts from the best of them and can only improve on it.
"""

from __future__ import annotations

from attrs import frozen

from ..costs import CostModel, reshape
from ..generators import registry
from ..ir import Action, Kind, Program
from ..simulate import simulate
from ..memory import EPSILON
from .slots import FWD, GRAD, WGT, search_code, sm_and_slot
from .problem import Problem, cuts_of
from .replay import peaks

_MOVES = frozenset((Kind.R, Kind.OFFLOAD, Kind.RELOAD))
# Arguments a generator is tried with besides its defaults (the search's shapes hold <= 2 stages a rank).
VARIANTS: dict[str, tuple[dict[str, object], ...]] = {"interleaved_1f1b": ({"virtual": 2},),
                                                      "looped_bfs": ({"virtual": 2},)}


@frozen
class NamedResult:
    name: str
    program: Program
    makespan: float
    peak: float  # in the search's unit


def named_results(ranks: int, microbatches: int, costs: CostModel, cuts: int | None = None,
                  moves: bool = False) -> list[NamedResult]:
    """Every named generator that accepts this size, priced under `costs` (per-stage keys
    numbering `cuts` stages, see `costs.reshape`), shortest first. A generator whose schedule
    recomputes or moves activations (`pipeoffload`) only with `moves`: a schedule without
    them is measured against its peers."""
    out = []
    if cuts is None:
        cuts = cuts_of(costs, ranks)
        if cuts is None:
            raise ValueError("per-stage costs name a stage past two a rank")
    for spec in registry.REGISTRY.values():
        for args in VARIANTS.get(spec.name, ({},)):
            try:
                built = registry.expand(spec.name, ranks, microbatches, args)
            except registry.GeneratorError:
                continue
            program = Program(ranks, built.stages, microbatches, built.placement, built.rows)
            if not moves and moves_activations(program):
                continue
            sim = simulate(program, reshape(costs, cuts, built.stages))
            if sim.completed:
                out.append(NamedResult(spec.name, program, sim.makespan, max(sim.peak_memory)))
    out.sort(key=lambda n: (n.makespan, n.peak, n.name))
    return out


def moves_activations(program: Program) -> bool:
    """Whether `program` recomputes or moves activations (R, OFFLOAD, RELOAD)."""
    return any(type(a) is Action and a.kind in _MOVES for row in program.rows for a in row)


def best_fitting(results: list[NamedResult], limit: float) -> NamedResult | None:
    """The shortest named schedule whose peak is within `limit`."""
    for n in results:
        if n.peak <= limit + EPSILON:
            return n
    return None


def seed_rows(problem: Problem, results: list[NamedResult]) -> list[tuple[str, list[list[int]]]]:
    """The named schedules that fit `problem` (same placement, within the limit in the
    problem's own memory model, `replay.peaks`), as codes."""
    M = problem.microbatches
    out = []
    for n in results:
        p = n.program
        if p.placement != problem.placement:
            continue
        rows: list[list[int]] = []
        split_seen = unsplit_seen = False
        for row in p.rows:
            codes = []
            for step in row:
                if type(step) is not Action:
                    break
                a = step
                assert a.microbatch is not None
                sm = a.stage * M + a.microbatch
                if a.kind is Kind.F:
                    codes.append(search_code(sm, FWD))
                elif a.kind is Kind.I or a.kind is Kind.B:
                    codes.append(search_code(sm, GRAD))
                    split_seen |= a.kind is Kind.I
                    unsplit_seen |= a.kind is Kind.B
                elif a.kind is Kind.W:
                    codes.append(search_code(sm, WGT))
            else:
                rows.append(codes)
                continue
            break  # a step the search does not model (an overlapped pair): not a seed
        if len(rows) != problem.ranks or (split_seen and unsplit_seen):
            continue
        if not problem.split:
            # Orders of unsplit backwards: each backward where its I (or B) stands, no W.
            rows = [[code for code in row if sm_and_slot(code)[1] != WGT] for row in rows]
        elif unsplit_seen:
            # B = I then W at once: the same order with the weight gradient right after.
            rows = [[c for code in row for c in ((code, code - GRAD + WGT) if sm_and_slot(code)[1] == GRAD else (code,))]
                    for row in rows]
        if max(peaks(problem, rows)) > problem.limit + EPSILON:
            continue
        out.append((n.name, rows))
    return out
