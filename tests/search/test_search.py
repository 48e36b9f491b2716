"""`ppdsl search`: found schedules are sound, within the limit, no longer than the named ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.check import check
from ppdsl.cli import main
from ppdsl.costs import CostModel, parse_inline
from ppdsl.load import load_program
from ppdsl.lower import lower
from ppdsl.search.driver import Found, Infeasible, lower_bound, search
from ppdsl.search.named import best_fitting, named_results
from ppdsl.search.output import finish
from ppdsl.search.problem import make_problem, reshape
from ppdsl.simulate import simulate

UNIT = CostModel((("overlap", 0.0),))


def _search(p: int, m: int, limit: float, costs: CostModel = UNIT, shape: tuple[int, ...] = (1, 2),
            exact: bool = False) -> Found:
    found = search(p, m, costs, limit, shape, exact=exact)
    assert isinstance(found, Found)
    return finish(found, costs)


@pytest.mark.slow
@pytest.mark.parametrize("p,m,limit", [(2, 4, 1), (2, 4, 2), (3, 5, 1.5), (4, 4, 2)])
def test_found_is_sound_within_the_limit_and_no_longer_than_any_named(p: int, m: int, limit: float) -> None:
    found = _search(p, m, limit)
    program = found.program
    assert not [d for d in check(program) if d.is_error]  # the header's memory= included
    assert not [d for d in check(lower(program), "rendezvous") if d.is_error]
    assert found.peak <= limit
    named = best_fitting(named_results(p, m, UNIT), limit)
    if named is not None:
        assert found.makespan <= named.makespan
    assert found.makespan >= found.lower_bound


@pytest.mark.slow
def test_beats_v_half_at_p_minus_1_on_8_ranks() -> None:
    found = _search(8, 16, 7, shape=(2,))
    assert found.named is not None and found.named.name == "v_half"
    assert found.makespan <= 0.99 * found.named.makespan


@pytest.mark.slow
def test_lower_bound_is_met_by_zbv_at_its_memory() -> None:
    found = _search(4, 8, 4, shape=(2,))
    assert found.optimal and found.makespan == lower_bound(make_problem(4, 8, 2, 4, UNIT)) == 25.5


def test_below_one_microbatch_is_infeasible() -> None:
    result = search(4, 8, UNIT, 0.75)
    assert isinstance(result, Infeasible) and result.smallest == 1.0


def test_per_stage_costs_carry_over_between_shapes() -> None:
    loop = parse_inline("F_s0=1.2,F_s3=1.5")
    v = reshape(loop, 4, 8)
    assert v.kind_costs(0)["F"] == pytest.approx(0.6) and v.kind_costs(7)["F"] == pytest.approx(0.75)
    assert v.kind_costs(3)["F"] == pytest.approx(0.5)
    back = reshape(v, 8, 4)
    assert [back.kind_costs(s)["F"] for s in range(4)] == pytest.approx([1.2, 1.0, 1.0, 1.5])


@pytest.mark.slow
def test_uneven_costs_no_longer_than_every_named_generator() -> None:
    costs = parse_inline("F_s0=1.2,I_s0=1.2,W_s0=1.2,F_s3=1.5,I_s3=1.5,W_s3=1.5,comm=0.05,overlap=0")
    found = _search(4, 8, 4, costs)
    named = best_fitting(named_results(4, 8, costs), 4)
    assert named is not None and found.makespan <= named.makespan
    again = simulate(found.program)  # the file's own costs line gives the same time
    assert again.makespan == pytest.approx(found.makespan)


@pytest.mark.slow
def test_deterministic() -> None:
    a = _search(3, 6, 2)
    b = _search(3, 6, 2)
    assert a.program == b.program


# --- the command ---------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_writes_a_file_that_lints_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "found.pps"
    code = main(["search", "--ranks", "2", "--microbatches", "4", "--max-memory", "2", "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    text = out.read_text()
    assert "# makespan " in text and "best named generator within the limit" in text
    assert "wrote" in captured.out
    assert main(["lint", str(out)]) == 0
    program = load_program(str(out))
    assert program.memory_limit == 2 and program.ranks == 2  # the limit in the one unit, as given


@pytest.mark.slow
def test_cli_json_and_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"ppdsl_profile": 1, "unit": "ms", "costs": {"F": 2, "B": 4, "comm": 0.5},
                                   "actions": [{"kind": "F", "stage": 1, "duration": 3.0}]}))
    code = main(["search", "--ranks", "2", "--microbatches", "3", "--max-memory", "2", "--costs", str(profile),
                 "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    assert data["found"] is True and data["peak_memory"] <= 2 and "pipeline ranks=2" in data["schedule"]
    assert "(unit: ms)" in data["schedule"]
    before = profile.read_text()
    assert main(["search", "--ranks", "2", "--microbatches", "3", "--max-memory", "2", "--costs", str(profile),
                 "-o", str(profile)]) == 2
    assert profile.read_text() == before and "refusing to overwrite" in capsys.readouterr().err


def test_cli_infeasible_says_the_smallest_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--ranks", "4", "--microbatches", "8", "--max-memory", "0.5"]) == 1
    assert "smallest feasible limit is 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--ranks", "0", "--microbatches", "8", "--max-memory", "2"],
    ["--ranks", "4", "--microbatches", "8", "--max-memory", "-1"],
    ["--ranks", "4", "--microbatches", "8", "--max-memory", "nan"],
    ["--ranks", "4000", "--microbatches", "4000", "--max-memory", "2"],
    ["--ranks", "4", "--microbatches", "8", "--max-memory", "2", "--time-limit", "0"],
    ["--ranks", "4", "--microbatches", "8", "--max-memory", "2", "--costs", "F=x"],
    ["--ranks", "4", "--microbatches", "8"],
])
def test_cli_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", *argv]) == 2
    assert "Traceback" not in capsys.readouterr().err


class _Clock:
    """A monotonic clock that moves 10 ms each time it is read: the search's time limit and
    progress then fall at the same point of its work on any machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 0.01
        return self.now


