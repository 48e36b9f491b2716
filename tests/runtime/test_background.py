"""The background job thread: order, failures handed back, and the watchdog's lanes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ppdsl.runtime.transport.background import Background, JobFailed
from ppdsl.runtime.jobs.watchdog import Lane


def test_jobs_run_in_posted_order_beside_the_caller() -> None:
    bg = Background("test")
    gate = threading.Event()
    seen: list[int] = []
    bg.post(lambda lane: gate.wait(5), "first")
    for i in range(5):
        bg.post(lambda lane, i=i: seen.append(i), f"job {i}")
    assert not bg.idle and seen == []  # the caller went on while the first job waits
    gate.set()
    bg.wait()
    assert seen == [0, 1, 2, 3, 4] and bg.idle
    bg.close()


def test_a_failure_stops_later_jobs_and_comes_back_with_its_label() -> None:
    bg = Background("test")
    seen: list[str] = []

    def boom(lane: Lane | None) -> None:
        raise RuntimeError("peer gone")

    bg.post(lambda lane: seen.append("a"), "a")
    bg.post(boom, "0SEND_F1")
    bg.post(lambda lane: seen.append("c"), "c")
    with pytest.raises(JobFailed) as info:
        bg.wait()
    assert info.value.label == "0SEND_F1" and isinstance(info.value.cause, RuntimeError)
    assert seen == ["a"]
    with pytest.raises(JobFailed):  # and at the next post too
        bg.post(lambda lane: None, "d")


def test_the_thread_disarms_its_lane_after_each_job() -> None:
    lane = Lane()
    bg = Background("test", lane)
    bg.post(lambda ln: ln.arm("0SEND_F0", "sending to rank 1") if ln else None, "0SEND_F0")
    bg.wait()
    assert lane.since == 0.0


@pytest.mark.slow
def test_a_stuck_lane_ends_the_process_with_the_jobs_label() -> None:
    code = """
import time
from ppdsl.runtime.jobs.watchdog import Reporter, Watchdog
from ppdsl.runtime.transport.background import Background
wd = Watchdog(0.5, Reporter(0))
wd.step = 2
bg = Background("sender", wd.lane())
bg.post(lambda lane: (lane.arm("1SEND_B0", "sending to rank 0"), time.sleep(30)), "1SEND_B0")
bg.wait()
"""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PPDSL_REPORT_FD"})
    assert proc.returncode == 3
    assert time.monotonic() - t0 < 20
    assert "timed out after 0.5 s at step 2, action 1SEND_B0 (sending to rank 0)" in proc.stderr


def test_a_thread_left_open_finishes_its_jobs_at_exit_and_ends(tmp_path: Path) -> None:
    # A script that forgets `close` exits with its jobs done and no thread left running: a
    # daemon thread would otherwise be cut off mid-job (here: before it writes the file).
    code = """
import sys, threading, time
from ppdsl.runtime.transport.background import Background
bg = Background("sender")
bg.post(lambda lane: (time.sleep(0.3), open(sys.argv[1], "w").write("sent")), "0SEND_F0")
print(threading.active_count())
"""
    out = tmp_path / "sent.txt"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"  # the thread was live when the script's last line ran
    assert out.read_text() == "sent"


def test_a_job_stuck_at_exit_holds_the_exit_up_for_a_bounded_time() -> None:
    # A job still pending at exit belongs to a failed step (its peer may never take it): the
    # process waits for it only EXIT_SECONDS, not for the 30 s the job would take.
    code = """
import time
from ppdsl.runtime.transport.background import Background
bg = Background("sender")
bg.post(lambda lane: time.sleep(30), "0SEND_F0")
"""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 10
