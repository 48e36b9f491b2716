"""The sharding collectives priced: `UNSHARD` (a stage's all-gather) and `REDUCE_GRAD` (its
gradient reduction) run on the copy lane beside the computes; the stage's next compute waits
for its gather, and the step ends when the last reduction does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.costs import CostError, CostModel
from ppdsl.load import parse as parse_text
from ppdsl.shard_actions import add_shard_actions
from ppdsl.simulate import simulate

ONE_F_ONE_B = "pipeline ranks=2 microbatches=4\nuse 1f1b()\n"
ZBV = "pipeline ranks=4 microbatches=8\nuse zbv()\n"


def sharded(text: str, window: int = 3) -> object:
    return add_shard_actions(parse_text(text), window)


def test_free_collectives_change_nothing() -> None:
    for text in (ONE_F_ONE_B, ZBV):
        plain = simulate(parse_text(text), "F=1,B=2,I=1,W=1")
        assert simulate(sharded(text), "F=1,B=2,I=1,W=1").makespan == plain.makespan


def test_the_first_gather_and_the_last_reduction_are_exposed_in_1f1b() -> None:
    plain = simulate(parse_text(ONE_F_ONE_B), "F=1,B=2").makespan
    sim = simulate(sharded(ONE_F_ONE_B), "F=1,B=2,UNSHARD=3,REDUCE_GRAD=2")
    # Each rank holds one stage: gathered once, before its first forward; rank 0's reduction
    # starts when its last backward ends the step's compute.
    assert sim.makespan == plain + 3 + 2
    assert sim.busy == simulate(parse_text(ONE_F_ONE_B), "F=1,B=2").busy  # the lane's time is no compute's
    assert sim.copy == (5.0, 5.0)
    path = [s.text for s in sim.critical_path]
    assert path[0] == "0UNSHARD" and path[-1] == "0REDUCE_GRAD"
    assert sum(s.end - s.start for s in sim.critical_path) == pytest.approx(sim.makespan)


def test_a_window_that_gathers_ahead_hides_the_gathers() -> None:
    costs = "F=1,B=2,I=1,W=1,UNSHARD=1.5,REDUCE_GRAD=1"
    ahead, each_time = simulate(sharded(ZBV, 3), costs), simulate(sharded(ZBV, 1), costs)
    # Window 1 gathers a stage when it is needed, each time the rank switches stages: exposed.
    assert ahead.makespan < each_time.makespan
    plain = simulate(parse_text(ZBV), costs).makespan
    # Ahead: at most the first gathers of a rank's two stages and its two reductions show.
    assert plain < ahead.makespan <= plain + 2 * 1.5 + 2 * 1


def test_without_a_copy_lane_the_rank_runs_the_collectives_itself() -> None:
    costs = "F=1,B=2,I=1,W=1,UNSHARD=1.5,REDUCE_GRAD=1"
    beside = simulate(sharded(ZBV, 3), costs)
    inline = simulate(sharded(ZBV, 3), costs + ",copy_lane=0")
    assert inline.makespan > beside.makespan
    assert inline.copy == beside.copy  # the same work, now between the computes


def test_the_keys_per_stage_and_their_spelling() -> None:
    sim = simulate(sharded(ONE_F_ONE_B), "F=1,B=2,UNSHARD_s1=4")
    assert sim.copy == (0.0, 4.0)
    with pytest.raises(CostError, match="unknown cost `unshard`") as refused:
        CostModel({"unshard": 1.0})
    assert "did you mean `UNSHARD`?" in (refused.value.help or "")


def test_simulate_names_the_collectives_in_its_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.pps"
    assert main(["expand", "--fsdp", "-o", str(f), str(_write(tmp_path, ONE_F_ONE_B))]) == 0
    assert main(["simulate", str(f), "--costs", "F=1,B=2,UNSHARD=3,REDUCE_GRAD=2"]) == 0
    out = capsys.readouterr().out
    assert "costs: F=1 B=2 UNSHARD=3 REDUCE_GRAD=2 comm=0" in out
    assert "copy: the time each rank's copy lane runs the sharding collectives (UNSHARD, REDUCE_GRAD), " \
           "beside its computes" in out
    assert main(["simulate", str(f), "--costs", "F=1,B=2,UNSHARD=3", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["makespan"] == 18


def _write(folder: Path, text: str) -> Path:
    f = folder / "plain.pps"
    f.write_text(text)
    return f


def test_a_sharded_stage_s_whole_weights_count_from_unshard_to_reshard() -> None:
    from ppdsl import memory
    from ppdsl.encoding import encode
    from ppdsl.profiles import parse_profile

    # Activation 100 a microbatch, whole weights 500 gathered: UNSHARD (500), F0 (600), F1
    # (700), RESHARD (200), UNSHARD (700), B0 (600), B1 (500), RESHARD (0).
    program = parse_text("pipeline ranks=1 microbatches=2\n"
                    "rank 0: 0UNSHARD 0F0 0F1 0RESHARD 0UNSHARD 0B0 0B1 0RESHARD\n", "s.pps")
    sizes = memory.Sizes([100.0], [0.0], [50.0], gathered=[500.0])
    assert memory.profile(program, [100.0], [0.0], gathered=[500.0]).live_after == (
        (500.0, 600.0, 700.0, 200.0, 700.0, 600.0, 500.0, 0.0),)
    assert memory.peak_bytes(program, sizes).peak == (750.0,)  # state + 700
    assert memory.peaks_from_codes(encode(program), [100.0], kept=[0.0], gathered=[500.0]) == [(700.0, 2)]
    # Without the gathered size, the weights count nothing (as before a profile measured them).
    assert memory.peak_bytes(program, memory.Sizes([100.0], [0.0], [50.0])).peak == (250.0,)
    assert memory.Sizes([100.0], [0.0], [0.0], gathered=[500.0]).for_stages(2).gathered == (250.0, 250.0)
    # A profile carries them as `sizes.gathered`; `lint --max-memory` reads the same model.
    text = ('{"ppdsl_profile": 1, "sizes": {"activation": [100], "kept": [0], "state": [50], '
            '"gathered": [500]}}')
    assert parse_profile(text).sizes == sizes
    with pytest.raises(ValueError, match="gathered and activation"):
        memory.Sizes([100.0], [0.0], [0.0], gathered=[1.0, 2.0])


def test_lint_in_bytes_names_the_gathered_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.pps"
    f.write_text("pipeline ranks=1 microbatches=2\nrank 0: 0UNSHARD 0F0 0F1 0RESHARD 0UNSHARD 0B0 0B1 0RESHARD\n")
    p = tmp_path / "p.json"
    p.write_text('{"ppdsl_profile": 1, "sizes": {"activation": [100], "kept": [0], "state": [50], "gathered": [500]}}')
    assert main(["lint", str(f), "--max-memory", "750B", "--costs", str(p)]) == 0
    capsys.readouterr()
    assert main(["lint", str(f), "--max-memory", "749B", "--costs", str(p)]) == 1
    out = capsys.readouterr().out
    assert "rank 0 holds 750 B at step 2" in out and "of activations and gathered weights" in out, out
    assert "gather fewer stages at once (RESHARD earlier)" in out
