"""Offloads and reloads on the copy lane: beside a rank's computes, in order among themselves;
a backward waits for the reload of its own activations, and the simulator says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.costs import CostError, CostModel
from ppdsl.memory import Sizes
from ppdsl.load import parse as parse_text
from ppdsl.simulate import simulate

# Rank 0 offloads microbatch 0 after its forward and brings it back two forwards later.
EARLY_RELOAD = """pipeline ranks=2 microbatches=3
rank 0: 0F0 0OFFLOAD0 0F1 0RELOAD0 0F2 0B0 0B1 0B2
rank 1: 1F0 1B0 1F1 1B1 1F2 1B2
"""


def test_a_move_runs_beside_the_computes_that_follow_it() -> None:
    plain = simulate(parse_text(EARLY_RELOAD.replace("0OFFLOAD0 ", "").replace("0RELOAD0 ", "")), "F=1,B=2")
    sim = simulate(parse_text(EARLY_RELOAD), "F=1,B=2,OFFLOAD=2,RELOAD=1")
    # The offload (1..3) and the reload (3..4) overlap F1 and F2 and end when B0's gradient
    # arrives from rank 1 (4).
    assert sim.starts[0][:5] == (0.0, 1.0, 1.0, 3.0, 2.0)
    assert sim.ends[0][1] == 3.0 and sim.ends[0][3] == 4.0
    assert sim.makespan == plain.makespan == 12.0
    assert sim.busy == plain.busy  # the copy lane's time is no compute's
    assert sim.copy == (3.0, 0.0)
    assert sim.reload_waits == ()


def test_a_backward_waits_for_its_reload_and_the_report_says_so() -> None:
    sim = simulate(parse_text(EARLY_RELOAD), "F=1,B=2,OFFLOAD=2,RELOAD=6")
    # The reload starts when the lane is free (3) and ends at 9: B0 would have started at 4.
    [wait] = sim.reload_waits
    assert (wait.rank, wait.step, wait.action, wait.reload, wait.waited) == (0, 5, "0B0", "0RELOAD0", 5.0)
    assert sim.starts[0][5] == 9.0 and sim.makespan == 15.0
    # The critical path goes through the copy lane: the offload ahead of the reload on it.
    assert [p.text for p in sim.critical_path][:4] == ["0F0", "0OFFLOAD0", "0RELOAD0", "0B0"]
    assert sim.as_json()["reload_waits"] == [{"rank": 0, "step": 5, "action": "0B0", "reload": "0RELOAD0",
                                             "waited": 5.0}]


def test_the_copies_of_a_rank_run_one_after_another() -> None:
    text = """pipeline ranks=1 microbatches=2
rank 0: 0F0 0OFFLOAD0 0F1 0OFFLOAD1 0RELOAD1 0B1 0RELOAD0 0B0
"""
    sim = simulate(parse_text(text), "F=1,B=2,OFFLOAD=3,RELOAD=1")
    starts, ends = sim.starts[0], sim.ends[0]
    assert (starts[1], ends[1]) == (1.0, 4.0)  # OFFLOAD0
    assert (starts[3], ends[3]) == (4.0, 7.0)  # OFFLOAD1 waits for the lane, not for F1 (1..2)
    assert (starts[4], ends[4]) == (7.0, 8.0)  # RELOAD1
    assert starts[5] == 8.0  # B1 waited for it
    # RELOAD0 is posted when the rank reaches it, after B1 (8..10): B0 waits for it too.
    assert (starts[6], ends[6], starts[7]) == (10.0, 11.0, 11.0)
    assert [(w.action, w.waited) for w in sim.reload_waits] == [("0B1", 6.0), ("0B0", 1.0)]


def test_offload_bandwidth_prices_a_move_from_the_profiles_bytes() -> None:
    sizes = Sizes([4000.0, 1000.0], [0.0, 0.0], [0.0, 0.0])
    costs = CostModel((("F", 1.0), ("offload_bw", 1000.0)), sizes=sizes)
    assert costs.kind_costs(0)["OFFLOAD"] == 4.0 and costs.kind_costs(1)["RELOAD"] == 1.0
    # A time given for the kind wins over the bytes.
    given = CostModel((("offload_bw", 1000.0), ("RELOAD_s0", 0.5)), sizes=sizes)
    assert given.kind_costs(0)["RELOAD"] == 0.5 and given.kind_costs(0)["OFFLOAD"] == 4.0
    # No sizes: nothing to move, so no time.
    assert CostModel((("offload_bw", 1000.0),)).kind_costs(0)["OFFLOAD"] == 0.0
    with pytest.raises(CostError, match="`offload_bw` must be greater than 0"):
        CostModel((("offload_bw", 0.0),))


def test_simulate_reports_the_copy_lane_and_the_late_reloads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "early.pps"
    source.write_text(EARLY_RELOAD, encoding="utf-8")
    assert main(["simulate", str(source), "--costs", "F=1,B=2,OFFLOAD=2,RELOAD=6"]) == 0
    out = capsys.readouterr().out
    assert "rank  busy  comm  idle  copy  peak memory" in out
    assert "reloads late: 1 backward waited 5 in all for a reload: 0B0@r0 waited 5 for 0RELOAD0" in out
    assert main(["simulate", str(source), "--costs", "F=1,B=2,OFFLOAD=2,RELOAD=1", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["copy"] == [3.0, 0.0] and "reload_waits" not in data


def test_pictures_draw_the_copy_lane_under_its_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "early.pps"
    source.write_text(EARLY_RELOAD, encoding="utf-8")
    assert main(["show", str(source), "--costs", "F=1,B=2,OFFLOAD=2,RELOAD=6", "--no-color"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rank0 = next(i for i, line in enumerate(lines) if line.startswith("rank 0"))
    # The computes keep their times (F1 at 1, F2 at 2: no room taken by the copies)...
    assert lines[rank0].startswith("rank 0 |F0  F1  F2  ")
    # ...and the copies are a line of their own, under rank 0's, none under rank 1's.
    assert lines[rank0 + 1].startswith("  copy |    OF0---- RL0-----")
    assert lines[rank0 + 2].startswith("rank 1 |")
    trace = tmp_path / "t.json"
    assert main(["show", str(source), "--costs", "F=1,B=2,OFFLOAD=2,RELOAD=6", "--trace", str(trace)]) == 0
    events = json.loads(trace.read_text(encoding="utf-8"))
    events = events["traceEvents"] if isinstance(events, dict) else events
    moves = [e for e in events if e.get("ph") == "X" and "LOAD" in str(e["name"])]
    assert {e["tid"] for e in moves} == {1} and {e["tid"] for e in events if e.get("name") == "0F1"} == {0}
