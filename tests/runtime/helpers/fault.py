"""PPDSL_FAULT=MODE:STAGE:CALL makes stage STAGE misbehave on its CALL-th forward (0-based):
`raise` raises, `kill` SIGKILLs its own process, `hang` sleeps (a compute that never ends,
so the peers' waits must time out). A fourth field, MODE:STAGE:CALL:RANK, limits it to one
global rank (with data parallelism every replica holds the stage). The fault models of both
frameworks call `Trigger`."""

from __future__ import annotations

import os
import signal
import time


class Trigger:
    def __init__(self, stage: int):
        self.stage = stage
        self.calls = 0
        mode, at_stage, at_call, at_rank = (os.environ.get("PPDSL_FAULT", "none:-1:-1").split(":") + ["-1"] * 3)[:4]
        self.mode, self.at_stage, self.at_call = mode, int(at_stage), int(at_call)
        rank = os.environ.get("PADDLE_TRAINER_ID", os.environ.get("RANK", "-1"))
        if int(at_rank) >= 0 and int(at_rank) != int(rank):
            self.mode = "none"

    def __call__(self) -> None:
        """Before each forward of the stage."""
        if self.stage == self.at_stage and self.calls == self.at_call:
            if self.mode == "raise":
                raise ValueError("boom in the model")
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "hang":
                time.sleep(3600)
        self.calls += 1
