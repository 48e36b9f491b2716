"""Data parallelism around the pipeline: 2 pipeline ranks x 2 replicas, real processes on gloo
over loopback. Four paddle processes on a small machine are slow: few steps, small models, and
several schedule files in one launch. Every wait has a timeout (`--timeout`, `subprocess`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.load import load_program

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
PPDSL = str(Path(sys.executable).with_name("ppdsl"))
LAUNCH_SECONDS = 200
paddle = pytest.importorskip("paddle")

sys.path.insert(0, str(HERE))
from procs import generator_files, launcher_env, rank_result, run_together  # noqa: E402


def _files(tmp_path: Path, *generators: str) -> list[str]:
    return generator_files(tmp_path, generators)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_two_by_two_verifies_1f1b_zb1p_zbv_against_the_whole_global_batch(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = _files(tmp_path, "1f1b()", "zb1p()", "zbv()")
    code, out, err = _run(capsys, *files, "--dp", "2", "--steps", "3", "--verify", "--timeout", "30")
    assert code == 0, out + err
    assert "2 ranks x 2 replicas (4 processes)" in out
    for f in files:
        # Every replica's gradients are compared: twice the tensors of one pipeline.
        assert re.search(rf"{re.escape(f)}: verify ok: losses and \d+ gradients over 3 steps", out), out
        assert re.search(rf"{re.escape(f)}: 3 steps, .*verify ok", out), out


@pytest.mark.slow
def test_two_by_two_gpt_example_verifies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = _files(tmp_path, "1f1b()", "zbv()")
    code, out, err = _run(capsys, *files, "--data-parallel", "2", "--steps", "2", "--verify", "--timeout", "30",
                          "--model", str(ROOT / "examples" / "gpt" / "model.py"), "--rtol", "1e-5")
    assert code == 0, out + err
    for f in files:
        assert re.search(rf"{re.escape(f)}: 2 steps, .*verify ok", out), out


@pytest.mark.slow
def test_two_by_two_on_torch_verifies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    files = _files(tmp_path, "zb1p()")
    code, out, err = _run(capsys, *files, "--dp", "2", "--steps", "2", "--verify", "--timeout", "30",
                          "--framework", "torch")
    assert code == 0, out + err
    assert re.search(r"2 steps, .*verify ok", out), out


@pytest.mark.slow
def test_the_replicas_hold_equal_weights_after_three_steps(tmp_path: Path) -> None:
    from ppdsl.runtime.jobs.launcher import launch

    (f,) = _files(tmp_path, "zb1p()")
    outcome = launch([load_program(f)], [f, "3", "2"], steps=0, timeout=30, quiet=True, keep_logs=str(tmp_path),
                     command=[sys.executable, str(HERE / "helpers" / "dp_weights.py")], replicas=2)
    assert outcome.code == 0, outcome.failure
    results = [rank_result(tmp_path, r) for r in range(4)]
    assert [r["replica"] for r in results] == [0, 0, 1, 1]
    for pipeline_rank in (0, 1):
        a, b = results[pipeline_rank]["weights"], results[pipeline_rank + 2]["weights"]
        assert a.keys() == b.keys() and a
        assert all(a[k] == b[k] for k in a), pipeline_rank  # bit for bit: the same mean on both


@pytest.mark.slow
def test_a_killed_rank_ends_all_four_and_is_named(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Global rank 3: replica 1's pipeline rank 1. Its pipeline peer (rank 2) and its
    # data-parallel peer (rank 1) both lose it.
    monkeypatch.setenv("PPDSL_FAULT", "kill:1:2:3")
    t0 = time.monotonic()
    code, out, err = _run(capsys, str(HERE / "schedules" / "2r_1f1b_batched.pps"), "--dp", "2", "--steps", "3",
                          "-q", "--timeout", "5", "--model", f"{HERE / 'helpers' / 'faulty_model.py'}:build_stage")
    assert code == 1
    assert "rank 3 was killed by signal 9 at step 0, action 1F2" in err, err
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_under_paddles_launcher_a_killed_rank_ends_every_rank(tmp_path: Path) -> None:
    env = launcher_env()
    env["PPDSL_FAULT"] = "kill:1:2:3"
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(tmp_path / "logs"),
                           "--nproc_per_node", "4", PPDSL, "run", str(HERE / "schedules" / "2r_1f1b_batched.pps"),
                           "--dp", "2", "--steps", "3", "--timeout", "5",
                           "--model", f"{HERE / 'helpers' / 'faulty_model.py'}:build_stage"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_SECONDS)
    assert done.returncode != 0
    assert time.monotonic() - t0 < 120  # start-up plus at most a few --timeout
    logs = {int(p.suffix[1:]): p.read_text(errors="replace") for p in (tmp_path / "logs").glob("workerlog.*")}
    # Its pipeline peer (rank 2) names it by its global rank, by a lost link or its own timeout;
    # or, when its replica (rank 1) lost it first and told the job, by that report.
    assert re.search(r"rank 2[:,] .*(lost rank 3 while|timed out after 5 s at step 0, .*rank 3\)|"
                     r"stopped because rank 1 failed .*all-reducing with ranks 1, 3)", logs[2]), logs[2][-2000:]


@pytest.mark.slow
def test_under_paddles_launcher_two_nodes_on_loopback_two_by_two_verifies(tmp_path: Path) -> None:
    from ppdsl.runtime.jobs.launcher import free_ports

    (port,) = free_ports(1)
    codes, outputs = run_together([[sys.executable, "-m", "paddle.distributed.launch", "--log_dir",
                                    str(tmp_path / f"node{node}"), "--nnodes", "2", "--master", f"127.0.0.1:{port}",
                                    "--rank", str(node), "--nproc_per_node", "2", PPDSL, "run",
                                    str(HERE / "schedules" / "2r_zb_iw.pps"), "--dp", "2", "--steps", "2", "--verify",
                                    "--timeout", "30"] for node in (0, 1)], tmp_path, LAUNCH_SECONDS)
    logs = ["\n".join(p.read_text(errors="replace") for p in sorted((tmp_path / f"node{n}").glob("workerlog.*")))
            for n in (0, 1)]
    assert codes == [0, 0], "\n".join(o[-1500:] for o in outputs) + logs[0][-2000:]
    assert "verify: ok" in logs[0]  # global rank 0 compares both replicas' gradients
    # The loss is printed by replica 0's last stage (global rank 1, on the first node) only.
    assert re.search(r"step 2/2  loss [0-9.]+", logs[0]) and not re.search(r"step \d/2  loss", logs[1])


@pytest.mark.slow
@pytest.mark.parametrize("nproc", ["2", "3"])
def test_under_paddles_launcher_the_world_must_be_ranks_times_replicas(tmp_path: Path, nproc: str) -> None:
    done = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(tmp_path / "logs"),
                           "--nproc_per_node", nproc, PPDSL, "run", str(HERE / "schedules" / "2r_zb_iw.pps"),
                           "--dp", "2", "--steps", "1", "--timeout", "20"],
                          env=launcher_env(), cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_SECONDS)
    logs = [p.read_text(errors="replace") for p in sorted((tmp_path / "logs").glob("workerlog.*"))]
    assert done.returncode != 0 and len(logs) == int(nproc)
    said = f"needs 2 x 2 = 4 processes, but {nproc} processes were started"
    assert any(said in log for log in logs), logs[0][-2000:]
    for log in logs:  # each rank says it, unless the launcher stopped it first over another's exit
        assert said in log or "SIGTERM" in log, log[-2000:]
        assert not re.search(r"^Traceback", log, re.M) and "step 1/1" not in log


@pytest.mark.slow
def test_under_torchrun_the_world_must_be_ranks_times_replicas(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from ppdsl.runtime.jobs.launcher import free_ports

    (port,) = free_ports(1)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(port), PPDSL, "run", str(HERE / "schedules" / "2r_zb_iw.pps"), "--framework", "torch",
                           "--dp", "2", "--steps", "1", "--timeout", "20"],
                          env=launcher_env(), cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_SECONDS)
    text = done.stdout + done.stderr
    assert done.returncode != 0
    assert "needs 2 x 2 = 4 processes, but 2 processes were started" in text, text[-2000:]
    # torchrun prints its own traceback of the failed children; none comes from ppdsl.
    # No frame of ppdsl's own code (`.../ppdsl/cli/x.py`), wherever the checkout lies (a folder
    # named ppdsl holds torchrun's own frames too: `.../ppdsl/.venv/.../torch/...`).
    assert not re.search(r'File "[^"]*/ppdsl/(?:[a-z_]+/)*[a-z_]+\.py"', text), text[-2000:]


# --- refused before any process starts ---------------------------------------------------

@pytest.mark.parametrize("value, message", [("0", "must be at least 1, not 0"), ("-2", "must be at least 1, not -2"),
                                            ("1.5", "expected a whole number, not `1.5`")])
def test_bad_replica_counts_exit_2(value: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, str(HERE / "schedules" / "2r_zb_iw.pps"), "--dp", value)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_batch_that_does_not_split_over_the_replicas_is_refused_before_any_rank(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = tmp_path / "twelve.py"
    data.write_text("import paddle\n\ndef batches():\n    while True:\n"
                    "        yield paddle.zeros([12, 32]), paddle.zeros([12, 1])\n")
    t0 = time.monotonic()
    code, _, err = _run(capsys, str(HERE / "schedules" / "2r_1f1b_batched.pps"), "--dp", "2",
                        "--data", f"{data}:batches")
    assert code == 2, err
    program = load_program(str(HERE / "schedules" / "2r_1f1b_batched.pps"))
    m = program.microbatches
    assert f"a batch of 12 cannot be split into 2 replicas x {m} microbatches" in err, err
    fits = [n for n in range(1, 13) if 12 % (n * m) == 0]
    assert f"splits for --data-parallel {', '.join(map(str, fits))}" in err
    assert "rank" not in err and time.monotonic() - t0 < 8


# --- fleet's topology ----------------------------------------------------------------------

def test_fleets_topology_gives_the_layout_and_a_different_order_is_refused() -> None:
    from paddle.distributed.fleet.base.topology import CommunicateTopology

    from ppdsl.diagnostics import UsageError
    from ppdsl.runtime.jobs.process_layout import layout_of_fleet

    names = ["data", "pipe", "sharding", "sep", "model"]
    topo = CommunicateTopology(names, [2, 3, 1, 1, 1])
    for rank in range(6):
        lay = layout_of_fleet(topo, rank)
        coord = topo.get_coord(rank)
        assert (lay.pipeline, lay.replicas, lay.pipeline_rank, lay.replica) == (3, 2, coord.pipe, coord.data)
    with pytest.raises(UsageError, match="order the topology's axes with data before pipe"):
        layout_of_fleet(CommunicateTopology(["pipe", "data", "sharding", "sep", "model"], [3, 2, 1, 1, 1]), 1)
    with pytest.raises(UsageError, match="also has model degree 2"):
        layout_of_fleet(CommunicateTopology(names, [2, 1, 1, 1, 2]), 0)


@pytest.mark.slow
def test_the_fleet_example_trains_both_replicas_under_paddles_launcher(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(tmp_path / "logs"),
                           "--nproc_per_node", "4", str(ROOT / "examples" / "fleet_hybrid" / "train.py"), "", "3"],
                          env=launcher_env(), cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_SECONDS)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((tmp_path / "logs").glob("workerlog.*")))
    assert done.returncode == 0, done.stdout[-2000:] + logs[-3000:]
    for replica in (0, 1):
        losses = [float(x) for x in re.findall(rf"replica {replica} step \d/3: loss ([0-9.]+)", logs)]
        assert len(losses) == 3 and losses[-1] < losses[0], logs[-2000:]


def test_the_documented_api_lines_are_the_fleet_examples() -> None:
    doc = (ROOT / "docs" / "runtime.md").read_text()
    section = doc[doc.index("## Data parallelism"):doc.index("\n## ", doc.index("## Data parallelism") + 5)]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, re.S)
    example = (ROOT / "examples" / "fleet_hybrid" / "train.py").read_text()
    for line in filter(None, (x.strip() for x in snippet.splitlines())):
        assert line in example, line
