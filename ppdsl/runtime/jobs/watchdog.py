"""Timeouts for every wait, and the channel a rank reports through.

Paddle's gloo calls block in C++ with the GIL released, so a Python thread can watch them:
the interpreter arms the watchdog before each send/receive/collective and disarms it after.
When a wait outlives its timeout the watchdog reports the rank, step and action and ends the
process, so a dead peer never leaves a rank hanging (gloo itself would give up only after a
fixed 30 s, and NCCL not at all).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# Exit status of a rank whose wait timed out (1 is an exception, 2 a usage error).
TIMEOUT_EXIT = 3


class Reporter:
    """JSON lines to the launching `ppdsl run` (fd in PPDSL_REPORT_FD), or text on stderr."""

    def __init__(self, rank: int):
        self.rank = rank
        fd = os.environ.get("PPDSL_REPORT_FD")
        self.fd = int(fd) if fd and fd.isdigit() else None
        self._lock = threading.Lock()

    @property
    def attached(self) -> bool:
        return self.fd is not None

    def send(self, event: str, **fields: Any) -> None:
        record = {"event": event, "rank": self.rank, **fields}
        if self.fd is None:  # a failure is printed where it is told (`failure.Teller`)
            if event == "info":
                print(f"ppdsl run: rank {self.rank}: {fields.get('message', '')}", file=sys.stderr, flush=True)
            return
        data = (json.dumps(record) + "\n").encode()
        with self._lock:
            try:
                os.write(self.fd, data)
            except OSError:  # the launcher is gone; nobody left to tell
                pass


class Lane:
    """One thread's armed wait: what it waits for, and since when (0 when disarmed)."""

    def __init__(self) -> None:
        self.label = ""
        self.what = ""
        self.since = 0.0  # monotonic start of the armed wait; 0 when disarmed

    def arm(self, label: str, what: str = "") -> None:
        self.label = label
        self.what = what
        self.since = time.monotonic()

    def disarm(self) -> None:
        self.since = 0.0


class Watchdog(Lane):
    """Ends the process when an armed wait lasts longer than `timeout` seconds.

    The watchdog itself is the main thread's lane; a thread that communicates beside compute
    (a sender, a gradient reduction) arms a lane of its own (`lane()`), watched the same way."""

    def __init__(self, timeout: float, reporter: Reporter):
        super().__init__()
        self.timeout = timeout
        self.reporter = reporter
        self.step = -1
        # Tells a timeout (step, action, message) and ends the process (`failure.Teller.timed_out`).
        self.on_timeout: Callable[[int, str, str], None] | None = None
        self._lanes: list[Lane] = [self]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ppdsl-watchdog", daemon=True)
        self._thread.start()

    def lane(self) -> Lane:
        lane = Lane()
        self._lanes = [*self._lanes, lane]  # replaced, not mutated: the watching thread iterates it
        return lane

    def _watch(self) -> None:
        tick = min(0.25, max(0.02, self.timeout / 20))
        parent = os.getppid()
        launched = "PPDSL_REPORT_FD" in os.environ
        while not self._stopped.wait(tick):
            if launched and os.getppid() != parent:  # the launching `ppdsl run` died
                os._exit(TIMEOUT_EXIT)
            now = time.monotonic()
            for lane in self._lanes:
                since = lane.since
                if since and now - since > self.timeout:
                    self._expire(lane)

    def stop(self) -> None:
        """End the watching thread (the schedule that made it is closed)."""
        self._stopped.set()

    def _expire(self, lane: Lane) -> None:
        label, what = lane.label, lane.what
        where = f"step {self.step}, action {label}" if self.step >= 0 else label
        message = f"timed out after {self.timeout:g} s at {where}" + (f" ({what})" if what else "")
        if self.on_timeout is not None:
            self.on_timeout(self.step, label, message)
        self.reporter.send("timeout", step=self.step, action=label, message=message)
        print(f"ppdsl run: rank {self.reporter.rank}: {message}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(TIMEOUT_EXIT)
