"""`ppdsl expand --fsdp` (ppdsl/shard_actions.py): UNSHARD, RESHARD and REDUCE_GRAD placed for
sharded stages as PyTorch's lowering places them, and what the checker and lowering make of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.check import check, lower_checked
from ppdsl.cli import main
from ppdsl.diagnostics import UsageError
from ppdsl.expansion import parse
from ppdsl.ir import Action, Kind, Program
from ppdsl.shard_actions import add_reduce_actions, add_shard_actions

GENERATORS = ["gpipe()", "1f1b()", "zb1p()", "zbv()", "interleaved_1f1b(virtual=2)", "dualpipev()"]
ROOT = Path(__file__).resolve().parents[2]


def generated(gen: str, ranks: int = 2, microbatches: int = 4) -> Program:
    return parse(f"pipeline ranks={ranks} microbatches={microbatches}\nuse {gen}\n", "g.pps")


def words(program: Program, rank: int) -> list[str]:
    return [str(a) for step in program.rows[rank] for a in (step.parts if hasattr(step, "parts") else (step,))]


@pytest.mark.parametrize("window", [1, 2, 3])
@pytest.mark.parametrize("gen", GENERATORS)
def test_every_generator_sharded_lints_clean_and_lowers_clean(gen: str, window: int) -> None:
    program = generated(gen)
    sharded = add_shard_actions(program, window)
    assert check(sharded) == []
    assert check(lower_checked(sharded)) == []
    for rank in range(program.ranks):
        row = words(sharded, rank)
        for s in program.stages_of(rank):
            # Gathered and freed in pairs; reduced once, right after the stage's last B or W.
            assert row.count(f"{s}UNSHARD") == row.count(f"{s}RESHARD") >= 1
            last = max(i for i, w in enumerate(row) if w.startswith(str(s)) and w[len(str(s))] in "BW"
                       and w[len(str(s)) + 1:].isdigit())
            assert row.count(f"{s}REDUCE_GRAD") == 1 and row.index(f"{s}REDUCE_GRAD") == last + 1


def test_a_window_as_wide_as_the_rank_s_stages_gathers_each_once() -> None:
    sharded = add_shard_actions(generated("zbv()"), 2)
    row = words(sharded, 0)
    assert row[:2] == ["0UNSHARD", "3UNSHARD"] and row.count("0UNSHARD") == row.count("3UNSHARD") == 1
    for stage in (0, 3):  # freed once, after its last use: nothing evicts it before
        used = [i for i, w in enumerate(row) if w.startswith(str(stage)) and "SHARD" not in w]
        assert row.index(f"{stage}RESHARD") > max(used)


def test_the_same_actions_in_the_same_order_as_pytorch_s_lowering() -> None:
    T = pytest.importorskip("torch.distributed.pipelining.schedules")
    kinds = {Kind.F: T.FORWARD, Kind.B: T.FULL_BACKWARD, Kind.I: T.BACKWARD_INPUT, Kind.W: T.BACKWARD_WEIGHT,
             Kind.UNSHARD: T.UNSHARD, Kind.RESHARD: T.RESHARD, Kind.REDUCE_GRAD: T.REDUCE_GRAD}
    compared = 0
    for gen in GENERATORS[:-1]:  # dualpipev's overlapped pairs are torch's OVERLAP_F_B, lowered otherwise there
        for window in (1, 2, 3):
            program = generated(gen, microbatches=4)
            mine = add_shard_actions(program, window)
            for rank, row in enumerate(program.rows):
                compute = [T._Action(a.stage, kinds[a.kind], a.microbatch) for a in row if type(a) is Action]
                theirs = T._add_reduce_grad(T._add_unshard_reshard(compute, window), program.microbatches)
                ours = [T._Action(a.stage, kinds[a.kind], a.microbatch) for a in mine.rows[rank]]
                assert [str(a) for a in ours] == [str(a) for a in theirs], (gen, window, rank)
                compared += 1
    assert compared == 5 * 3 * 2


def test_an_overlapped_pair_gathers_both_its_stages_whatever_the_window() -> None:
    sharded = add_shard_actions(generated("dualpipev()"), 1)
    assert check(sharded) == []


def test_inference_reduces_nothing() -> None:
    program = parse("pipeline ranks=2 microbatches=2 mode=inference\nuse gpipe()\n", "g.pps")
    sharded = add_shard_actions(program)
    assert not [w for r in range(2) for w in words(sharded, r) if "REDUCE_GRAD" in w]
    assert check(sharded) == []


def test_what_it_refuses() -> None:
    with pytest.raises(UsageError, match="between 1 and 1024"):
        add_shard_actions(generated("1f1b()"), 0)
    placed = parse("pipeline ranks=1 microbatches=1\nrank 0: 0UNSHARD 0F0 0B0 0RESHARD\n", "p.pps")
    with pytest.raises(UsageError, match="places sharding actions already \\(`0RESHARD`, `0UNSHARD`\\)"):
        add_shard_actions(placed)


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "zbv_fsdp.pps"
    # docs/cli.md: `ppdsl expand --comms --fsdp --fsdp-window 2 schedules/zbv.pps | ppdsl lint -`
    assert main(["expand", "--comms", "--fsdp", "--fsdp-window", "2", str(ROOT / "schedules" / "zbv.pps"),
                 "-o", str(out)]) == 0
    assert main(["lint", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "with sends and receives and sharding actions" in text and "0REDUCE_GRAD" in text
    capsys.readouterr()
    assert main(["expand", "--fsdp-window", "2", str(ROOT / "schedules" / "zbv.pps")]) == 2
    assert "--fsdp-window needs --fsdp" in capsys.readouterr().err
    assert main(["expand", "--fsdp", str(out)]) == 2
    assert "places sharding actions already" in capsys.readouterr().err


@pytest.mark.parametrize("gen", GENERATORS)
def test_reduce_grad_alone_follows_each_stage_s_last_backward(gen: str) -> None:
    program = generated(gen)
    placed = add_reduce_actions(program)
    assert check(placed) == [] and check(lower_checked(placed)) == []
    for rank in range(program.ranks):
        row = words(placed, rank)
        assert not [w for w in row if "SHARD" in w]
        for s in program.stages_of(rank):
            last = max(i for i, w in enumerate(row) if w.startswith(str(s)) and w[len(str(s))] in "BW"
                       and w[len(str(s)) + 1:].isdigit())
            assert row.count(f"{s}REDUCE_GRAD") == 1 and row.index(f"{s}REDUCE_GRAD") == last + 1
    if gen != "dualpipev()":  # torch's own pass on the compute rows places them alike
        T = pytest.importorskip("torch.distributed.pipelining.schedules")
        for rank, row in enumerate(program.rows):
            theirs = T._add_reduce_grad([T._Action(a.stage, T._ComputationType.from_str(a.kind.name), a.microbatch)
                                         for a in row if type(a) is Action], program.microbatches)
            assert [str(a) for a in theirs] == [str(a) for a in placed.rows[rank]]


def test_reduce_grad_alone_refuses_what_it_cannot_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="no backward"):
        add_reduce_actions(parse("pipeline ranks=2 microbatches=2 mode=inference\nuse gpipe()\n", "g.pps"))
    placed = parse("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0 0REDUCE_GRAD\n", "p.pps")
    with pytest.raises(UsageError, match="places `0REDUCE_GRAD` already"):
        add_reduce_actions(placed)
    out = tmp_path / "zbv_reduce.pps"
    # docs/runtime.md and docs/cli.md: `ppdsl expand --reduce-grad schedules/zbv.pps -o zbv_reduce.pps`
    assert main(["expand", "--reduce-grad", str(ROOT / "schedules" / "zbv.pps"), "-o", str(out)]) == 0
    assert main(["lint", str(out)]) == 0
    assert "with REDUCE_GRAD" in out.read_text(encoding="utf-8")
    capsys.readouterr()
    assert main(["expand", "--reduce-grad", "--fsdp", str(ROOT / "schedules" / "zbv.pps")]) == 2
    assert "give one of --fsdp and --reduce-grad" in capsys.readouterr().err
