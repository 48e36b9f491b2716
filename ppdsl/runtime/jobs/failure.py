"""One failure, told once, where it happened: what is told.

The rank that fails tells it in one block (`Failure.block`): rank, step, action, the exception
and the last frame of the user's code (the whole traceback with `--verbose`); every other rank
says in one line that it stopped because of that rank (`Failure.stopped_line`). How the block
reaches the others, and when a rank exits, is `notices.py`.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
import traceback
from collections.abc import Sequence
from typing import Any

import attrs
from attrs import frozen

from ..transport.background import JobFailed
from ..errors import StepError
from .watchdog import TIMEOUT_EXIT

# What a failure is: the rank's own exception, its transport losing a peer (no notice says why),
# or one of its waits outliving --timeout.
RAISED, LOST, TIMEOUT = "raised", "lost", "timeout"
EXCEPTION_EXIT = 1  # the exit status of a rank that raised or lost a peer (TIMEOUT_EXIT: timed out)

MESSAGE_LINES = 12  # of a long exception message, the lines a block shows
LINE_CHARS = 300  # of a message, what a peer's one line repeats



def first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " ..."


@frozen
class Failure:
    """What one rank tells of its failure; the same fields go through the launcher's pipe and the store."""

    rank: int  # global
    step: int  # -1 before the first step
    action: str  # the action's label, or what the rank was waiting for; "" when unknown
    kind: str  # RAISED, LOST or TIMEOUT
    message: str  # "ValueError: boom", or the transport's or the watchdog's sentence
    code: int = EXCEPTION_EXIT  # the exit status of the rank, and of every rank it stops
    where: str = ""  # the last frame of the user's code: "model.py:12 in forward"
    source: str = ""  # that frame's line of source
    time: float = 0.0  # when it failed (seconds since the epoch)

    def _place(self, lead: str) -> str:
        if self.kind == TIMEOUT or self.step < 0:  # a timeout's message says where it waited
            return ""
        return f"{lead}step {self.step}" + (f", action {self.action}" if self.action else "")

    @property
    def headline(self) -> str:
        """`rank 1, step 2, action 1F3: ValueError: boom` (a timeout: `rank 0: timed out ...`)."""
        return f"rank {self.rank}{self._place(', ')}: {first_line(self.message)}"

    def block(self, trace: str = "", verbose: bool = False) -> str:
        """What the failed rank says: the headline, the rest of a long message, the user's frame
        and its source line; then the traceback (`verbose`) or where to find it."""
        lines = [f"ppdsl run: failed: {self.headline}"]
        rest = self.message.strip().splitlines()[1:]
        lines += [f"    {x}" for x in rest[:MESSAGE_LINES]]
        if len(rest) > MESSAGE_LINES:
            lines.append(f"    ... ({len(rest) - MESSAGE_LINES} more lines)")
        if self.where:
            lines.append(f"  at {self.where}")
            if self.source:
                lines.append(f"      {self.source}")
        if trace and verbose:
            lines.append(trace.rstrip("\n"))
        elif trace:
            lines.append("  (--verbose shows the whole traceback)")
        return "\n".join(lines)

    def stopped_line(self, ranks: Sequence[int]) -> str:
        """What each other rank says: `ppdsl run: rank 0: stopped because rank 1 raised at
        step 2, action 1F3: ValueError: boom`."""
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        verb = "raised" if self.kind == RAISED else "failed"
        return (f"ppdsl run: {who}: stopped because rank {self.rank} {verb}{self._place(' at ')}: "
                f"{first_line(self.message)}")

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Failure | None:
        """The failure another process sent, or None when it is not one."""
        try:
            return cls(int(data["rank"]), int(data["step"]), str(data["action"]), str(data["kind"]),
                       str(data["message"]), int(data["code"]), str(data.get("where", "")),
                       str(data.get("source", "")), float(data.get("time", 0.0)))
        except (KeyError, TypeError, ValueError):
            return None


# --- the exception and the user's frame ------------------------------------------------------

def origin(exc: BaseException) -> BaseException:
    """What a located failure stands for: the exception the user's code (or the framework)
    raised, behind the StepError and a background job's JobFailed."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = exc.cause if isinstance(exc, JobFailed) else None
        if inner is None and isinstance(exc, StepError):
            inner = exc.__cause__ or exc.__context__
        if inner is None:
            break
        exc = inner
    return exc


def _library_folders() -> tuple[str, ...]:
    """Where frames are not the user's: ppdsl, the frameworks (when loaded), the standard library."""
    folders = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    for name in ("torch", "paddle"):
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            folders.append(os.path.dirname(os.path.abspath(file)))
    paths = sysconfig.get_paths()
    folders += [paths["stdlib"], paths["platstdlib"]]
    return tuple(os.path.join(f, "") for f in folders)


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of `exc`'s traceback in the user's own code, or None."""
    folders = _library_folders()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith("<") and not os.path.abspath(frame.filename).startswith(folders):
            return frame
    return None


def _shown(path: str) -> str:
    """A path as the user would type it: relative below the working folder."""
    full = os.path.abspath(path)
    here = os.path.join(os.getcwd(), "")
    return full[len(here):] if full.startswith(here) else full


def failure_of(exc: BaseException, rank: int, step: int, action: str) -> tuple[Failure, str]:
    """The failure `exc` is, and its whole traceback ("" for a lost peer). A StepError names
    its own rank, step and action; any other exception takes the ones given."""
    if isinstance(exc, StepError):
        rank, step, action, message = exc.rank, exc.step, exc.action, exc.detail
        kind = LOST if exc.peer else RAISED
    else:
        message, kind = f"{type(exc).__name__}: {exc}", RAISED
    if kind == LOST:
        return Failure(rank, step, action, kind, message, time=time.time()), ""
    cause = origin(exc)
    frame = user_frame(cause)
    where = f"{_shown(frame.filename)}:{frame.lineno} in {frame.name}" if frame is not None else ""
    source = (frame.line or "").strip() if frame is not None else ""
    trace = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    return Failure(rank, step, action, kind, message, where=where, source=source, time=time.time()), trace
