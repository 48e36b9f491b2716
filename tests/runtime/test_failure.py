"""One failure, told once, where it happened (`ppdsl/runtime/jobs/failure.py`).

In one process: what the failed rank and the others say, the user's frame, the notices in a
store, torchrun's error file. Then the same run under each launcher (ppdsl's own, Paddle's,
torchrun), 2 ranks on gloo, a model that raises in the forward of stage 1 at step 2: the failed
rank's block once, the other rank's one line, the same exit status. Every launch runs under
`subprocess.run(timeout=...)` and `--timeout`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ppdsl.runtime.transport.background import JobFailed
from ppdsl.runtime.errors import StepError
from ppdsl.runtime.jobs.failure import LOST, RAISED, TIMEOUT, Failure, failure_of, user_frame
from ppdsl.runtime.jobs.notices import Board, bounded, cause_of, write_error_file
from ppdsl.runtime.jobs.launcher import Outcome, Progress, _event, free_ports

HERE = Path(__file__).parent
SCHEDULE = str(HERE / "schedules" / "2r_1f1b_batched.pps")  # 4 microbatches: stage 1's 12th forward is step 2, 1F3
PPDSL = str(Path(sys.executable).with_name("ppdsl"))
LAUNCH_SECONDS = 150

sys.path.insert(0, str(HERE))
from procs import launcher_env  # noqa: E402

BOOM = Failure(1, 2, "1F3", RAISED, "ValueError: boom", where="model.py:12 in forward", source="raise ValueError('boom')",
               time=100.0)


# --- what is said ----------------------------------------------------------------------------

def test_the_failed_rank_says_one_block_and_the_traceback_only_when_asked() -> None:
    assert BOOM.block("Traceback (most recent call last):\n  ...\nValueError: boom\n") == (
        "ppdsl run: failed: rank 1, step 2, action 1F3: ValueError: boom\n"
        "  at model.py:12 in forward\n"
        "      raise ValueError('boom')\n"
        "  (--verbose shows the whole traceback)")
    verbose = BOOM.block("Traceback (most recent call last):\n  ...\nValueError: boom\n", verbose=True)
    assert verbose.endswith("      raise ValueError('boom')\nTraceback (most recent call last):\n  ...\nValueError: boom")


def test_the_others_say_one_line_naming_the_failed_rank() -> None:
    assert BOOM.stopped_line([0]) == "ppdsl run: rank 0: stopped because rank 1 raised at step 2, action 1F3: ValueError: boom"
    assert BOOM.stopped_line([0, 2]).startswith("ppdsl run: ranks 0, 2: stopped because rank 1 raised")
    lost = Failure(0, 2, "0RECV_B3", LOST, "lost rank 1 while receiving from it (connection reset): rank 1 died or was stopped")
    assert lost.stopped_line([2]) == ("ppdsl run: rank 2: stopped because rank 0 failed at step 2, action 0RECV_B3: "
                                      "lost rank 1 while receiving from it (connection reset): rank 1 died or was stopped")
    timeout = Failure(0, 2, "0RECV_B3", TIMEOUT, "timed out after 3 s at step 2, action 0RECV_B3 (waiting for rank 1)", 3)
    assert timeout.headline == "rank 0: timed out after 3 s at step 2, action 0RECV_B3 (waiting for rank 1)"
    assert timeout.stopped_line([1]) == ("ppdsl run: rank 1: stopped because rank 0 failed: timed out after 3 s at "
                                         "step 2, action 0RECV_B3 (waiting for rank 1)")


def test_a_long_message_is_shown_in_the_block_and_cut_in_the_line() -> None:
    f = Failure(1, 0, "1F0", RAISED, "RuntimeError: shapes differ\n" + "\n".join(f"detail {i}" for i in range(20)))
    block = f.block()
    assert block.splitlines()[1:3] == ["    detail 0", "    detail 1"] and "(8 more lines)" in block
    assert f.stopped_line([0]).endswith("RuntimeError: shapes differ")


def test_a_failure_goes_through_a_pipe_or_a_store_as_it_is() -> None:
    assert Failure.from_dict(json.loads(json.dumps(BOOM.to_dict()))) == BOOM
    assert Failure.from_dict({"rank": "x"}) is None and Failure.from_dict(None) is None


# --- the exception and the user's frame ----------------------------------------------------

def _users_forward() -> None:
    raise ValueError("boom in the model")


def _located(exc: BaseException) -> StepError:
    try:
        raise StepError(1, 2, "1F3", f"{type(exc).__name__}: {exc}") from exc
    except StepError as located:
        return located


def test_the_block_points_at_the_users_frame_not_ppdsl_or_the_standard_library() -> None:
    try:
        json.loads("{", object_hook=lambda d: d)  # raises inside the standard library
    except ValueError as exc:
        frame = user_frame(exc)
        assert frame is not None and frame.name == "test_the_block_points_at_the_users_frame_not_ppdsl_or_the_standard_library"
    try:
        _users_forward()
    except ValueError as exc:
        failure, trace = failure_of(_located(exc), 0, -1, "")
    assert (failure.rank, failure.step, failure.action, failure.kind) == (1, 2, "1F3", RAISED)
    assert failure.message == "ValueError: boom in the model"
    assert re.fullmatch(r".*test_failure\.py:\d+ in _users_forward", failure.where), failure.where
    assert failure.source == 'raise ValueError("boom in the model")'
    assert trace.startswith("Traceback (most recent call last):") and trace.rstrip().endswith("ValueError: boom in the model")
    assert "StepError" not in trace


def test_a_background_jobs_failure_is_traced_to_what_it_raised() -> None:
    try:
        _users_forward()
    except ValueError as exc:
        job = JobFailed("1SEND_F0", exc)
    try:
        raise StepError(1, 0, "1SEND_F0", "ValueError: boom in the model") from job
    except StepError as located:
        failure, _ = failure_of(located, 1, 0, "")
    assert failure.where.endswith("in _users_forward")


def test_a_lost_peer_has_no_frame_and_no_traceback() -> None:
    failure, trace = failure_of(StepError(0, 2, "0RECV_B3", "lost rank 1 ...", peer=True), 0, 2, "")
    assert failure.kind == LOST and failure.where == "" and trace == ""


def test_an_exception_outside_a_step_takes_the_step_it_came_in() -> None:
    try:
        _users_forward()
    except ValueError as exc:
        failure, _ = failure_of(exc, 3, 4, "")
    assert failure.headline == "rank 3, step 4: ValueError: boom in the model"


# --- the notices ------------------------------------------------------------------------------

class DictStore:
    """The calls a framework's store answers, in a dict."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def add(self, key: str, n: int) -> int:
        self.data[key] = int(self.data.get(key, 0)) + n
        return int(self.data[key])

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def get(self, key: str) -> bytes:
        return bytes(self.data[key])


