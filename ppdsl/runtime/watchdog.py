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
        if self.fd is None:
            if event in ("error", "timeout"):
                print(f"ppdsl run: rank {self.rank}: {fields.get('message', '')}", file=sys.stderr, flush=True)
            return
        data = (json.dumps(record) + "\n").encode()
        with self._lock:
            try:
                os.write(self.fd, data)
            except OSError:  # the launcher is gone; nobody left to tell
                pass


class Watchdog:
    """Ends the process when an armed wait lasts longer than `timeout` seconds."""

    def __init__(self, timeout: float, reporter: Reporter):
        self.timeout = timeout
        self.reporter = reporter
        self.step = -1
        self.label = ""
        self.what = ""
        self.since = 0.0  # monotonic start of the armed wait; 0 when disarmed
        self._thread = threading.Thread(target=self._watch, name="ppdsl-watchdog", daemon=True)
        self._thread.start()

    def arm(self, label: str, what: str = "") -> None:
        self.label = label
        self.what = what
        self.since = time.monotonic()

    def disarm(self) -> None:
        self.since = 0.0

    def _watch(self) -> None:
        tick = min(0.25, max(0.02, self.timeout / 20))
        parent = os.getppid()
        launched = "PPDSL_REPORT_FD" in os.environ
        while True:
            time.sleep(tick)
            if launched and os.getppid() != parent:  # the launching `ppdsl run` died
                os._exit(TIMEOUT_EXIT)
            since = self.since
            if since and time.monotonic() - since > self.timeout:
                where = f"step {self.step}, action {self.label}" if self.step >= 0 else self.label
                message = (f"timed out after {self.timeout:g} s at {where}"
                           + (f" ({self.what})" if self.what else ""))
                self.reporter.send("timeout", step=self.step, action=self.label, message=message)
                sys.stderr.flush()
                os._exit(TIMEOUT_EXIT)
