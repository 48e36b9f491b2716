"""Sharded stages (FSDP2) driven by the schedule: 2 pipeline ranks x 2 shards, four real
torch processes on gloo over loopback, against the model unsharded and unpipelined. Every
wait has a timeout (`--timeout`, the launcher's)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.diagnostics import UsageError
from ppdsl.load import load_program
from ppdsl.runtime import Layout

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE / "helpers"))
from procs import generator_files, rank_result  # noqa: E402


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _verified(capsys: pytest.CaptureFixture[str], files: list[str], *argv: str) -> str:
    """Run `files` with `argv` under --verify on torch: what it printed, each file verified."""
    pytest.importorskip("torch")
    code, out, err = _run(capsys, *files, "--steps", "2", "--verify", "--framework", "torch", *argv)
    assert code == 0, out + err
    for f in files:
        assert re.search(rf"{re.escape(f)}: 2 steps, .*verify ok", out), out
    return out


@pytest.mark.slow
def test_fsdp_two_by_two_verifies_1f1b_zb1p_zbv_clipped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Clipped by the norm over every shard and rank, as the unpipelined model is (compared).
    files = generator_files(tmp_path, ("1f1b()", "zb1p()", "zbv()"))
    out = _verified(capsys, files, "--fsdp", "2", "--timeout", "60", "--clip-grad-norm", "0.05")
    assert "2 ranks x 2 shards (4 processes)" in out


@pytest.mark.slow
def test_fsdp_with_data_parallel_is_hsdp_and_verifies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = _verified(capsys, generator_files(tmp_path, ("zb1p()",)), "--fsdp", "2", "--dp", "2", "--timeout", "90")
    assert "2 ranks x 2 replicas x 2 shards (8 processes)" in out


@pytest.mark.slow
def test_fsdp_gpt_example_verifies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _verified(capsys, generator_files(tmp_path, ("1f1b()",)), "--fsdp", "2", "--timeout", "60", "--rtol", "1e-5",
              "--model", str(ROOT / "examples" / "torch" / "gpt" / "model.py"))


@pytest.mark.slow
@pytest.mark.parametrize("generator", ["1f1b", "zbv"])
def test_the_api_reduces_each_stage_once_a_step_and_is_exact(generator: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from ppdsl.runtime.jobs.launcher import launch

    count = tmp_path / "count.pps"  # four processes: the launcher counts them from a 4-rank file
    count.write_text("pipeline ranks=4 microbatches=4\nuse 1f1b()\n")
    outcome = launch([load_program(str(count))], [generator], steps=0, timeout=90, quiet=True,
                     keep_logs=str(tmp_path), command=[sys.executable, str(HERE / "helpers" / "fsdp_api.py")])
    assert outcome.code == 0, outcome.failure
    for rank in range(4):
        record = rank_result(tmp_path, rank)
        assert record["worst"] <= 1e-12, (rank, record)
        # One reduce-scatter per stage and step (FSDP's own sync would make one per microbatch).
        assert record["reduce_scatters"] == [record["stages"]] * 2, (rank, record)


def test_fsdp_on_paddle_is_refused_before_any_process(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = generator_files(tmp_path, ("1f1b()",))
    code, out, err = _run(capsys, *files, "--fsdp", "2", "--framework", "paddle")
    assert code == 2
    assert "Paddle's sharding (group_sharded_parallel) runs on GPU, XPU and custom devices" in err
    assert "--framework torch" in err


@pytest.mark.slow
def test_fsdp_profile_measures_the_sharding_actions_and_simulates_the_sharded_program(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from ppdsl.profiles import parse_profile

    f = tmp_path / "one.pps"
    f.write_text("pipeline ranks=1 microbatches=4\nuse gpipe()\n")
    profile = tmp_path / "p.json"
    code, out, err = _run(capsys, str(f), "--fsdp", "2", "--framework", "torch", "--steps", "4",
                          "--profile", str(profile), "--timeout", "60")
    assert code == 0, out + err
    measured = parse_profile(profile.read_text())
    costs = dict(measured.items)
    # The gather and the reduce-scatter measured per stage (RESHARD costs nothing), as run:
    # inline on the rank's thread, so the simulator puts them there too.
    assert costs["UNSHARD_s0"] > 0 and costs["REDUCE_GRAD_s0"] > 0 and costs["copy_lane"] == 0
    assert not [k for k in costs if k.startswith("RESHARD")]
    # The comparison simulates the program the run placed its sharding actions in.
    shown = re.search(rf"ppdsl expand --fsdp {re.escape(str(f))} \| ppdsl simulate - --costs {re.escape(str(profile))}"
                      r" --comm-model buffered: makespan [\d.]+ us vs measured step \d+ us \(([-+][\d.]+)%\)", out)
    assert shown, out
    # The whole weights, gathered from UNSHARD to RESHARD, are weights, not activations: the
    # profile gives their bytes apart, and the memory model's peak is what each rank held.
    assert measured.sizes is not None and measured.sizes.gathered[0] > 0
    memories = json.loads(profile.read_text())["memory"]
    for m in memories:
        held = m["peak_bytes"] + m["state_bytes"]
        assert abs(held - m["predicted_bytes"]) <= 0.02 * m["predicted_bytes"], m
    # Each rank's state is its shard's: the shards' weights and gradients (SGD keeps no state)
    # add up to the whole weights' twice.
    assert sum(m["state_bytes"] for m in memories) == 2 * measured.sizes.gathered[0], memories


def test_fsdp_profile_with_replicas_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = generator_files(tmp_path, ("1f1b()",))
    code, _, err = _run(capsys, *files, "--fsdp", "2", "--dp", "2", "--framework", "torch",
                        "--profile", str(tmp_path / "p.json"))
    assert code == 2
    assert "--profile measures one pipeline" in err


def test_a_layout_of_shards_places_each_rank_and_its_mesh() -> None:
    # 2 pipeline ranks x 2 copies x 2 shards: global rank = (copy * 2 + shard) * 2 + pipeline rank.
    layout = Layout(pipeline=2, replicas=4, rank=5, shards=2)
    assert (layout.pipeline_rank, layout.replica, layout.world, layout.sharded) == (1, 2, 8, True)
    assert layout.shard_mesh() == [[1, 3], [5, 7]]
    assert layout.shard_mesh(0) == [[0, 2], [4, 6]]
    assert layout.share(16) == (8, 12)  # each shard trains on its own share
    with pytest.raises(UsageError, match="cannot be cut into sharding groups of 2"):
        Layout(pipeline=2, replicas=3, rank=0, shards=2)


def test_a_sharded_layout_with_stages_held_whole_is_refused() -> None:
    torch = pytest.importorskip("torch")
    from ppdsl.expansion import parse
    from ppdsl.runtime import PipelineSchedule, SetupError

    program = parse("pipeline ranks=1 microbatches=2\nuse 1f1b()\n", "<x>")
    with pytest.raises(SetupError, match="stage 0 holds its weights whole: wrap each stage layer with fully_shard"):
        PipelineSchedule(program, [torch.nn.Linear(2, 2)], lambda y, t: (y - t).sum(), framework="torch",
                         layout=Layout(pipeline=1, replicas=2, rank=0, shards=2))


def test_a_partly_sharded_stage_is_refused_and_mixed_precision_keeps_w_in_i(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import json
    import os
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    done = subprocess.run([sys.executable, str(HERE / "helpers" / "fsdp_checks.py")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    assert "stage 0: its module '0' is wrapped with fully_shard but the stage layer is not" in record["partly"]
    assert "with mixed precision (param_dtype torch.bfloat16, reduce_dtype torch.float32)" in record["mixed"]
    assert record["plain"] == ""  # under FSDP2 in full precision the weight gradient waits for W