def _board(store: Any, prefix: str = "p/") -> Board:
    board = Board(lambda: store, prefix)
    assert board.connect()
    return board


def test_notices_are_read_in_the_order_posted_and_the_first_that_raised_is_the_cause() -> None:
    store = DictStore()
    mine, theirs = _board(store), _board(store)
    assert theirs.notices() == [] and cause_of(theirs.notices(), 0) is None
    lost = Failure(2, 2, "2RECV_F3", LOST, "lost rank 1")
    mine.post(lost)
    mine.post(BOOM)
    assert theirs.notices() == [lost, BOOM]
    assert cause_of(theirs.notices(), 0) == BOOM  # the rank that raised, not the one that lost it
    assert cause_of(theirs.notices(), 1) == lost  # never its own
    assert not theirs.all_told(2)
    mine.told()
    theirs.told()
    assert theirs.all_told(2)


def test_a_notice_half_written_is_read_later() -> None:
    store = DictStore()
    store.add("p/posted", 1)  # numbered, its text not there yet
    board = _board(store)
    assert board.notices() == []
    store.set("p/notice/1", json.dumps(BOOM.to_dict()).encode())
    store.add("p/written/1", 1)
    assert board.notices() == [BOOM]


def test_a_store_that_fails_or_does_not_answer_holds_nobody_up() -> None:
    class Gone(DictStore):
        def add(self, key: str, n: int) -> int:
            raise ValueError("TCP send error. Details: Broken pipe.")

    assert _board(Gone()).notices() == [] and _board(Gone()).all_told(2)
    release = threading.Event()
    t0 = time.monotonic()
    assert bounded(lambda: release.wait(30), "no answer", seconds=0.2) == "no answer"
    assert time.monotonic() - t0 < 5
    release.set()
    assert not Board(lambda: None, "p/").connect() and not Board(lambda: 1 / 0, "p/").connect()


