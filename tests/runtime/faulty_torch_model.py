"""The fault tests' model on torch: PPDSL_FAULT=MODE:STAGE:CALL as in faulty_model.py."""

from __future__ import annotations

import os
import signal
import time

import torch

from ppdsl.runtime import models


class Faulty(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, stage: int):
        super().__init__()
        self.inner = inner
        self.stage = stage
        self.calls = 0
        mode, at_stage, at_call = (os.environ.get("PPDSL_FAULT", "none:-1:-1").split(":") + ["-1", "-1"])[:3]
        self.mode, self.at_stage, self.at_call = mode, int(at_stage), int(at_call)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stage == self.at_stage and self.calls == self.at_call:
            if self.mode == "raise":
                raise ValueError("boom in the model")
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "hang":
                time.sleep(3600)
        self.calls += 1
        return self.inner(x)  # type: ignore[no-any-return]


def build_stage(stage: int, stages: int) -> torch.nn.Module:
    return Faulty(models.build_stage(stage, stages, framework="torch"), stage)
