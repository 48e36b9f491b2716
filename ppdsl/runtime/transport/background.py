"""A thread that runs communication jobs in the order they were posted, beside compute.

On gloo a send returns only once its receive has been posted, and a collective once every
member has joined: run on the compute thread, either leaves the rank idle while its peer is
busy. Posted here instead, a link's sends (or a stage's gradient reduction) go out in order
while the rank computes, and the rank waits only where it needs them finished (the end of a
step, before the optimizer). The framework's calls block in C++ with the GIL released, so the
thread costs the compute thread nothing while it waits.

A job that fails stops the jobs after it (they would go out of order); the failure comes back
to the compute thread, with the label of the job that failed, at its next `post` or `wait`.
Each thread arms its own watchdog lane, so a job stuck on a dead peer ends the process as a
stuck receive does. A thread its owner did not close is closed at interpreter exit, before the
framework's own teardown (Paddle's teardown of its process groups can crash beside a live one),
waiting at most `EXIT_SECONDS` for the jobs still posted.
"""

from __future__ import annotations

import atexit
import threading
from collections import deque
from collections.abc import Callable

from ..jobs.watchdog import Lane

Job = Callable[[Lane | None], None]
# How long an unclosed thread's jobs may hold up the exit. After a step the thread is idle and
# ends at once; a job still pending at exit belongs to a failed step, whose peer may never
# take it (a send blocked in gloo cannot be called off), so the process goes without it.
EXIT_SECONDS = 1.0


class JobFailed(Exception):
    """A background job raised: `label` names its action, `cause` is what it raised."""

    def __init__(self, label: str, cause: BaseException):
        super().__init__(str(cause))
        self.label = label
        self.cause = cause


class Background:
    """One daemon thread running posted jobs first in, first out."""

    def __init__(self, name: str, lane: Lane | None = None):
        self.name = name
        self.lane = lane
        self._jobs: deque[tuple[Job, str]] = deque()
        self._pending = 0
        self._failed: JobFailed | None = None
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"ppdsl-{name}", daemon=True)
        self._thread.start()
        # Registered after the framework was imported, so run before its exit handlers (LIFO).
        atexit.register(self.join, EXIT_SECONDS)

    def post(self, job: Job, label: str) -> None:
        """Run `job(lane)` after the jobs posted before it; raise an earlier job's failure."""
        with self._cond:
            self._raise_failure()
            self._jobs.append((job, label))
            self._pending += 1
            self._cond.notify_all()

    @property
    def idle(self) -> bool:
        return self._pending == 0

    def wait(self) -> None:
        """Until every posted job has run; raises the first failure. A job that never ends is
        the watchdog's (its lane is armed while it waits), so this wait needs no clock."""
        with self._cond:
            while self._pending and self._failed is None:
                self._cond.wait(0.5)
            self._raise_failure()

    def close(self) -> None:
        """Stop the thread once the jobs posted so far have run (it exits with the process anyway)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        """`close`, then wait up to `timeout` seconds for the thread to end: a process that
        exits normally should hold no thread blocked in the framework (Paddle's teardown of
        its process groups can crash under one)."""
        self.close()
        self._thread.join(timeout)
        atexit.unregister(self.join)

    def _raise_failure(self) -> None:
        if self._failed is not None:
            raise self._failed

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job, label = self._jobs[0]
            try:
                job(self.lane)
            except BaseException as exc:  # noqa: BLE001 - handed to the compute thread
                with self._cond:
                    self._failed = JobFailed(label, exc)
                    self._jobs.clear()
                    self._pending = 0
                    self._cond.notify_all()
                return
            finally:
                if self.lane is not None:
                    self.lane.disarm()
            with self._cond:
                self._jobs.popleft()
                self._pending -= 1
                self._cond.notify_all()