def test_torchrun_reads_the_error_file_and_names_the_earliest_as_root_cause(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    errors = pytest.importorskip("torch.distributed.elastic.multiprocessing.errors")
    failures = {}
    for rank, text, stamp in ((0, "rank 0: stopped because rank 1 raised ...", 101), (1, BOOM.headline, 100)):
        path = tmp_path / f"{rank}.json"
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
        write_error_file(text, stamp)
        failures[rank] = errors.ProcessFailure(local_rank=rank, pid=1, exitcode=1, error_file=str(path))
    rank, root = errors.ChildFailedError("ppdsl", failures).get_first_failure()
    assert rank == 1 and root.timestamp == 100
    assert BOOM.headline in errors.ChildFailedError("ppdsl", failures).format_msg()


def test_ppdsl_s_launcher_keeps_the_failure_as_its_rank_told_it() -> None:
    outcome = Outcome()
    progress = Progress(1, sys.stdout, True, [])
    _event({"event": "stopped", "rank": 0, "message": "..."}, outcome, progress, set())
    _event({"event": "error", "rank": 1, "message": BOOM.headline, "failure": BOOM.to_dict(), "traceback": "T"},
           outcome, progress, set())
    assert outcome.told == {0, 1}
    assert outcome.failures == [(0, BOOM.headline, BOOM, "T")]


# --- under each launcher ----------------------------------------------------------------------

def _launch(launcher: str, tmp_path: Path, fault: str, *extra: str) -> tuple[int, str, str]:
    """(exit status, console output, the ranks' logs) of a 2-rank run with PPDSL_FAULT=fault."""
    env = launcher_env()
    env["PPDSL_FAULT"] = fault
    run = [PPDSL, "run", SCHEDULE, "--steps", "3", "--timeout", "10", *extra]
    if launcher == "ppdsl":
        command = [*run, "--model", f"{HERE / 'helpers' / 'faulty_model.py'}:build_stage", "--logs", str(tmp_path / "logs")]
    elif launcher == "paddle":
        command = [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(tmp_path / "logs"),
                   "--nproc_per_node", "2", *run, "--model", f"{HERE / 'helpers' / 'faulty_model.py'}:build_stage"]
    else:
        (port,) = free_ports(1)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
                   *run, "--framework", "torch", "--model", f"{HERE / 'helpers' / 'faulty_torch_model.py'}:build_stage"]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_SECONDS)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((tmp_path / "logs").glob("*"))
                     if p.is_file()) if (tmp_path / "logs").is_dir() else ""
    return done.returncode, done.stdout + done.stderr, logs


LAUNCHERS = [pytest.param("ppdsl", id="ppdsl"), pytest.param("paddle", id="paddle-launch"),
             pytest.param("torchrun", id="torchrun")]


def _needs(launcher: str) -> None:
    pytest.importorskip("torch" if launcher == "torchrun" else "paddle")


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True], ids=["plain", "verbose"])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_rank_that_raises_is_told_once_and_the_other_names_it(launcher: str, verbose: bool, tmp_path: Path) -> None:
    _needs(launcher)
    code, out, logs = _launch(launcher, tmp_path, "raise:1:11", *(["--verbose"] if verbose else []))
    shown = f"{out}\n--- logs ---\n{logs}"[-6000:]
    block = "ppdsl run: failed: rank 1, step 2, action 1F3: ValueError: boom in the model\n" \
            f"  at {HERE / 'helpers' / 'fault.py'}:"
    assert out.count(block) == 1, shown
    assert out.count('      raise ValueError("boom in the model")') == 1, shown
    line = "ppdsl run: rank 0: stopped because rank 1 raised at step 2, action 1F3: ValueError: boom in the model"
    assert out.count(line) == 1, shown
    assert "died or was stopped" not in out + logs, shown
    frames = re.findall(r'File "[^"]*/(?:ppdsl/(?:[a-z_]+/)*[a-z_]+|tests/runtime/helpers/fault)\.py", line', out)
    if verbose:  # the failed rank's whole traceback, once, down to the user's line
        assert out.count("ValueError: boom in the model\n") >= 1 and 'fault.py", line' in out, shown
        assert out.count("Traceback (most recent call last):") == (2 if launcher == "torchrun" else 1), shown
    else:  # none but torchrun's own
        assert not frames and "(--verbose shows the whole traceback)" in out, shown
    # Every rank exits 1: the launcher's own status says so, and torchrun lists each.
    assert code == 1, shown
    if launcher == "torchrun":
        assert re.findall(r"exitcode  : (\S+)", out) == ["1", "1"], shown
        assert "Root Cause (first observed failure):\n[1]:" in out and "rank      : 1 (local_rank: 1)" in out, shown
    if launcher == "paddle":
        assert "Container rank 1 status failed" in out and "Exit code 1" in out, shown


@pytest.mark.slow
def test_a_killed_rank_is_the_one_said_to_have_died_or_been_stopped(tmp_path: Path) -> None:
    _needs("torchrun")
    code, out, _ = _launch("torchrun", tmp_path, "kill:1:11")
    assert code != 0
    assert "exitcode  : -9" in out, out[-4000:]  # torchrun's own summary: rank 1 was killed
    # Rank 0 says rank 1 was lost, never that it raised; or torchrun, which stops the other
    # ranks as soon as it sees one die, ends rank 0 (SIGTERM) before its transport has noticed.
    lost = re.search(r"ppdsl run: failed: rank 0, step 2, action .+?: lost rank 1 while .*"
                     r"rank 1 died or was stopped", out)
    assert lost or re.search(r"rank\s+: 0 \(local_rank: 0\)\n\s+exitcode\s+: -15", out), out[-4000:]
    assert "stopped because" not in out and "rank 1 raised" not in out, out[-4000:]
