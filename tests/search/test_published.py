"""The search against published schedules, its lower bound, and the words it reports them in."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from attrs import evolve

from ppdsl.cli import main
from ppdsl.costs import CostModel
from ppdsl.search.blocks import block_orders
from ppdsl.search.driver import EXACT_MISSING, EXACT_TOO_LARGE, Found, lower_bound, search
from ppdsl.search.gaps import fill_gaps
from ppdsl.search.named import best_fitting, named_results
from ppdsl.search.output import compared, exact_note, finish, header_comment, progress_line
from ppdsl.search.problem import make_problem
from ppdsl.search.replay import peaks, replay

UNIT = CostModel((("overlap", 0.0),))


def _found(p: int, m: int, limit: float, shape: tuple[int, ...] = (1, 2)) -> Found:
    result = search(p, m, UNIT, limit, shape, exact=False)
    assert isinstance(result, Found)
    return finish(result, UNIT)


# The zero-bubble authors' automatic V schedules (sail-sg/zero-bubble-pipeline-parallelism,
# v_auto_schedule.py) at 8 ranks, unit costs, V-Min's limit (p+4)//3 = 4.
@pytest.mark.slow
@pytest.mark.parametrize("microbatches,published", [(16, 59.5), (32, 107.5)])
def test_meets_the_zero_bubble_automatic_v_at_v_mins_limit(microbatches: int, published: float) -> None:
    found = _found(8, microbatches, 4, (2,))
    assert found.makespan <= published and found.peak <= 4
    v_min = best_fitting(named_results(8, microbatches, UNIT), 4)
    assert v_min is not None and v_min.name == "v_min" and v_min.makespan == published + 2
    assert found.lower_bound <= found.makespan


@pytest.mark.slow
def test_blocks_reworked_and_gap_filled_reach_59_5() -> None:
    problem = make_problem(8, 16, 2, 4, UNIT)
    orders, tried = block_orders(problem, 2000, random.Random(0))
    assert tried > 1000 and orders
    t, rows = orders[0]
    assert t == 61.5  # the reworked block alone is V-Min's length
    filled, makespan, priced = fill_gaps(problem, rows, 600)
    assert makespan == replay(problem, filled) == 59.5 and 0 < priced <= 600
    assert max(peaks(problem, filled)) <= 4
    assert sorted(c for r in filled for c in r) == sorted(c for r in rows for c in r)


def test_blocks_are_for_the_v_only() -> None:
    assert block_orders(make_problem(4, 8, 1, 2, UNIT), 100, random.Random(0)) == ([], 0)


def test_gap_filling_never_lengthens_nor_breaks_the_limit() -> None:
    problem = make_problem(4, 8, 2, 2, UNIT)
    orders, _ = block_orders(problem, 2000, random.Random(1))
    for t, rows in orders[:5]:
        filled, makespan, _ = fill_gaps(problem, rows, 200)
        assert makespan <= t and replay(problem, filled) == makespan
        assert max(peaks(problem, filled)) <= 2


# --- the lower bound ------------------------------------------------------------------------

def test_bound_counts_the_warm_up_idle_a_limit_forces() -> None:
    # rank 7 of a V on 8 ranks: first input at 3.5, 48 of work; its first W cannot start
    # before 12, and until then it runs forwards the limit holds (L of its time) and at most
    # 0.5 of gradients: 8.5 - L - 0.5 idle
    assert lower_bound(make_problem(8, 16, 2, 4, UNIT)) == 3.5 + 48 + 4
    assert lower_bound(make_problem(8, 16, 2, 7, UNIT)) == 3.5 + 48 + 1
    assert lower_bound(make_problem(8, 16, 2, 8, UNIT)) == 51.5  # ZB-V's length: no idle forced


@pytest.mark.slow
@pytest.mark.parametrize("p,m,v,limit", [(2, 4, 1, 1), (2, 4, 1, 2), (3, 3, 1, 2), (4, 2, 2, 1), (2, 3, 2, 1)])
def test_bound_is_below_what_the_search_finds(p: int, m: int, v: int, limit: float) -> None:
    found = _found(p, m, limit, (v,))
    assert lower_bound(make_problem(p, m, v, limit, UNIT)) <= found.makespan


@pytest.mark.slow
def test_bound_is_below_the_milps_optimum() -> None:
    pytest.importorskip("scipy")
    from ppdsl.search.exact import solve

    for p, m, v, limit in ((2, 4, 1, 1), (2, 4, 1, 2), (4, 2, 2, 1)):
        problem = make_problem(p, m, v, limit, UNIT)
        answer = solve(problem, 60)
        assert answer is not None and answer.optimal
        assert lower_bound(problem) <= answer.makespan + 1e-9


@pytest.mark.slow
def test_the_worked_example_is_proven_optimal_by_the_bound() -> None:
    found = _found(8, 16, 7, (2,))
    assert found.optimal and found.makespan == found.lower_bound == 52.5


# --- what it says ---------------------------------------------------------------------------

def test_progress_says_how_far_out_of_the_budget() -> None:
    line = progress_line(59.5, 3.14, 1463, 6353, None)
    assert line == "ppdsl search: best makespan 59.5; 1,463 of 6,353 candidates priced (23%); 3.1 s"
    assert progress_line(float("inf"), 1.0, 0, 10, 5).endswith("none yet; 0 of 10 candidates priced (0%); 1.0 of 5 s")


def test_never_zero_percent_shorter() -> None:
    assert compared(25.5, 25.5) == "as short as it"
    assert compared(25.5, 25.50001) == "as short as it"
    assert compared(52.5, 56.5) == "7.1% shorter"


@pytest.mark.slow
def test_header_says_as_short_as_when_it_ties_a_named_one() -> None:
    found = _found(4, 8, 4, (2,))  # zbv's 25.5 meets the bound: nothing shorter exists
    assert found.named is not None and found.makespan == found.named.makespan
    text = header_comment(found, UNIT)
    assert "this one is as short as it" in text and "0.0%" not in text
    assert "proven optimal (meets the lower bound 25.5)" in text


@pytest.mark.slow
def test_says_when_the_milp_would_prove_more() -> None:
    found = evolve(_found(2, 3, 1, (2,)), optimal=False)
    missing = exact_note(evolve(found, exact=EXACT_MISSING))
    assert "pip install 'ppdsl[search]'" in missing and "small enough" in missing
    large = exact_note(evolve(found, exact=EXACT_TOO_LARGE, pairs=36480))
    assert "at most 1,200 ordering binaries" in large and "36,480" in large
    assert exact_note(evolve(found, optimal=True, exact=EXACT_MISSING)) == ""


@pytest.mark.slow
def test_cli_prints_the_bound_and_the_milp_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "f.pps"
    assert main(["search", "--ranks", "8", "--microbatches", "16", "--max-memory", "4", "--stages-per-rank", "2",
                 "--time-limit", "1", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    bound = lower_bound(make_problem(8, 16, 2, 4, UNIT))
    assert f"not proven optimal (lower bound {bound:g})" in captured.out
    assert "takes cases of at most 1,200 ordering binaries" in captured.err
    assert "candidates priced" not in captured.out
