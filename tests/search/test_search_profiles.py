"""The search with profiles: the shape a profile measured, several profiles merged, and orders of
unsplit backwards when a measured `B` costs less than its `I` and `W` apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.ir import Kind, actions_of
from ppdsl.load import load_program
from ppdsl.search.driver import Found, search
from ppdsl.search.named import named_results
from ppdsl.costs import parse_inline


def _profile(tmp_path: Path, name: str, stages: int, kinds: dict[str, float]) -> str:
    actions = [{"rank": s % 2, "stage": s, "kind": k, "duration": d * (1 + s % 2)} for s in range(stages)
               for k, d in kinds.items()]
    path = tmp_path / name
    path.write_text(json.dumps({"ppdsl_profile": 1, "unit": "us", "stages": stages, "actions": actions}))
    return str(path)


def test_a_profile_of_loop_stages_searches_the_loop_only_and_says_why(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    profile, out = _profile(tmp_path, "p.json", 2, {"F": 10, "I": 10, "W": 6}), str(tmp_path / "best.pps")
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--costs", profile, "--max-memory", "2",
                 "-o", out]) == 0
    captured = capsys.readouterr()
    assert "the profile measured 2 stages, so V (2 stages a rank) schedules are not searched" in captured.err
    assert load_program(out).stages == 2
    assert "best named generator zbv" not in captured.out
    # Asked for, the V is searched on the carried-over estimates.
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--costs", profile, "--max-memory", "2",
                 "--stages-per-rank", "2", "-o", out]) == 0
    assert "not searched" not in capsys.readouterr().err and load_program(out).stages == 4


def test_two_profiles_merge_later_keys_winning_and_the_file_names_each_key_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fused = _profile(tmp_path, "p_1f1b.json", 2, {"F": 10, "B": 12})
    split = _profile(tmp_path, "p_zb1p.json", 2, {"F": 11, "I": 10, "W": 6})
    out = str(tmp_path / "best.pps")
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--costs", fused, "--costs", split,
                 "--max-memory", "2", "-o", out]) == 0
    capsys.readouterr()
    costs_line = next(line for line in Path(out).read_text().splitlines() if line.startswith("costs "))
    keys = [item.split("=")[0] for item in costs_line.split()[1:]]
    assert len(keys) == len(set(keys)) and "F_s0=11" in costs_line and "B_s0=12" in costs_line
    # B (12) is cheaper than I + W (16): the shortest is an order of whole backwards.
    program = load_program(out)
    kinds = {a.kind for row in program.rows for step in row for a in actions_of(step)}
    assert Kind.B in kinds and Kind.W not in kinds


def test_profiles_of_different_shapes_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    two = _profile(tmp_path, "p2.json", 2, {"F": 10, "B": 12})
    four = _profile(tmp_path, "p4.json", 4, {"F": 5, "B": 6})
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--costs", two, "--costs", four,
                 "--max-memory", "2"]) == 2
    assert "the profiles measured 2 and 4 stages" in capsys.readouterr().err


@pytest.mark.parametrize("costs", ["F=1,I=1.2,W=0.6,B=1.3", "F=2,I=1,W=1,B=1.5"])
def test_with_a_cheaper_whole_backward_the_search_is_never_longer_than_any_named_schedule(costs: str) -> None:
    model = parse_inline(costs)
    found = search(2, 6, model, 2.0, (1,))
    assert isinstance(found, Found)
    loop = [n for n in named_results(2, 6, model) if n.program.stages == 2 and n.peak <= 2.0 + 1e-9]
    assert loop and found.makespan <= min(n.makespan for n in loop) + 1e-9
    assert found.optimal is (found.makespan <= found.lower_bound * (1 + 1e-4))


def test_when_a_whole_backward_costs_its_parts_only_split_orders_are_searched() -> None:
    found = search(2, 6, parse_inline("F=1,I=1,W=1"), 2.0, (1,))
    assert isinstance(found, Found)
    kinds = {a.kind for row in found.program.rows for step in row for a in actions_of(step)}
    assert Kind.W in kinds  # zero-bubble orders, as before
