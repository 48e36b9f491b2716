"""How a failure reaches every rank: notices in the job's key-value store.

The rank that fails tells its block on its stderr, through the launching `ppdsl run`'s pipe, in
torchrun's error file, and as a notice in the key-value store the job's process group was made
with. Every rank watches that store on a thread of its own (every `POLL_SECONDS`): seeing
another rank's notice, it says in one line that it stopped because of that rank, and exits with
that rank's exit status. A rank whose transport fails looks there first too, so a peer that
raised is named with its message; only a peer that left no notice (killed, crashed, its machine
gone) "died or was stopped" (`comm.peer_error`).

No call to the store may hold up a rank: each runs on a thread of its own and counts as
unanswered after `STORE_SECONDS` (a store whose process is gone answers with an error; one
that is stopped would not answer at all).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from ..errors import StepError
from .failure import LOST, RAISED, TIMEOUT, Failure, failure_of
from .watchdog import TIMEOUT_EXIT, Reporter

POLL_SECONDS = 0.5  # how often a rank reads the store for another rank's notice
TELL_SECONDS = 5.0  # how long a failed rank waits for the others to read its notice (it may serve the store)
STORE_SECONDS = 5.0  # the longest one call to the store may take before it counts as unanswered
# Paddle's launcher shows the log of the lowest rank that has failed when it looks (once a
# second), and then stops the others: a rank stopped by another's failure waits that long, so
# that the log shown is the failed rank's.
PADDLE_LAUNCHER_WAIT_SECONDS = 3.0

T = TypeVar("T")


def bounded(call: Callable[[], T], default: T, seconds: float = STORE_SECONDS) -> T:
    """`call()` on a thread of its own: its value, or `default` when it raised or took longer than `seconds`."""
    box: list[T] = []

    def run() -> None:
        try:
            box.append(call())
        except Exception:  # noqa: BLE001 - a store that is gone: no answer
            pass

    thread = threading.Thread(target=run, name="ppdsl-store", daemon=True)
    thread.start()
    thread.join(seconds)
    return box[0] if box else default


class Board:
    """Failure notices in the job's store, numbered as they are posted.

    A notice is posted in three calls (number, text, written mark), so a reader never asks for
    a key that is not there yet (Paddle's `get` waits for it without end). Each rank that has
    told (its own failure, or that it stopped) adds one to `told`."""

    def __init__(self, opener: Callable[[], Any], prefix: str):
        self._opener = opener
        self.prefix = prefix
        self._store: Any = None
        self._lock = threading.Lock()
        self._read = 0
        self._notices: list[Failure] = []

    @property
    def open(self) -> bool:
        return self._store is not None

    def connect(self) -> bool:
        """Open the connection (it may wait for the store; call it on a thread that may wait)."""
        try:
            store = self._opener()
        except Exception:  # noqa: BLE001 - no store: no notices, the transport's messages stand
            return False
        self._store = store
        return store is not None

    def _call(self, call: Callable[[Any], T], default: T) -> T:
        store = self._store
        if store is None:
            return default

        def locked() -> T:
            with self._lock:
                return call(store)
        return bounded(locked, default)

    def post(self, failure: Failure) -> None:
        data = json.dumps(failure.to_dict()).encode()
        p = self.prefix

        def post(store: Any) -> None:
            n = int(store.add(f"{p}posted", 1))
            store.set(f"{p}notice/{n}", data)
            store.add(f"{p}written/{n}", 1)
        self._call(post, None)

    def notices(self) -> list[Failure]:
        """Every notice posted so far, in the order they were posted."""
        p = self.prefix

        def read(store: Any) -> list[Failure]:
            posted = int(store.add(f"{p}posted", 0))
            while self._read < posted and int(store.add(f"{p}written/{self._read + 1}", 0)):
                self._read += 1
                notice = Failure.from_dict(json.loads(bytes(store.get(f"{p}notice/{self._read}"))))
                if notice is not None:
                    self._notices.append(notice)
            return list(self._notices)
        return self._call(read, list(self._notices))

    def told(self) -> None:
        self._call(lambda store: store.add(f"{self.prefix}told", 1), None)

    def all_told(self, world: int) -> bool:
        """Whether every rank has told (True when the store does not answer: nobody is left to wait for)."""
        return int(self._call(lambda store: store.add(f"{self.prefix}told", 0), world)) >= world


def cause_of(notices: Sequence[Failure], rank: int) -> Failure | None:
    """The failure that stops `rank`: the first rank that raised, else the first that failed."""
    others = [n for n in notices if n.rank != rank]
    raised = [n for n in others if n.kind == RAISED]
    first = raised or others
    return first[0] if first else None


def write_error_file(text: str, timestamp: int) -> None:
    """torchrun's error file (TORCHELASTIC_ERROR_FILE), whose text its summary of the failed
    processes shows; it names as root cause the one with the earliest timestamp."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": text, "extraInfo": {"py_callstack": text, "timestamp": str(timestamp)}}}
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass


