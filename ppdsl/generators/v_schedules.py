"""Controllable-memory V schedules (Qi et al., Pipeline Parallelism with Controllable Memory, 2024).

Two stages per rank in a V (rank r holds r and 2p-1-r), backward split into `I` and `W`.
The paper builds each schedule from a repeating building block: in every period of 6 unit
slots rank i runs the forward of its first chunk, the forward of its second, the backward of
the second and the backward of the first at fixed offsets, and the offsets set how long each
activation lives, hence the peak memory: V-Half (p+2)//2 and V-Min (p+4)//3 microbatches of
a whole rank's layers (1F1B: p). We lay the block out on a grid of unit slots, put each `W`
in the first free slot after its `I`, then squeeze as the paper does (sec. 4.2): the warm-up
and the cool-down move every action to the earliest free slot its inputs allow without
raising the rank's peak, once with the `W`s in place and once (cool-down only) with them
taken out and put back. The rows are each rank's actions in slot order.

The result is priced against the list scheduler of `greedy.py` under the same budget (the
previous construction) and the shorter one is kept, so `v_half`/`v_min` never get worse.
Makespans at unit cost per chunk match the paper's authors' own generators on (4,8) (4,16)
(8,16) (8,32): V-Half 53, 101, 113, 209 and V-Min 59, 107, 123, 219
(tests/generators/test_figures.py).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping

from ..ir import Kind, Program, Step, make_action
from ..memory import peak_stage_activations
from ..placement import v_shape
from ..semantics import Timing, execute
from . import greedy
from .registry import ArgValue, Built, GeneratorSpec, every_slot

# The squeeze tries each earlier free slot of a warm-up or cool-down action and prices the
# rank's whole grid each time: work that grows with ranks x slots x grid. Past this many grid
# cells visited (about a second) it stops, and the list scheduler's rows, made under the same
# budget, are kept: a large V is still a V-Half/V-Min within its memory, built in bounded time.
SQUEEZE_WORK = 4_000_000


class _TooMuchWork(Exception):
    pass


PERIOD = 6  # slots per microbatch in the building block: F, F, I, I, W, W of one chunk each
Offsets = tuple[int, int, int, int]  # first-chunk F, second-chunk F, second-chunk I, first-chunk I
_F, _I, _W = 0, 1, 2  # slot kinds on the grid


def half_budget(ranks: int) -> int:
    """V-Half's peak in chunk activations: (p+2)//2 microbatches of two chunks."""
    return 2 * ((ranks + 2) // 2)


def min_budget(ranks: int) -> int:
    """V-Min's peak in chunk activations: (p+4)//3 microbatches of two chunks."""
    return 2 * ((ranks + 4) // 3)


def half_block(p: int) -> list[Offsets]:
    """V-Half's offsets (the paper's fig. 5); an even p needs 3 slots of slack mid-block."""
    gap = 3 if p % 2 == 0 else 0
    return [(2 * i, 3 * p - i - 2, 3 * p + gap + 2 * i - 1, 6 * p + gap - i - 2) for i in range(p)]


def min_block(p: int) -> list[Offsets]:
    """V-Min's offsets; p a multiple of 3 needs 2 slots of slack."""
    gap = 2 if p % 3 == 0 else 0
    return [(i, 2 * p - i - 1, 2 * p + gap + i, 4 * p + gap - i - 1) for i in range(p)]


# A grid cell: (stage, kind, microbatch); a rank's grid maps slot -> cell.
Cell = tuple[int, int, int]
Grid = dict[int, Cell]


def _with_w(grid: Grid) -> Grid:
    """Each `W` in the first free slot after its `I` (oldest first), the rest at the end."""
    out: Grid = {}
    waiting: deque[Cell] = deque()
    last = max(grid)
    t = 0
    while t <= last or waiting:
        cell = grid.get(t)
        if cell is not None:
            out[t] = cell
            if cell[1] == _I:
                waiting.append((cell[0], _W, cell[2]))
        elif waiting:
            out[t] = waiting.popleft()
        t += 1
    return out


def _peak(grid: Grid) -> int:
    live = peak = 0
    for t in sorted(grid):
        kind = grid[t][1]
        if kind == _F:
            live += 1
            peak = max(peak, live)
        elif kind == _W:
            live -= 1
    return peak


def _laid_out(p: int, m: int, block: list[Offsets]) -> list[Grid]:
    grids = []
    for i, offsets in enumerate(block):
        first, second = i, 2 * p - 1 - i
        grid: Grid = {}
        for mb in range(m):
            for offset, cell in zip(offsets, ((first, _F), (second, _F), (second, _I), (first, _I))):
                grid[offset + PERIOD * mb] = (cell[0], cell[1], mb)
        grids.append(_with_w(grid))
    return grids


def _squeeze(p: int, m: int, grids: list[Grid], with_w: bool, limit: int, work: list[int]) -> list[Grid]:
    """Move warm-up (when `with_w`) and cool-down actions to their earliest free slot that
    keeps every rank's peak within `limit` (the block's own), in slot order. `work` counts
    the grid cells visited; past SQUEEZE_WORK, _TooMuchWork."""
    S = 2 * p
    placement = v_shape(p, S)
    if not with_w:
        grids = [{t: c for t, c in g.items() if c[1] != _W} for g in grids]
    when: dict[Cell, int] = {c: t for g in grids for t, c in g.items()}
    phase = 0  # 0 warm-up (until stage 0's first I), 1 steady (until a last forward), 2 cool-down
    for cell in sorted(when, key=lambda c: (when[c], placement[c[0]], c[1])):
        s, kind, mb = cell
        if phase == 0 and kind == _I and s == 0:
            phase = 1
        if phase == 1:
            if kind == _F and mb == m - 1:
                phase = 2
            continue
        if phase == 0 and not with_w:
            continue
        earliest = -1
        if kind == _F and s > 0:
            earliest = when[(s - 1, _F, mb)]
        elif kind == _I:
            earliest = when[(s, _F, mb)]
            if s < S - 1:
                earliest = max(earliest, when[(s + 1, _I, mb)])
        elif kind == _W:
            earliest = when[(s, _I, mb)]
        if mb > 0:
            earliest = max(earliest, when[(s, kind, mb - 1)])
        grid = grids[placement[s]]
        t = when[cell]
        work[0] += t - earliest
        for u in range(earliest + 1, t):
            if u in grid:
                continue
            work[0] += 2 * len(grid)
            if work[0] > SQUEEZE_WORK:
                raise _TooMuchWork
            del grid[t]
            grid[u] = cell
            if _peak(grid if with_w else _with_w(grid)) <= limit:
                when[cell] = u
                break
            del grid[u]
            grid[t] = cell
    return grids if with_w else [_with_w(g) for g in grids]


def block_rows(p: int, m: int, block: list[Offsets]) -> tuple[tuple[Step, ...], ...]:
    """The squeezed block schedule's rows."""
    if p * PERIOD * (p + m) > SQUEEZE_WORK:  # laying out alone walks every rank's slots
        raise _TooMuchWork
    grids = _laid_out(p, m, block)
    limit = max(_peak(g) for g in grids)
    work = [0]
    grids = _squeeze(p, m, grids, True, limit, work)
    grids = _squeeze(p, m, grids, False, limit, work)
    kinds = (Kind.F, Kind.I, Kind.W)
    return tuple(tuple(make_action(s, kinds[k], mb) for _, (s, k, mb) in sorted(g.items())) for g in grids)


def _priced(p: int, m: int, rows: tuple[tuple[Step, ...], ...]) -> tuple[float, float]:
    """(makespan under unit cost per chunk, peak chunk activations); inf when it cannot finish."""
    program = Program(p, 2 * p, m, v_shape(p, 2 * p), rows)
    run = execute(program, "rendezvous", Timing())
    return (run.makespan if run.completed else math.inf), max(peak_stage_activations(program))


def _builder(block: Callable[[int], list[Offsets]], budget: Callable[[int], int]
             ) -> Callable[[int, int, Mapping[str, ArgValue]], Built]:
    def build(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
        stages = 2 * ranks
        placement = v_shape(ranks, stages)
        greedy_rows = greedy.schedule(ranks, microbatches, placement, [budget(ranks)] * ranks)
        try:
            rows = block_rows(ranks, microbatches, block(ranks))
        except _TooMuchWork:
            return Built(greedy_rows, stages, placement)
        mine, peak = _priced(ranks, microbatches, rows)
        if peak > budget(ranks) or _priced(ranks, microbatches, greedy_rows)[0] < mine:
            rows = greedy_rows
        return Built(rows, stages, placement)
    return build


REFERENCE = "Qi et al., Pipeline Parallelism with Controllable Memory (NeurIPS 2024), sec. 4"

SPECS = (
    GeneratorSpec(
        name="v_half",
        summary="V schedule with about half of 1F1B's activation memory",
        placement="v, 2 stages per rank",
        build=_builder(half_block, half_budget),
        steps=every_slot(3, stages_per_rank=2),
        reference=REFERENCE,
    ),
    GeneratorSpec(
        name="v_min",
        summary="V schedule with about a third of 1F1B's activation memory",
        placement="v, 2 stages per rank",
        build=_builder(min_block, min_budget),
        steps=every_slot(3, stages_per_rank=2),
        reference=REFERENCE,
    ),
)
