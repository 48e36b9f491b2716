"""Exact on a model the user brings: the compatibility matrix (`benchmarks/compat_matrix.py`) in
one process, each cell against the unpipelined model; the user's class in torch's
`PipelineStage` and FSDP2 stages across real gloo processes; the guard against lost
gradients; the framework read from types."""

from __future__ import annotations

import re

import sys
from pathlib import Path
from typing import Any

import pytest

from ppdsl.load import load_program
from ppdsl.runtime.framework import installed

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(HERE))
import compat_matrix  # noqa: E402
from procs import rank_result  # noqa: E402

DOC = (ROOT / "docs" / "runtime.md").read_text()
needs_torch = pytest.mark.skipif(not installed("torch"), reason="PyTorch is not installed")
needs_paddle = pytest.mark.skipif(not installed("paddle"), reason="PaddlePaddle is not installed")


CELLS = [pytest.param(framework, schedule, setting, marks=needs)
         for framework, needs in (("torch", needs_torch), ("paddle", needs_paddle))
         for schedule, setting in compat_matrix.cells(framework)]


@pytest.mark.parametrize(("framework", "schedule", "setting"), CELLS)
def test_cell_is_exact_and_leaves_the_modules_as_they_were(framework: str, schedule: str, setting: str) -> None:
    r = compat_matrix.run_cell(framework, schedule, setting)
    assert not r["missing"], f"no gradient: {r['missing']}"
    assert not r["left"], r["left"]
    assert r["worst"] <= compat_matrix.tolerance(setting) and r["loss"] <= compat_matrix.tolerance(setting), r


UNSPLIT = [pytest.param(framework, schedule, setting, marks=needs)
           for framework, settings, needs in (("torch", ("checkpoint", "checkpoint_reentrant", "autocast_bf16"), needs_torch),
                                              ("paddle", ("recompute", "recompute_reentrant"), needs_paddle))
           for setting in settings for schedule in ("zb1p", "zbv")]


@pytest.mark.parametrize(("framework", "schedule", "setting"), UNSPLIT)
def test_without_the_split_backward_too(framework: str, schedule: str, setting: str) -> None:
    """`split_backward=False`: I by the framework's grad with the graph kept, W a second
    backward; where the graph allows only a whole backward (a reentrant checkpoint or
    recompute), I runs it whole and W has nothing left."""
    r = compat_matrix.run_cell(framework, schedule, setting, split_backward=False)
    assert not r["missing"] and not r["left"], r
    assert r["worst"] <= compat_matrix.tolerance(setting) and r["loss"] <= compat_matrix.tolerance(setting), r


@needs_torch
def test_checkpointed_layers_defer_their_weight_gradients_to_w() -> None:
    """Exact is not enough: the recomputed Linears' weight gradients must wait for W."""
    r = compat_matrix.run_cell("torch", "zbv", "checkpoint")
    assert r["paths"] == {0: "split: the weight gradients of 3 Linears deferred to W",
                          1: "split: the weight gradients of 4 Linears deferred to W"}


def _planted_loss(monkeypatch: pytest.MonkeyPatch, where: str) -> Any:
    import torch

    from ppdsl.expansion import parse
    from ppdsl.runtime import PipelineSchedule
    from ppdsl.runtime.interpreter.split_backward import DeferredGrads
    from ppdsl.runtime.torch_backend import split

    if where == "accumulate":  # W runs its work but adds nothing
        monkeypatch.setattr(split, "accumulate_weight_grad", lambda *a: None)
    else:  # I defers nothing
        monkeypatch.setattr(DeferredGrads, "defer", lambda self, *a: None)
    program = parse("pipeline ranks=1 microbatches=2\nuse zb1p()\n", "<t>")
    torch.manual_seed(0)
    stage = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    return PipelineSchedule(program, [stage], lambda y, t: ((y - t) ** 2).mean(), rank=0), torch.randn(4, 4)


