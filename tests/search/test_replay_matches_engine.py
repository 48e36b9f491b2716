"""The search prices orders with its own replay (`search.replay`), in its own layout of codes;
the engine (`ppdsl.simulate`) is the rule. On random orders, valid and not, the two agree:
the replay finishes exactly when the engine completes, with the engine's makespan and its
per-rank peak memory."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdsl.costs import parse_inline
from ppdsl.search.driver import to_program
from ppdsl.search.problem import Problem, make_problem
from ppdsl.search.replay import peaks, replay
from ppdsl.search.slots import sm_and_slot
from ppdsl.simulate import simulate

COSTS = st.sampled_from([0.5, 1.0, 1.25, 2.0, 3.0])


@st.composite
def problems(draw: st.DrawFn) -> tuple[Problem, str]:
    ranks = draw(st.integers(1, 4))
    microbatches = draw(st.integers(1, 4))
    stages_per_rank = draw(st.sampled_from([1, 2]))
    split = draw(st.booleans())
    text = (f"F={draw(COSTS)},B={draw(COSTS)},I={draw(COSTS)},W={draw(COSTS)},"
            f"comm={draw(st.sampled_from([0.0, 0.25, 1.0]))}")
    return make_problem(ranks, microbatches, stages_per_rank, 100.0, parse_inline(text), split), text


def _rank_of(problem: Problem, c: int) -> int:
    return problem.placement[sm_and_slot(c)[0] // problem.microbatches]


def _codes_by_rank(problem: Problem) -> list[list[int]]:
    """Every action of the problem on its rank's row, in code order."""
    rows: list[list[int]] = [[] for _ in range(problem.ranks)]
    for c in range(problem.tables.done):
        if problem.rules.kind[sm_and_slot(c)[1]] is not None:
            rows[_rank_of(problem, c)].append(c)
    return rows


def _valid_order(problem: Problem, rng: random.Random) -> list[list[int]]:
    """Every action, each put on its rank's row once all it waits for is placed (in random
    order among the ready ones): an order that can finish."""
    tables = problem.tables
    left = [c for row in _codes_by_rank(problem) for c in row]
    placed = {tables.done}
    rows: list[list[int]] = [[] for _ in range(problem.ranks)]
    while left:
        ready = [c for c in left if tables.local[c] in placed and tables.input[c] in placed]
        assert ready, "no action can run: the tables ask for something never made"
        c = rng.choice(ready)
        left.remove(c)
        placed.add(c)
        rows[_rank_of(problem, c)].append(c)
    return rows


def _agree(problem: Problem, text: str, rows: list[list[int]]) -> bool:
    """Asserts the replay and the engine agree on `rows`; whether the rows finish."""
    sim = simulate(to_program(problem, rows, fuse=False), parse_inline(text))
    priced = replay(problem, rows)
    assert (priced is not None) == sim.completed
    if priced is None:
        return False
    assert abs(priced - sim.makespan) <= 1e-9 * max(1.0, sim.makespan)
    for mine, engine in zip(peaks(problem, rows), sim.peak_memory, strict=True):
        assert abs(mine - engine) <= 1e-9
    return True


def test_replay_is_the_engine_on_a_v_with_messages() -> None:
    """The fast subset's case: a split V of 2 ranks with message times, a few valid orders."""
    text = "F=1,B=2,I=1.25,W=0.5,comm=0.25"
    problem = make_problem(2, 3, 2, 100.0, parse_inline(text), True)
    rng = random.Random(3)
    for _ in range(5):
        assert _agree(problem, text, _valid_order(problem, rng))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(problems(), st.randoms(use_true_random=False))
def test_replay_is_the_engine_on_valid_orders(case: tuple[Problem, str], rng: random.Random) -> None:
    problem, text = case
    assert _agree(problem, text, _valid_order(problem, rng))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(problems(), st.randoms(use_true_random=False))
def test_replay_is_the_engine_on_any_order(case: tuple[Problem, str], rng: random.Random) -> None:
    """Shuffled rows mostly cannot finish: the replay says so exactly when the engine does."""
    problem, text = case
    rows = _codes_by_rank(problem)
    for row in rows:
        rng.shuffle(row)
    _agree(problem, text, rows)
