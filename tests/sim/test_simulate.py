"""The simulator against hand-computed timelines and published unit-cost figures."""

from __future__ import annotations

import pytest

from ppdsl import parse
from ppdsl.costs import CostModel, shares_of
from ppdsl.semantics import execute
from ppdsl.simulate import simulate

TWO = "pipeline ranks=2 microbatches=2\n{costs}rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1B0 1F1 1B1\n"


def costs(**kv: float) -> CostModel:
    return CostModel(tuple(kv.items()))


def test_hand_computed_two_ranks() -> None:
    sim = simulate(parse(TWO.format(costs=""), "t.pps"), costs(F=1, B=2))
    # rank 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; rank 0: F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9]
    assert sim.starts == ((0, 1, 4, 7), (1, 2, 4, 5))
    assert sim.ends == ((1, 2, 6, 9), (2, 4, 5, 7))
    assert sim.makespan == 9 and sim.busy == (6, 6)
    assert sim.bubble_ratio == pytest.approx(1 / 3)
    assert sim.peak_memory == (2, 1)
    path = [(p.rank, p.text) for p in sim.critical_path]
    assert path[0] == (0, "0F0") and path[-1] == (0, "0B1")
    assert (1, "1B1") in path


def test_hand_computed_message_time_between_ranks() -> None:
    sim = simulate(parse(TWO.format(costs="costs F=1 B=2 comm=0.5\n"), "t.pps"))
    assert sim.starts == ((0, 1, 5, 8), (1.5, 2.5, 4.5, 5.5))
    assert sim.makespan == 10
    gaps = sum(b.start - a.end for a, b in zip(sim.critical_path, sim.critical_path[1:]))
    assert sum(p.end - p.start for p in sim.critical_path) + gaps == sim.makespan


@pytest.mark.parametrize("generator", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 2), (4, 8), (4, 4), (8, 16), (3, 7)])
def test_published_bubble(generator: str, p: int, m: int) -> None:
    program = parse(f"pipeline ranks={p} microbatches={m}\nuse {generator}()\n", "g.pps")
    for c in (costs(F=1, B=1), costs(F=1, B=2)):
        sim = simulate(program, c)
        assert sim.completed
        assert sim.bubble_ratio == pytest.approx((p - 1) / (m + p - 1))
        tf, tb = c.kind_costs()["F"], c.kind_costs()["B"]
        assert sim.makespan == pytest.approx((m + p - 1) * (tf + tb))


def test_1f1b_memory_against_gpipe() -> None:
    one = simulate(parse("pipeline ranks=4 microbatches=8\nuse 1f1b()\n", "a.pps"))
    gp = simulate(parse("pipeline ranks=4 microbatches=8\nuse gpipe()\n", "b.pps"))
    assert one.peak_memory == (4, 3, 2, 1) and gp.peak_memory == (8, 8, 8, 8)


GROUPED = """pipeline ranks=3 microbatches=2 mode=inference
costs F=1 comm=0.5
rank 0: 0F0 0SEND_F0 0F1 0SEND_F1
rank 1: 1RECV_F0 1F0 <1SEND_F0 1RECV_F1> 1F1 1SEND_F1
rank 2: 2RECV_F0 2F0 2RECV_F1 2F1
"""


def test_grouped_batch_costs_its_longest_member() -> None:
    program = parse(GROUPED, "g.pps")
    grouped = simulate(program, comm_model="grouped")
    # rank 1's batch is posted at 2.5, both peers are posted by then: it ends at 2.5 + 0.5.
    assert grouped.starts[1][2] == 2.5 and grouped.ends[1][2] == 3.0
    assert grouped.makespan == 5.5
    # Member by member (rendezvous), the batch costs the sum: 2.5 + 0.5 + 0.5.
    rendezvous = simulate(program, comm_model="rendezvous")
    assert rendezvous.ends[1][2] == 3.5 and rendezvous.makespan == 6.0


def test_explicit_comms_buffered_vs_rendezvous() -> None:
    text = ("pipeline ranks=2 microbatches=1\ncosts F=1 B=2 comm=0.5\n"
            "rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n")
    program = parse(text, "c.pps")
    r = simulate(program, comm_model="rendezvous")
    # F0 [0,1]; pair [1,1.5]; 1F0 [1.5,2.5]; 1B0 [2.5,4.5]; pair [4.5,5]; 0B0 [5,7]
    assert r.makespan == 7 and r.busy == (3, 3)
    assert r.comm[0] == pytest.approx(0.5 + 3.5)  # the receive sits blocked from 1.5 to 5
    b = simulate(program, comm_model="buffered")
    assert b.makespan == 7 and b.completed


def test_overlap_pair() -> None:
    text = ("pipeline ranks=1 microbatches=2 stages=1\ncosts F=1 B=3 overlap={o}\n"
            "rank 0: 0F0 (0F1;0B0) 0B1\n")
    assert simulate(parse(text.format(o=1), "o.pps")).makespan == 1 + 3 + 3
    assert simulate(parse(text.format(o=0), "o.pps")).makespan == 1 + 4 + 3


def test_stuck_program_reports_what_ran() -> None:
    # Both ranks send before they receive: fine when sends are buffered, stuck under rendezvous.
    text = ("pipeline ranks=2 microbatches=2\n"
            "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
            "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1\n")
    sim = simulate(parse(text, "d.pps"))
    assert not sim.completed and {(w.rank, w.step) for w in sim.waits} == {(0, 3), (1, 3)}
    assert sim.ends[0][2] == 2.0 and sim.ends[0][3] is None
    assert sim.makespan == 4.0  # 1B0 ends at 4; nothing after it runs
    buffered = simulate(parse(text, "d.pps"), comm_model="buffered")
    assert buffered.completed and buffered.makespan == 9.0


def test_agrees_with_semantics_on_generated_schedules() -> None:
    from ppdsl.generators.registry import REGISTRY

    c = costs(F=1, B=2.5, I=1.5, W=1, comm=0.25)
    for name in REGISTRY:  # every generator takes 4 ranks x 8 microbatches with its defaults
        program = parse(f"pipeline ranks=4 microbatches=8\nuse {name}()\n", "x.pps")
        sim = simulate(program, c)
        ex = execute(program, "rendezvous", c.timing(program.stages, shares_of(program)))
        assert sim.completed, name
        assert (sim.starts, sim.ends, sim.makespan) == (ex.starts, ex.ends, ex.makespan), name
        assert 0 <= sim.bubble_ratio < 1
        assert sim.critical_path[-1].end == sim.makespan and sim.critical_path[0].start == 0


def test_stuck_diagnostic_points_at_the_cycle() -> None:
    from ppdsl.simulate import stuck_diagnostic

    text = ("pipeline ranks=2 microbatches=2\n"
            "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
            "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1\n")
    d = stuck_diagnostic(simulate(parse(text, "d.pps")))
    assert (d.code, d.path, d.line, d.column, d.end_column) == ("PPS353", "d.pps", 2, 26, 34)
    assert "rank 0 -> rank 1 -> rank 0" in d.message and len(d.notes) == 2
