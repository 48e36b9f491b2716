"""Rank 0's progress line under a cluster launcher: `step N/M  loss X`, as a local run prints it.

Paddle's launcher shows rank 0's log on its console (the others go to `log/workerlog.N`), and
torchrun shows every rank's output: so rank 0 prints, and only it. The loss is the last
stage's: when another rank holds that stage it sends rank 0 the step's mean loss, one float64,
on a 2-rank group of their own made once per schedule file (the pair may have no link in the
schedule). Under ppdsl's own launcher the ranks report to it instead and none of this runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..framework import Framework
    from .watchdog import Watchdog


SKIPPED = "  (optimizer step skipped: a non-finite loss or gradient)"


def progress_line(step: int, steps: int, loss: float, skipped: bool = False) -> str:
    """The line a local run prints for a step (0-based `step`): one format for both."""
    return f"step {step + 1}/{steps}  loss {loss:.6f}" + (SKIPPED if skipped else "")


class RankZeroProgress:
    """Made on every rank, in the same order (making a group is collective)."""

    def __init__(self, fw: Framework, rank: int, last_rank: int, steps: int, watchdog: Watchdog, gloo: bool):
        self.fw, self.rank, self.last_rank, self.steps, self.watchdog = fw, rank, last_rank, steps, watchdog
        self._send: Callable[[Any], None] | None = None
        self._recv: Callable[[Any], None] | None = None
        if last_rank == 0:
            return
        watchdog.arm("creating the group that carries the loss to rank 0", "all ranks")
        group = fw.new_group([0, last_rank])
        if gloo:  # as in `comm.Transport`: gloo groups are made one at a time
            fw.barrier()
        watchdog.disarm()
        if rank in (0, last_rank):
            self._send, self._recv = fw.link(group, rank, last_rank if rank == 0 else 0)

    def step(self, step: int, losses: list[float], skipped: bool = False) -> None:
        """After a step: the last stage's rank passes its mean loss on, rank 0 prints it."""
        import numpy as np

        if self.rank not in (0, self.last_rank):
            return
        mean = sum(losses) / len(losses) if losses else 0.0
        if self.rank == self.last_rank and self.rank != 0:
            assert self._send is not None
            self.watchdog.arm("sending the step's loss to rank 0", "sending to rank 0")
            self._send(self.fw.from_numpy(np.array([mean], dtype="float64")))
            self.watchdog.disarm()
            return
        if self.last_rank != 0:
            assert self._recv is not None
            buffer = self.fw.from_numpy(np.zeros(1, dtype="float64"))
            self.watchdog.arm("receiving the step's loss", f"waiting for rank {self.last_rank}")
            self._recv(buffer)
            self.watchdog.disarm()
            mean = float(self.fw.to_numpy(buffer)[0])
        print(progress_line(step, self.steps, mean, skipped), flush=True)
