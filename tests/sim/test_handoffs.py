"""`Simulation.handoffs`: in a compute-only program, each F whose previous stage, and each B or
I whose next stage, is on another rank takes its input by an implicit message."""

from __future__ import annotations

import pytest

from ppdsl.costs import CostModel
from ppdsl.ir import Action, Kind, Program, actions_of
from ppdsl.lower import lower
from ppdsl.simulate import simulate
from ppdsl.expansion import parse

FROM = {Kind.F: -1, Kind.B: 1, Kind.I: 1}  # where each compute kind's input comes from


def _counted(program: Program) -> int:
    placement, count = program.placement, 0
    for row in program.rows:
        for step in row:
            for a in actions_of(step):
                source = a.stage + FROM.get(a.kind, 0) if isinstance(a, Action) else a.stage
                if a.kind in FROM and 0 <= source < program.stages and placement[source] != placement[a.stage]:
                    count += 1
    return count


@pytest.mark.parametrize("generator", ["gpipe(", "1f1b(", "interleaved_1f1b(", "zb1p(", "zbv(", "dualpipev("])
def test_handoffs_are_the_inputs_that_cross_ranks(generator: str) -> None:
    program = parse(f"pipeline ranks=4 microbatches=8\nuse {generator})\n")
    sim = simulate(program, CostModel((("comm", 0.5),)))
    assert sim.handoffs == _counted(program) > 0
    assert sim.handoff_time == pytest.approx(0.5 * sim.handoffs)
    assert sim.as_json()["handoffs"] == sim.handoffs


def test_free_messages_and_explicit_ones_have_no_hand_off_time() -> None:
    program = parse("pipeline ranks=4 microbatches=8\nuse 1f1b()\n")
    assert simulate(program).handoff_time == 0.0
    assert simulate(lower(program), CostModel((("comm", 0.5),))).handoffs == 0


def test_a_stuck_run_counts_only_what_ran() -> None:
    # Rank 0 waits at 0B1 for 1B1, rank 1 at 1F1 for 0F1: only 0F0, 1F0 (a hand-off) and 1B0 run.
    program = parse("pipeline ranks=2 microbatches=2\nrank 0: 0F0 0B1 0F1 0B0\nrank 1: 1F0 1B0 1F1 1B1\n")
    sim = simulate(program, CostModel((("comm", 0.5),)))
    assert not sim.completed and _counted(program) == 4 and sim.handoffs == 1