# --- one rank's telling -----------------------------------------------------------------------

class Teller:
    """Tells this rank's failure, or that it stopped for another's, once, and ends the process."""

    def __init__(self, rank: int, world: int, reporter: Reporter, verbose: bool = False):
        self.rank, self.world = rank, world
        self.reporter = reporter
        self.verbose = verbose
        self.board: Board | None = None
        self._lock = threading.RLock()  # re-entered by SIGTERM's handler on the main thread
        self._code: int | None = None  # set by the first to tell
        self._stopped = False  # this rank stopped for another's failure
        self._told = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._wakeup: int | None = None  # read end of the pipe SIGTERM is written to

    def watch(self, open_store: Callable[[], Any]) -> None:
        """Watch the store for other ranks' notices, and SIGTERM, on a thread (call it on the
        main thread, once the group is made)."""
        if self.world < 2:
            return
        prefix = f"ppdsl/failures/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self.board = Board(open_store, prefix)
        self._wakeup = self._catch_sigterm()
        self._thread = threading.Thread(target=self._watch, name="ppdsl-failures", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching (a run that ended well), on the main thread."""
        self._closing.set()
        if self._wakeup is not None:
            write = signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                os.write(write, b"\0")  # wakes the watching thread now, not at its next poll
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(1.0)

    def _catch_sigterm(self) -> int | None:
        """A launcher stops a job with SIGTERM once one rank has failed: a rank that has told
        then exits with the failure's status (Paddle's launcher exits with that of its lowest
        rank that failed, torchrun lists each). Python runs its handler on the main thread,
        which may be blocked in the framework: the signal also wakes the watching thread
        (`signal.set_wakeup_fd`). The read end of that pipe, or None."""
        try:
            read, write = os.pipe()
            os.set_blocking(write, False)
            signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            signal.signal(signal.SIGTERM, lambda *_: self._sigterm())
        except (OSError, ValueError):  # not the main thread
            return None
        return read

    def _sigterm(self) -> None:
        """SIGTERM, on either thread: exit with the failure told, or with that of another rank's
        notice (the launcher stops this rank for it); else as the signal would have ended it."""
        code = self._code
        if code is None:
            cause = self.cause()
            if cause is not None:
                code = self.stop_for(cause)
        if code is not None:
            # Let the telling (on the other thread, or interrupted on this one) finish.
            self._told.wait(1.0 if threading.current_thread() is threading.main_thread() else TELL_SECONDS)
            self._end(code)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # the main thread, once its call into the framework returns, does just that
        os._exit(128 + signal.SIGTERM)

    def _wait(self, seconds: float) -> None:
        """Sleep `seconds` on the watching thread, handling SIGTERM meanwhile."""
        if self._wakeup is None:
            self._closing.wait(seconds)
            return
        ready, _, _ = select.select([self._wakeup], [], [], seconds)
        if ready and signal.SIGTERM in os.read(self._wakeup, 64):
            self._sigterm()

    def _watch(self) -> None:
        board = self.board
        if board is None or not board.connect():
            return
        while not self._closing.is_set():
            self._wait(POLL_SECONDS)
            cause = cause_of(board.notices(), self.rank)
            if cause is not None and not self._closing.is_set():
                self.exit(self.stop_for(cause))

    def cause(self) -> Failure | None:
        """Another rank's failure, if one has been posted."""
        board = self.board
        return cause_of(board.notices(), self.rank) if board is not None and board.open else None

    def _first(self, code: int) -> bool:
        """Whether this call is the first to tell (it then tells); a later one waits for it."""
        with self._lock:
            if self._code is None:
                self._code = code
                return True
        self._told.wait(TELL_SECONDS + STORE_SECONDS)
        return False

    def fail(self, exc: BaseException, step: int, action: str) -> int:
        """This rank raised `exc` (step and action: where it was, for an exception that is not
        a StepError): tell it, or that it stopped for another rank when `exc` is only its
        transport losing a peer that left a notice. The exit status."""
        failure, trace = failure_of(exc, self.rank, step, action)
        if failure.kind == LOST:
            cause = self.cause()
            if cause is not None:
                return self.stop_for(cause)
        return self.tell(failure, trace)

    def timed_out(self, step: int, action: str, message: str) -> NoReturn:
        """A wait outlived --timeout (on the watchdog's thread): tell it, or that this rank
        stopped for another's failure, and end the process."""
        cause = self.cause()
        if cause is not None:
            self.exit(self.stop_for(cause))
        self.exit(self.tell(Failure(self.rank, step, action, TIMEOUT, message, TIMEOUT_EXIT, time=time.time())))

    def tell(self, failure: Failure, trace: str = "") -> int:
        """Tell this rank's own failure, and wait (at most TELL_SECONDS) until every other rank
        has read it: this rank may serve the store they read. The exit status."""
        if not self._first(failure.code):
            return self._code or failure.code
        # What the user reads first: a launcher stops the job once it knows (told next, or the
        # other ranks, once they read the store). Under ppdsl's launcher stderr is the rank's
        # log: the whole traceback goes there.
        print(failure.block(trace, self.verbose or self.reporter.attached), file=sys.stderr, flush=True)
        # torchrun's summary repeats it in one line: the block is said once, here.
        write_error_file(failure.headline + (f" (at {failure.where})" if failure.where else ""), int(failure.time))
        board = self.board
        if board is not None and board.open:
            board.post(failure)
            board.told()
        self.reporter.send("error", step=failure.step, action=failure.action, message=failure.headline,
                           peer=failure.kind != RAISED, failure=failure.to_dict(), traceback=trace)
        self._told.set()
        deadline = time.monotonic() + TELL_SECONDS
        while board is not None and board.open and time.monotonic() < deadline and not board.all_told(self.world):
            time.sleep(0.05)
        return failure.code

    def stop_for(self, cause: Failure) -> int:
        """Say in one line that this rank stopped because of `cause`. The exit status: `cause`'s."""
        if not self._first(cause.code):
            return self._code or cause.code
        self._stopped = True
        line = cause.stopped_line([self.rank])
        print(line, file=sys.stderr, flush=True)
        self.reporter.send("stopped", message=line, cause=cause.to_dict())
        # Dated after the cause: torchrun names the earliest failure its root cause.
        write_error_file(line.removeprefix("ppdsl run: "), max(int(time.time()), int(cause.time) + 1))
        if self.board is not None:
            self.board.told()
        self._told.set()
        return cause.code

    def exit(self, code: int) -> NoReturn:
        """End the process now, with `code`: its threads may be blocked in the framework."""
        if self._stopped and "PADDLE_LOG_DIR" in os.environ and not self.reporter.attached:
            if threading.current_thread() is threading.main_thread():
                time.sleep(PADDLE_LAUNCHER_WAIT_SECONDS)  # SIGTERM's handler runs here
            else:
                self._wait(PADDLE_LAUNCHER_WAIT_SECONDS)
        self._end(code)

    @staticmethod
    def _end(code: int) -> NoReturn:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
