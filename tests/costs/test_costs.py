"""The cost model: defaults, derivation, per-stage keys, the three sources, located errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl import parse
from ppdsl.cost_sources import resolve
from ppdsl.costs import CostError, CostModel, parse_inline
from ppdsl.profiles import parse_profile, profile_json
from ppdsl.diagnostics import PpsError, UsageError
from ppdsl.ir import Kind

ROWS = "rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1B0 1F1 1B1\n"


def test_defaults_and_derivation() -> None:
    moves = {"OFFLOAD": 0.0, "RELOAD": 0.0, "UNSHARD": 0.0, "REDUCE_GRAD": 0.0}
    assert CostModel().kind_costs() == {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0, "R": 1.0, **moves}
    assert CostModel((("F", 2.0),)).kind_costs() == {"F": 2.0, "B": 4.0, "I": 2.0, "W": 2.0, "R": 2.0, **moves}
    assert CostModel((("B", 3.0),)).kind_costs() == {"F": 1.0, "B": 3.0, "I": 1.5, "W": 1.5, "R": 1.0, **moves}
    # A recompute costs its forward unless given.
    assert CostModel((("F", 2.0), ("R", 1.5), ("OFFLOAD", 0.25))).kind_costs()["R"] == 1.5
    assert CostModel((("B", 3.0), ("W", 1.0))).kind_costs()["I"] == 2.0
    assert CostModel((("I", 2.0), ("W", 0.5))).kind_costs()["B"] == 2.5


def test_per_stage_and_table() -> None:
    table = CostModel((("F", 1.0), ("F_s1", 3.0), ("B_s0", 4.0))).table(2)
    assert table[0][Kind.F] == 1.0 and table[1][Kind.F] == 3.0
    assert table[0][Kind.B] == 4.0 and table[0][Kind.I] == 2.0
    assert table[1][Kind.B] == 6.0 and table[0][Kind.SEND_F] == 0.0  # F_s1=3 makes I=W=3 there


def test_message_and_overlap() -> None:
    m = CostModel((("comm", 0.1), ("bytes", 100.0), ("bandwidth", 50.0)))
    assert m.message_time == pytest.approx(2.1)
    # The default is the sum: ppdsl's runtime runs the two parts of a pair one after the other.
    assert CostModel().pair_time(1.0, 2.0) == 3.0
    assert CostModel((("overlap", 1.0),)).pair_time(1.0, 2.0) == 2.0
    assert CostModel((("overlap", 0.5),)).pair_time(1.0, 2.0) == 2.5


@pytest.mark.parametrize("items, code", [
    ((("Fx", 1.0),), "PPS350"),
    ((("f", 1.0),), "PPS350"),
    ((("F", -1.0),), "PPS351"),
    ((("bandwidth", 0.0),), "PPS351"),
    ((("overlap", 2.0),), "PPS351"),
    ((("bytes", 10.0),), "PPS351"),
    ((("B", 1.0), ("I", 2.0)), "PPS351"),
])
def test_bad_costs(items: tuple[tuple[str, float], ...], code: str) -> None:
    with pytest.raises(CostError) as err:
        CostModel(items).table(2)
    assert err.value.code == code


def test_stage_out_of_range() -> None:
    with pytest.raises(CostError, match="stage 5"):
        CostModel((("F_s5", 1.0),)).table(2)


def test_costs_line_errors_are_located() -> None:
    text = "pipeline ranks=2 microbatches=2\ncosts F=1 Bx=2\n" + ROWS
    with pytest.raises(PpsError) as err:
        resolve(parse(text, "x.pps"))
    d = err.value.diagnostics[0]
    assert (d.code, d.path, d.line, d.column) == ("PPS350", "x.pps", 2, 11)
    text = "pipeline ranks=2 microbatches=2\ncosts F=1 F_s7=2\n" + ROWS
    with pytest.raises(PpsError) as err:
        resolve(parse(text, "x.pps"))
    assert err.value.diagnostics[0].column == 11


def test_inline_and_override_order(tmp_path: Path) -> None:
    program = parse("pipeline ranks=2 microbatches=2\ncosts F=2 comm=1\n" + ROWS, "x.pps")
    assert resolve(program).kind_costs()["F"] == 2.0
    model = resolve(program, ["F=3", "comm=0.25"])
    assert model.kind_costs()["F"] == 3.0 and model.message_time == 0.25
    assert parse_inline("F=1, B=2 W=1").kind_costs()["I"] == 1.0
    with pytest.raises(UsageError, match="unknown cost"):
        resolve(program, ["Q=1"])
    with pytest.raises(UsageError, match="number"):
        resolve(program, ["F=abc"])


def test_profile_aggregates_measured_actions(tmp_path: Path) -> None:
    text = profile_json({"W": 0.5}, unit="ms", actions=[
        {"rank": 0, "stage": 0, "kind": "F", "microbatch": 0, "duration": 1.0},
        {"rank": 0, "stage": 0, "kind": "F", "microbatch": 1, "duration": 3.0},
        {"rank": 0, "stage": 0, "kind": "F", "microbatch": 2, "duration": 1.2},
        {"rank": 1, "stage": 1, "kind": "B", "microbatch": 0, "duration": 4.0},
        {"rank": 1, "stage": 1, "kind": "SEND_B", "microbatch": 0, "duration": 0.2},
    ])
    model = parse_profile(text)
    assert model.unit == "ms"
    assert model.table(2)[0][Kind.F] == pytest.approx(5.2 / 3)  # the mean: a step is a sum of actions
    assert model.table(2)[1][Kind.B] == 4.0 and model.message_time == 0.2
    assert model.measured_comm  # message times measured on explicit sends and receives
    assert model.kind_costs()["W"] == 0.5
    path = tmp_path / "p.json"
    path.write_text(text)
    program = parse("pipeline ranks=2 microbatches=2\n" + ROWS, "x.pps")
    assert resolve(program, [str(path)]).unit == "ms"


@pytest.mark.parametrize("data, key, code, words", [
    ("[1]", None, "PPS352", "a cost profile is a JSON object"),
    ('{"ppdsl_profile": 2}', "ppdsl_profile", "PPS352", "`ppdsl_profile` must be 1, not 2"),
    ('{"ppdsl_profile": true}', "ppdsl_profile", "PPS352", "`ppdsl_profile` must be 1, not true"),
    ('{"ppdsl_profile": 1, "costz": {}}', "costz", "PPS352", "unknown profile key `costz`"),
    ('{"ppdsl_profile": 1,\n "costs": {"F": "fast"}}', "F", "PPS351", 'cost `F` must be a number, not "fast"'),
    ('{"ppdsl_profile": 1, "actions": [{"kind": "Q", "duration": 1}]}', "kind", "PPS352", 'actions[0]: unknown kind "Q"'),
    ('{"ppdsl_profile": 1, "unit": "min"}', "unit", "PPS352", 'unknown time unit "min"'),
])
def test_bad_profiles_are_located(tmp_path: Path, data: str, key: str | None, code: str, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(data)
    program = parse("pipeline ranks=2 microbatches=2\n" + ROWS, "x.pps")
    with pytest.raises(PpsError) as err:
        resolve(program, [str(path)])
    d = err.value.diagnostics[0]
    assert (d.code, d.path) == (code, str(path)) and words in d.message
    # At the offending key (the whole document when it is not an object).
    lines = data.splitlines()
    line = 1 if key is None else next(n for n, text in enumerate(lines, 1) if f'"{key}"' in text)
    column = 1 if key is None else lines[line - 1].index(f'"{key}"') + 1
    assert (d.line, d.column) == (line, column)


def test_profile_json_round_trip() -> None:
    data = json.loads(profile_json({"F": 1.0}))
    assert data == {"ppdsl_profile": 1, "unit": "unit", "costs": {"F": 1.0}}


def test_a_b_made_of_per_stage_i_and_w_is_not_shared_out_again() -> None:
    # A profile of a split run gives I and W per stage; a schedule of full backwards on a
    # rank of two stages costs each B as that stage's I + W, not half of it.
    model = CostModel((("F_s0", 4.0), ("I_s0", 3.0), ("W_s0", 1.0), ("F_s1", 2.0), ("I", 6.0), ("W", 2.0)))
    table = model.table(2, [2, 2])
    assert [table[0][Kind.F], table[0][Kind.B]] == [4.0, 4.0]
    # Stage 1's I and W are the rank's whole share: halved, and its B is their sum.
    assert [table[1][Kind.I], table[1][Kind.W], table[1][Kind.B]] == [3.0, 1.0, 4.0]


@pytest.mark.parametrize("typed", ["F=1e400", "B=-inf", "W=nan"])
def test_a_cost_past_floats_is_told_as_typed(typed: str) -> None:

    with pytest.raises(CostError) as err:
        parse_inline(f"F=1,{typed}")
    assert err.value.message == f"cost `{typed}` must be a finite number >= 0"