def test_time_limit_returns_the_best_so_far_with_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdsl.search import driver

    monkeypatch.setattr(driver, "time", _Clock())
    out = tmp_path / "f.pps"
    code = main(["search", "--ranks", "8", "--microbatches", "32", "--max-memory", "4", "--time-limit", "1.5",
                 "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0
    assert "stopped at the time limit" in out.read_text()
    assert "ppdsl search: best makespan" in captured.err
    assert "candidates priced" in captured.err and " of 1.5 s" in captured.err  # how far, out of what
    assert main(["lint", str(out)]) == 0


# --- in the language -----------------------------------------------------------------------

@pytest.mark.slow
def test_use_search_expands_to_the_found_schedule_cached(tmp_path: Path) -> None:
    from ppdsl.search import use

    f = tmp_path / "s.pps"
    f.write_text("pipeline ranks=2 microbatches=4\ncosts comm=0.05\nuse search(max_memory=1.5, shape=v)\n")
    use._cached.cache_clear()
    program = load_program(str(f))
    assert program.stages == 4 and program.generated is not None and program.generated.name == "search"
    assert not [d for d in check(program) if d.is_error]
    again = load_program(str(f))
    assert again == program and use._cached.cache_info().hits == 1
    found = _search(2, 4, 1.5, parse_inline("comm=0.05,overlap=1"), shape=(2,))
    assert simulate(program).makespan == pytest.approx(found.makespan)


@pytest.mark.parametrize("call,message", [
    ("search()", "needs `max_memory=L`"),
    ("search(max_memory=0.5)", "smallest feasible is 1"),
    ("search(max_memory=2, shape=x)", "must be one of loop, v, auto"),
    ("search(max_memory=2, depth=3)", "has no argument `depth`"),
])
def test_use_search_errors_are_located(tmp_path: Path, call: str, message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.pps"
    f.write_text(f"pipeline ranks=2 microbatches=2\nuse {call}\n")
    assert main(["lint", str(f)]) == 1
    out = capsys.readouterr().out
    assert f"{f}:2:" in out and message in out


def test_use_search_with_per_stage_costs_needs_a_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.pps"
    f.write_text("pipeline ranks=2 microbatches=2\ncosts F_s0=2\nuse search(max_memory=2)\n")
    assert main(["lint", str(f)]) == 1
    assert "shape=loop" in capsys.readouterr().out
    f.write_text("pipeline ranks=2 microbatches=2\ncosts F_s3=2\nuse search(max_memory=2, shape=v)\n")
    assert main(["lint", str(f)]) == 0


# --- the exact MILP (scipy, optional) ------------------------------------------------------

@pytest.mark.slow
def test_milp_proves_a_small_case_optimal() -> None:
    pytest.importorskip("scipy")
    from ppdsl.search.exact import solve

    problem = make_problem(3, 3, 2, 2, UNIT)
    answer = solve(problem, 60)
    assert answer is not None and answer.optimal and answer.rows is not None
    from ppdsl.search.replay import peaks, replay

    assert replay(problem, answer.rows) == pytest.approx(answer.makespan)
    assert max(peaks(problem, answer.rows)) <= 2
    found = _search(3, 3, 2, exact=True)
    assert found.optimal and "exact MILP" in found.method
    assert found.makespan == pytest.approx(answer.makespan)


def test_without_the_milp_the_method_says_heuristic_only() -> None:
    found = search(3, 3, UNIT, 2, exact=False)
    assert isinstance(found, Found) and "MILP" not in found.method


def test_the_search_is_a_generator_like_the_others() -> None:
    # One table for `use` lines; the search runs in the file's context (its costs line) like
    # any generator, and `build` is the same search where the file has no costs line.
    from ppdsl.expansion import GENERATORS, parse
    from ppdsl.generators import registry

    spec = GENERATORS["search"]
    assert set(registry.REGISTRY) < set(GENERATORS)
    header = "pipeline ranks=2 microbatches=4\n"
    plain = parse(header + "use search(max_memory=2)\n")
    costed = parse(header + "costs B=4\nuse search(max_memory=2)\n")
    built = registry.run(spec, registry.Context(2, 4, costs=(("B", 4.0),)), {"max_memory": 2})
    assert built.rows == tuple(costed.rows) and built.placement == costed.placement
    assert spec.build(2, 4, registry.check_arguments(spec, {"max_memory": 2})).rows == tuple(plain.rows)
    inference = registry.run(spec, registry.Context(2, 4, inference=True), {"max_memory": 2})
    assert all(a.kind.name == "F" for row in inference.rows for a in row)
