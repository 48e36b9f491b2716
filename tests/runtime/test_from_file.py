"""`ScheduleFromFile` against Paddle's own `ScheduleFThenB`: same model, weights, data, in the
same 2 processes; the losses and every gradient must be identical, step after step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ppdsl.load import load_program

pytest.importorskip("paddle")
HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from procs import rank_result  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("order", ["gpipe()", "1f1b()"])
def test_identical_to_paddles_fthenb(order: str, tmp_path: Path) -> None:
    from ppdsl.runtime.jobs.launcher import launch

    f = tmp_path / "s.pps"
    f.write_text(f"pipeline ranks=2 microbatches=4\nuse {order}\n")
    outcome = launch([load_program(str(f))], [str(f), "2"], steps=0, timeout=60, quiet=True,
                     keep_logs=str(tmp_path), command=[sys.executable, str(HERE / "helpers" / "paddle_api_pair.py")])
    assert outcome.code == 0, outcome.failure
    for rank in (0, 1):
        record = rank_result(tmp_path, rank)
        assert len(record["ppdsl"]) == 2 and record["ppdsl"][0]["grads"]
        assert record["ppdsl"] == record["paddle"]  # losses and gradients, exactly
        if rank == 1:
            assert len(record["ppdsl"][1]["losses"]) == 4
            outputs = record["outputs"]
            assert len(outputs["ppdsl"]) == 16 and outputs["ppdsl"] == outputs["paddle"]


def test_refuses_a_microbatch_count_the_file_does_not_have(tmp_path: Path) -> None:
    from ppdsl.runtime import ScheduleFromFile, SetupError

    f = tmp_path / "s.pps"
    f.write_text("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F1 0B0 0B1\n")
    with pytest.raises(SetupError, match="n_microbatches=4, but the schedule file has microbatches=2"):
        ScheduleFromFile(str(f), [], None, n_microbatches=4)


def test_stages_are_placed_by_their_index_or_by_the_file() -> None:
    from types import SimpleNamespace

    from ppdsl.runtime import SetupError
    from ppdsl.runtime.interpreter.from_file import stage_layers
    from ppdsl.expansion import parse

    program = parse("pipeline ranks=2 microbatches=4\nuse interleaved_1f1b(virtual=2)\n", "<t>")
    assert program.stages_of(1) == (1, 3)
    vpp = [SimpleNamespace(sublayer=f"layer{s}", stage_index=s, num_stages=4) for s in (3, 1)]  # ScheduleVPP's list
    assert stage_layers(vpp, program, 1) == {1: "layer1", 3: "layer3"}
    assert stage_layers(["a", "b"], program, 1) == {1: "a", 3: "b"}  # plain layers, in the file's order
    with pytest.raises(SetupError, match="num_stages=2, but the schedule file has 4 stages"):
        stage_layers(SimpleNamespace(sublayer="x", stage_index=0, num_stages=2), program, 0)
    with pytest.raises(SetupError, match="holds stages \\[1, 3\\] of the schedule file, but got 1 layer"):
        stage_layers(["a"], program, 1)
    with pytest.raises(SetupError, match="not a mix"):
        stage_layers([vpp[0], "b"], program, 1)


def test_one_rank_runs_in_a_plain_process_without_any_group() -> None:
    import paddle

    from ppdsl.runtime import ScheduleFromFile
    from ppdsl.expansion import parse

    program = parse("pipeline ranks=1 microbatches=2 stages=2 placement=[0,0]\n"
                    "rank 0: 0F0 1F0 0F1 1F1 1B0 0B0 1B1 0B1\n", "<t>")
    paddle.seed(0)
    layers = [paddle.nn.Linear(4, 4), paddle.nn.Linear(4, 1)]
    schedule = ScheduleFromFile(program, layers, lambda o, t: ((o - t) ** 2).mean(), n_microbatches=2)
    x, y = paddle.ones([4, 4]), paddle.zeros([4, 1])
    losses: list[object] = []
    out = schedule.step(x, target=y, losses=losses, return_output=True)
    # The same two microbatches through the plain model, gradients summed (Paddle's convention).
    grads = [p.grad.numpy().copy() for layer in layers for p in layer.parameters()]
    for layer in layers:
        layer.clear_gradients(set_to_zero=False)
    for xm, ym in zip(paddle.split(x, 2), paddle.split(y, 2)):
        ((layers[1](layers[0](xm)) - ym) ** 2).mean().backward()
    assert len(losses) == 2 and list(out.shape) == [4, 1]
    assert all((g == p.grad.numpy()).all() for g, p in zip(grads, (p for layer in layers for p in layer.parameters())))


def test_a_world_other_than_the_file_or_the_layout_asks_for_is_refused(tmp_path: Path) -> None:
    import paddle

    from ppdsl.runtime import Layout, ScheduleFromFile, SetupError

    f = tmp_path / "s.pps"
    f.write_text("pipeline ranks=2 microbatches=2\nuse 1f1b()\n")
    layer = paddle.nn.Linear(2, 2)
    # This process alone: the file wants 2 processes, a layout of 2 replicas 4.
    with pytest.raises(SetupError, match=r"ranks=2, so 2 processes should run, but 1 do: in a larger job, pass "
                                         r"layout=Layout\(\.\.\.\)"):
        ScheduleFromFile(str(f), [layer], None)
    with pytest.raises(SetupError, match=r"ranks=2 \(the layout's 2 pipeline ranks x 2\), so 4 processes should run"):
        ScheduleFromFile(str(f), [layer], None, layout=Layout(pipeline=2, replicas=2, rank=1))
