"""`ppdsl run` under Paddle's own launcher: one node, two "nodes" on loopback, a rank that dies.

Paddle 3.3.1 reads `launch ... -m MODULE` as its compatible-mode flag, so the launcher is given
the `ppdsl` console script's path. Every wait has a timeout: the launchers run under
`subprocess.run(timeout=...)`, and `ppdsl run --timeout` bounds each rank's own waits.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppdsl.runtime.jobs.launcher import free_ports

pytest.importorskip("paddle")
HERE = Path(__file__).parent
ROOT = HERE.parents[1]
PPDSL = str(Path(sys.executable).with_name("ppdsl"))
LAUNCH_SECONDS = 150


sys.path.insert(0, str(HERE))
from procs import launcher_env as _env  # noqa: E402
from procs import local_progress, progress_lines, run_together  # noqa: E402


def _launcher(log_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(log_dir), *args]


def _logs(log_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("workerlog.*")))


def test_the_package_folder_runs_as_a_script(tmp_path: Path) -> None:
    # What Paddle 3.3.1's launcher makes of `-m ppdsl`: `python ppdsl ...`, no package context.
    done = subprocess.run([sys.executable, str(ROOT / "ppdsl"), "lint", str(ROOT / "schedules" / "1f1b.pps")],
                          env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "ImportError" not in done.stderr, done.stderr


@pytest.mark.slow
def test_the_documented_single_node_form(tmp_path: Path) -> None:
    f = tmp_path / "zbv.pps"
    f.write_text("pipeline ranks=2 microbatches=4\nuse zbv()\n")
    # The GPT example named as a whole module: each rank resolves and checks it itself.
    done = subprocess.run(_launcher(tmp_path / "logs", "--nproc_per_node", "2", PPDSL, "run", str(f), "--steps", "2",
                                    "--verify", "--timeout", "30", "--model", str(ROOT / "examples" / "gpt" / "model.py")),
                          env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_SECONDS)
    logs = _logs(tmp_path / "logs")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs[-3000:]
    assert "verify: ok" in logs
    # zbv puts the last stage on rank 0: it prints its own losses, on the launcher's console.
    assert [x.split("  ")[0] for x in progress_lines(done.stdout)] == ["step 1/2", "step 2/2"], done.stdout[-3000:]


@pytest.mark.slow
def test_two_nodes_on_loopback_four_ranks_verify(tmp_path: Path) -> None:
    f = tmp_path / "1f1b.pps"
    f.write_text("pipeline ranks=4 microbatches=4\nuse 1f1b()\n")
    (port,) = free_ports(1)
    codes, outputs = run_together([_launcher(tmp_path / f"node{node}", "--nnodes", "2", "--master",
                                             f"127.0.0.1:{port}", "--rank", str(node), "--nproc_per_node", "2",
                                             PPDSL, "run", str(f), "--steps", "2", "--verify", "--timeout", "30")
                                   for node in (0, 1)], tmp_path, LAUNCH_SECONDS)
    logs = [_logs(tmp_path / f"node{node}") for node in (0, 1)]
    assert codes == [0, 0], "\n".join(o[-1500:] for o in outputs) + logs[0][-2000:]
    assert "verify: ok" in logs[0]  # rank 0 compares all 4 ranks' gradients
    # Rank 0 prints what rank 3 (the last stage, on the second node) sent it, on the first
    # launcher's console: the lines a local run of the same file prints.
    assert progress_lines(outputs[0]) == local_progress(PPDSL, [str(f), "--steps", "2"], tmp_path, LAUNCH_SECONDS)
    assert not progress_lines(outputs[1]) and not progress_lines(logs[1])


@pytest.mark.slow
def test_a_rank_that_dies_ends_every_rank_within_the_timeout(tmp_path: Path) -> None:
    f = ROOT / "tests" / "runtime" / "schedules" / "2r_1f1b_batched.pps"
    env = _env()
    env["PPDSL_FAULT"] = "kill:1:2"
    t0 = time.monotonic()
    done = subprocess.run(_launcher(tmp_path / "logs", "--nproc_per_node", "2", PPDSL, "run", str(f), "--steps", "3",
                                    "--timeout", "5", "--model", f"{HERE / 'helpers' / 'faulty_model.py'}:build_stage"),
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_SECONDS)
    seconds = time.monotonic() - t0
    logs = _logs(tmp_path / "logs")
    assert done.returncode != 0
    # Rank 0 was talking to the dead rank: it names it, by a lost connection or its own timeout.
    # Paddle's launcher ends the pod once it sees rank 1 gone; on a loaded machine it may stop
    # rank 0 before rank 0 has noticed, and then the launcher's report names the dead rank.
    named_by_rank_0 = re.search(r"rank 0[:,] .*(lost rank 1 while (sending to|receiving from|exchanging with) it|"
                                r"timed out after 5 s at step 0, action 0\S+ \(.*rank 1\))", logs)
    named_by_launcher = re.search(r"Container rank 1 status failed .* code -9", done.stdout + done.stderr)
    assert named_by_rank_0 or named_by_launcher, logs[-3000:] + done.stdout[-2000:] + done.stderr[-2000:]
    assert seconds < 60  # start-up (paddle imports) plus at most one --timeout
