"""Notes in the job's key-value store: what a send tells its receive before the data moves.

The store is the one the default process group was made with (`Framework.job_store`: the
group's own connection on torch, a connection of ppdsl's own on Paddle). A note is posted in two calls (its bytes, then a
count), so that a reader asks for the bytes only once they are there: Paddle's `get` waits
for a missing key without end, and a receive must be able to look without waiting (a batch
posts what it can while a note is on its way).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import PeerError
from ..jobs.watchdog import Watchdog

POLL_FIRST = 0.0002  # seconds between two looks at a missing note, doubling up to POLL_MOST
POLL_MOST = 0.002  # a first step's receive waits its peer's compute: a few ms apart costs little
WAIT_SECONDS = 300.0  # without a watchdog, how long a receive waits for its note


class StoreNotes:
    """Post and read notes under string keys; the store is opened at the first use."""

    def __init__(self, opener: Callable[[], Any], watchdog: Callable[[], Watchdog | None]):
        self._opener = opener
        self._watchdog = watchdog
        self._store: Any = None

    def _connect(self) -> Any:
        if self._store is None:
            store = self._opener()
            if store is None:
                raise PeerError("this rank has no key-value store to agree shapes through: start the ranks with "
                                "a process group (init_from_env, torch.distributed.init_process_group or "
                                "paddle.distributed.init_parallel_env)")
            self._store = store
        return self._store

    def post(self, key: str, data: bytes) -> None:
        store = self._connect()
        store.set(key, data)
        store.add(f"{key}/posted", 1)

    def read(self, key: str, doing: str, label: str, wait: bool) -> bytes | None:
        """The note under `key`; None when it is not there and not `wait`. A wait is the
        watchdog's (it ends the process after its timeout, naming `label`)."""
        store = self._connect()
        if not int(store.add(f"{key}/posted", 0)):
            if not wait:
                return None
            wd = self._watchdog()
            if wd is not None:
                wd.arm(label, doing)
            # The watchdog tells a timeout as it tells a stuck receive's; this deadline only
            # backs it up (a watchdog that does not end the process, or none).
            limit = 2 * wd.timeout + 5 if wd is not None else WAIT_SECONDS
            deadline = time.monotonic() + limit
            pause = POLL_FIRST
            while not int(store.add(f"{key}/posted", 0)):
                if time.monotonic() > deadline:
                    raise PeerError(f"timed out after {limit:g} s {doing}")
                time.sleep(pause)
                pause = min(POLL_MOST, 2 * pause)
            if wd is not None:
                wd.since = 0.0
        return bytes(store.get(key))