@needs_torch
def test_a_used_parameter_without_a_gradient_is_named_with_its_stage_and_action(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdsl.runtime import StepError

    sched, x = _planted_loss(monkeypatch, "accumulate")
    with pytest.raises(StepError) as caught:
        sched.step(x, target=x)
    assert caught.value.action == "0W1"
    assert "stage 0's forward used `0.weight`, `2.weight` but they have no gradient after 0W1" in str(caught.value)
    assert f"\n{caught.value}\n" in DOC  # docs/runtime.md shows this very message


@needs_torch
def test_a_w_that_computes_nothing_for_its_forward_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdsl.runtime import StepError

    sched, x = _planted_loss(monkeypatch, "defer")
    with pytest.raises(StepError, match="0W0 computed no weight gradient, though the forward of stage 0 on microbatch 0"):
        sched.step(x, target=x)


@needs_torch
def test_the_guard_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from ppdsl.expansion import parse
    from ppdsl.runtime import PipelineSchedule
    from ppdsl.runtime.torch_backend import split

    monkeypatch.setattr(split, "accumulate_weight_grad", lambda *a: None)
    stage = torch.nn.Linear(4, 4)
    sched = PipelineSchedule(parse("pipeline ranks=1 microbatches=2\nuse zb1p()\n", "<t>"), [stage],
                             lambda y, t: ((y - t) ** 2).mean(), rank=0, grad_guard=False)
    sched.step(torch.randn(4, 4), target=torch.randn(4, 4))
    assert stage.weight.grad is None and stage.bias.grad is not None  # what the guard is for


@needs_torch
def test_the_framework_is_read_from_the_type_whoever_defined_the_class() -> None:
    import torch

    from ppdsl.runtime.framework import framework_of

    class Mine(torch.nn.Module):
        pass

    assert Mine.__module__ != "torch" and framework_of(Mine()).name == "torch"
    with pytest.raises(TypeError, match="a stage must be a torch.nn.Module or a paddle.nn.Layer, got "
                                        "builtins.object"):
        framework_of(object())


@needs_torch
def test_schedule_from_file_takes_a_users_class_and_a_named_framework(tmp_path: Path) -> None:
    import torch
    from compat_torch_models import Block

    from ppdsl.runtime import ScheduleFromFile

    f = tmp_path / "s.pps"
    f.write_text("pipeline ranks=1 microbatches=2\nuse zb1p()\n")
    for framework in (None, "torch"):
        stage = Block(True, "checkpoint").double()
        sched = ScheduleFromFile(str(f), stage, lambda y, t: ((y - t) ** 2).mean(), framework=framework)
        sched.step(torch.randn(4, 3, 8, dtype=torch.float64), target=torch.randn(4, 3, 8, dtype=torch.float64))
        assert all(p.grad is not None for p in stage.parameters())
    with pytest.raises(TypeError, match="got builtins.str"):
        ScheduleFromFile(str(f), "not a stage", None)


@needs_paddle
def test_schedule_from_file_takes_a_users_paddle_layer(tmp_path: Path) -> None:
    from ppdsl.runtime import ScheduleFromFile

    f = tmp_path / "s.pps"
    f.write_text("pipeline ranks=1 microbatches=4\nuse zb1p()\n")
    stage = compat_matrix.paddle_stages("recompute", 1)[0]  # a user's paddle.nn.Layer subclass
    assert type(stage).__module__ == "compat_matrix"
    x, t = compat_matrix.paddle_data("recompute")
    sched = ScheduleFromFile(str(f), stage, compat_matrix._paddle_loss)
    sched.step(x, target=t)
    assert sched.schedule.fw.name == "paddle"
    assert all(p.grad is not None for p in stage.parameters())


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize(("order", "setting"), [("1f1b()", "own_class"), ("zb1p()", "checkpoint"),
                                                ("zbv()", "checkpoint"), ("zb1p()", "autocast_bf16"),
                                                ("zbv()", "checkpoint_reentrant"), ("interleaved_1f1b()", "checkpoint"),
                                                ("dualpipev()", "autocast_bf16")])
def test_a_users_class_in_torchs_pipeline_stage_across_two_ranks(order: str, setting: str, tmp_path: Path) -> None:
    from ppdsl.runtime.jobs.launcher import launch

    f = tmp_path / "s.pps"
    f.write_text(f"pipeline ranks=2 microbatches=4\nuse {order}\n")
    outcome = launch([load_program(str(f))], [str(f), setting], steps=0, timeout=60, quiet=True,
                     keep_logs=str(tmp_path), command=[sys.executable, str(HERE / "helpers" / "user_model_pair.py")])
    assert outcome.code == 0, outcome.failure
    for rank in (0, 1):
        record = rank_result(tmp_path, rank)
        assert record["left"] == []
        assert record["worst"] <= compat_matrix.tolerance(setting), (rank, record)


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("generator", ["zb1p", "zbv"])
def test_fsdp2_stages_are_exact_with_their_linears_weight_gradients_deferred_to_w(generator: str, tmp_path: Path) -> None:
    from ppdsl.runtime.jobs.launcher import launch

    f = tmp_path / "count.pps"  # two processes: the launcher counts them from a 2-rank file
    f.write_text("pipeline ranks=2 microbatches=4\nuse 1f1b()\n")
    outcome = launch([load_program(str(f))], [generator], steps=0, timeout=60, quiet=True,
                     keep_logs=str(tmp_path), command=[sys.executable, str(HERE / "helpers" / "fsdp_stages.py")])
    assert outcome.code == 0, outcome.failure
    for rank in (0, 1):
        record = rank_result(tmp_path, rank)
        assert record["worst"] <= 1e-12, record
        # The schedule holds FSDP's reduce-scatter until the stage's last W: the split is exact.
        # (zbv's first stage has no output head: 3 Linears; the last 4)
        assert all(re.fullmatch(r"split: the weight gradients of [34] Linears deferred to W", path)
                   for path in record["paths"].values()), record


@needs_torch
@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_as_it_is() -> None:
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert out.count("| exact |") == len(compat_matrix.cells("torch")) and f"all {len(compat_matrix.cells('torch'))} cells exact" in out
    for setting in ("plain", "checkpoint", "autocast_bf16"):
        assert f"    {setting}" in out and "gradients zb1p vs 1f1b 0.0e+00" in out


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_the_documented_matrix_is_the_one_the_tests_run(framework: str) -> None:
    title = "| PyTorch |" if framework == "torch" else "| Paddle |"
    table = DOC[DOC.index(title):].split("\n\n")[0].splitlines()
    assert table[0] == f"{title} {' | '.join(compat_matrix.SCHEDULES)} |"
    rows = [line.strip("| ").split(" | ") for line in table[2:]]
    assert [row[0] for row in rows] == list(compat_matrix.TORCH_SETTINGS if framework == "torch"
                                             else compat_matrix.PADDLE_SETTINGS)
    assert all(row[1:] == ["exact"] * len(compat_matrix.SCHEDULES) for row in rows)


@needs_torch
@pytest.mark.slow
def test_verbose_says_which_path_each_stage_takes(tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "ppdsl", "run", "schedules/zb1p.pps", "--framework", "torch",
                           "--steps", "1", "--verbose"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    line = "ppdsl run: rank 0: stage 0: weight gradients: split: the weight gradients of 2 Linears deferred to W"
    assert line in done.stderr.splitlines() and f"\n{line}\n" in DOC
    assert sum("weight gradients: split:" in x for x in done.stderr.splitlines()) == 4  # one line a rank
